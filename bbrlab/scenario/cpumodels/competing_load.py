"""``competing-load``: ``n`` CPU-bound threads pinned to the vCPU thread's CPU under the fair scheduler, equal
weights, so the vCPU gets 1 / (n + 1) of it (:func:`~bbrlab.scenario.contention_models.load_threads`; applied by
:mod:`bbrlab.contention.load`). No parameters of its own: the share sets ``n``."""

from __future__ import annotations

from bbrlab.core.errors import ValidationError

from ..contention_models import MAX_LOAD_THREADS, load_threads
from .base import UNUSED_TIMESLICE_MS, NoParams


class CompetingLoad:
    """Equal-weight busy threads beside the vCPU thread (see the module docstring)."""

    name = "competing-load"
    params_type = NoParams
    uses_timeslice, uses_cgroup, local_only, adds_load = False, False, True, True
    fixed_share_pct = None
    spec_keys, own_shares_key = (), None

    def validate(self, share_pct: float, timeslice_ms: float, params: NoParams) -> None:
        """Below 100 %: a share that needs 1 to :data:`~bbrlab.scenario.contention_models.MAX_LOAD_THREADS` threads."""
        if share_pct >= 100:
            return
        n = load_threads(share_pct)
        if not 1 <= n <= MAX_LOAD_THREADS:
            raise ValidationError("contention.cpu_share_pct", share_pct,
                                  f"a share that needs 1 to {MAX_LOAD_THREADS} competing threads with model "
                                  f"competing-load (n = (100 - share) / share rounded: {n})")

    def id_head(self, timeslice_ms: float, params: NoParams) -> str:
        """``load``."""
        return "load"

    def grid_point(self, share_pct: float, values: list) -> tuple[float, NoParams]:
        """The share alone; the timeslice is not used."""
        return UNUSED_TIMESLICE_MS, NoParams()


MODEL = CompetingLoad()
