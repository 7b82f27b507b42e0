"""``none``: no contention; nothing is changed on the vCPU threads (the share must be 100 %), what they got is
measured all the same (by :mod:`bbrlab.contention.deadline`'s session, which applies nothing at 100 %)."""

from __future__ import annotations

from bbrlab.core.errors import ValidationError

from .base import UNUSED_TIMESLICE_MS, NoParams


class NoContention:
    """Nothing applied (see the module docstring)."""

    name = "none"
    params_type = NoParams
    uses_timeslice, uses_cgroup, local_only, adds_load = False, False, False, False
    fixed_share_pct = 100.0
    spec_keys, own_shares_key = (), None

    def validate(self, share_pct: float, timeslice_ms: float, params: NoParams) -> None:
        """The share must be 100 %."""
        if share_pct < 100:
            raise ValidationError("contention.cpu_share_pct", share_pct, "100 with model none (no contention)")

    def id_head(self, timeslice_ms: float, params: NoParams) -> str:
        """``none``."""
        return "none"

    def grid_point(self, share_pct: float, values: list) -> tuple[float, NoParams]:
        """Nothing to cross: the timeslice is not used."""
        return UNUSED_TIMESLICE_MS, NoParams()


MODEL = NoContention()
