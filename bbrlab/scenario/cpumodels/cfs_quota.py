"""``cfs-quota``: the vCPU threads in a cgroup of their own under CFS bandwidth control, quota = share x
``period_ms`` (applied by :mod:`bbrlab.contention.cfs`). Its period check is shared by cfs-burst and credit,
which are cgroup models too (:func:`check_period`)."""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core.errors import ValidationError

from ..contention_models import CFS_DEFAULT_PERIOD_MS, CFS_PERIOD_MAX_MS, CFS_PERIOD_MIN_MS, CFS_QUOTA_MIN_MS


@dataclass(frozen=True)
class CfsParams:
    """cfs-quota's parameter: the CFS period [ms] (default the kernel's, 100 ms)."""

    period_ms: float = CFS_DEFAULT_PERIOD_MS


def check_period(share_pct: float, period_ms: object) -> None:
    """The kernel's CFS period range, and below 100 % a quota (share x period) of at least its minimum."""
    if isinstance(period_ms, bool) or not isinstance(period_ms, int | float) \
            or not CFS_PERIOD_MIN_MS <= period_ms <= CFS_PERIOD_MAX_MS:
        raise ValidationError("contention.period_ms", period_ms,
                              f"{CFS_PERIOD_MIN_MS:g} <= period_ms <= {CFS_PERIOD_MAX_MS:g} ms (the kernel's CFS period range)")
    quota_ms = period_ms * share_pct / 100.0
    if share_pct < 100 and quota_ms < CFS_QUOTA_MIN_MS:
        raise ValidationError("contention.cpu_share_pct", share_pct,
                              f"a quota (share x period_ms) of at least {CFS_QUOTA_MIN_MS:g} ms (the kernel's minimum); "
                              f"{share_pct} % of {period_ms} ms is {quota_ms:g} ms")


class CfsQuota:
    """CFS bandwidth control with a quota of share x period (see the module docstring)."""

    name = "cfs-quota"
    params_type = CfsParams
    uses_timeslice, uses_cgroup, local_only, adds_load = False, True, True, False
    fixed_share_pct = None
    spec_keys, own_shares_key = ("cfs_periods_ms",), None

    def validate(self, share_pct: float, timeslice_ms: float, params: CfsParams) -> None:
        """The period and the quota it gives."""
        check_period(share_pct, params.period_ms)

    def id_head(self, timeslice_ms: float, params: CfsParams) -> str:
        """``cfs100ms``."""
        return f"cfs{params.period_ms:g}ms"

    def grid_point(self, share_pct: float, values: list) -> tuple[float, CfsParams]:
        """The spec's period; the timeslice recorded is the quota (share x period)."""
        return values[0] * share_pct / 100, CfsParams(values[0])


MODEL = CfsQuota()
