"""``cfs-burst``: cfs-quota plus a burst (cgroup v2 ``cpu.max.burst``, v1 ``cpu.cfs_burst_us``) of ``burst_ms``
per vCPU thread: quota a period leaves unused is kept, up to the burst, for a later period (applied by
:mod:`bbrlab.contention.cfs`, as cfs-quota). The kernel allows at most the quota."""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core.errors import ValidationError

from ..contention_models import CFS_DEFAULT_PERIOD_MS
from .base import number
from .cfs_quota import check_period


@dataclass(frozen=True, kw_only=True)
class BurstParams:
    """cfs-burst's parameters: the CFS period [ms] and the burst per vCPU thread [ms]."""

    period_ms: float = CFS_DEFAULT_PERIOD_MS
    burst_ms: float


class CfsBurst:
    """CFS bandwidth control with a burst (see the module docstring)."""

    name = "cfs-burst"
    params_type = BurstParams
    uses_timeslice, uses_cgroup, local_only, adds_load = False, True, True, False
    fixed_share_pct = None
    spec_keys, own_shares_key = ("cfs_periods_ms", "cfs_bursts_ms"), None

    def validate(self, share_pct: float, timeslice_ms: float, params: BurstParams) -> None:
        """The period as cfs-quota's, then 0 < burst <= quota: the kernel refuses a burst above the quota
        (EINVAL from ``tg_set_cfs_bandwidth``)."""
        check_period(share_pct, params.period_ms)
        burst = number("contention.burst_ms", params.burst_ms)
        quota_ms = params.period_ms * share_pct / 100.0
        if not 0 < burst or (share_pct < 100 and burst > quota_ms):
            raise ValidationError("contention.burst_ms", params.burst_ms,
                                  f"0 < burst_ms <= the quota (share x period_ms = {quota_ms:g} ms; the kernel refuses "
                                  "a burst above the quota)")

    def id_head(self, timeslice_ms: float, params: BurstParams) -> str:
        """``cfs100ms-burst5ms``."""
        return f"cfs{params.period_ms:g}ms-burst{params.burst_ms:g}ms"

    def grid_point(self, share_pct: float, values: list) -> tuple[float, BurstParams]:
        """The spec's period and burst; the timeslice recorded is the quota (share x period)."""
        return values[0] * share_pct / 100, BurstParams(period_ms=values[0], burst_ms=values[1])


MODEL = CfsBurst()
