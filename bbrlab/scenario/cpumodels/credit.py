"""``credit``: a credit balance as burstable cloud instances have it (applied by :mod:`bbrlab.contention.credit`):
full CPU while the balance lasts, credit earned at the baseline share (``cpu_share_pct``) and spent by the CPU
used; once spent, the quota drops to the baseline (share x ``period_ms``), and full CPU comes back once
:data:`~bbrlab.scenario.contention_models.CREDIT_REARM_FRACTION` of ``credit_s`` is earned again. ``credit_s``
[CPU-seconds] is the balance at the start and its cap."""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core.errors import ValidationError

from ..contention_models import CFS_DEFAULT_PERIOD_MS, CREDIT_MAX_S
from .base import number
from .cfs_quota import check_period


@dataclass(frozen=True, kw_only=True)
class CreditParams:
    """credit's parameters: the CFS period of its baseline quota [ms] and the balance [CPU-seconds]."""

    period_ms: float = CFS_DEFAULT_PERIOD_MS
    credit_s: float


class Credit:
    """A credit balance over a CFS quota (see the module docstring)."""

    name = "credit"
    params_type = CreditParams
    uses_timeslice, uses_cgroup, local_only, adds_load = False, True, True, False
    fixed_share_pct = None
    spec_keys, own_shares_key = ("credits_s",), "credit_shares_pct"

    def validate(self, share_pct: float, timeslice_ms: float, params: CreditParams) -> None:
        """The period as cfs-quota's (a baseline below 100 % needs a quota of at least 1 ms), then
        0 < credit_s <= :data:`~bbrlab.scenario.contention_models.CREDIT_MAX_S`."""
        check_period(share_pct, params.period_ms)
        credit = number("contention.credit_s", params.credit_s)
        if not 0 < credit <= CREDIT_MAX_S:
            raise ValidationError("contention.credit_s", params.credit_s,
                                  f"0 < credit_s <= {CREDIT_MAX_S:g} CPU-seconds (the balance at the start and its cap)")

    def id_head(self, timeslice_ms: float, params: CreditParams) -> str:
        """``credit30s-cfs100ms``."""
        return f"credit{params.credit_s:g}s-cfs{params.period_ms:g}ms"

    def grid_point(self, share_pct: float, values: list) -> tuple[float, CreditParams]:
        """The spec's credit, in the default period; the timeslice recorded is the baseline quota."""
        return CFS_DEFAULT_PERIOD_MS * share_pct / 100, CreditParams(credit_s=values[0])


MODEL = Credit()
