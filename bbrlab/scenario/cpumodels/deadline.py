"""``deadline``, the default model: SCHED_DEADLINE on the vCPU threads, runtime = deadline = the timeslice,
period = timeslice / share. It has no parameters of its own; its checks are the kernel's limits on the period
and the runtime (applied by :mod:`bbrlab.contention.deadline`)."""

from __future__ import annotations

from bbrlab.core.errors import ValidationError

from .base import NoParams

#: Limits the kernel applies to SCHED_DEADLINE (defaults of sched_deadline_period_{min,max}_us).
DEADLINE_PERIOD_MIN_US = 100
DEADLINE_PERIOD_MAX_US = 4_194_304
DEADLINE_RUNTIME_MIN_NS = 1024


class Deadline:
    """SCHED_DEADLINE with the contention's timeslice (see the module docstring)."""

    name = "deadline"
    params_type = NoParams
    uses_timeslice, uses_cgroup, local_only, adds_load = True, False, False, False
    fixed_share_pct = None
    spec_keys, own_shares_key = ("timeslices_ms",), None

    def validate(self, share_pct: float, timeslice_ms: float, params: NoParams) -> None:
        """Below 100 %: a runtime of at least the kernel's minimum and a period the kernel takes."""
        if share_pct >= 100:
            return
        if int(round(timeslice_ms * 1e6)) < DEADLINE_RUNTIME_MIN_NS:
            raise ValidationError("contention.timeslice_ms", timeslice_ms,
                                  f"a runtime of at least {DEADLINE_RUNTIME_MIN_NS} ns (the kernel's minimum)")
        period_us = timeslice_ms * 1e3 * 100.0 / share_pct  # float: a tiny share gives inf
        if not DEADLINE_PERIOD_MIN_US <= period_us <= DEADLINE_PERIOD_MAX_US:
            raise ValidationError(
                "contention.cpu_share_pct", share_pct,
                f"a period (timeslice / share) between {DEADLINE_PERIOD_MIN_US} us and "
                f"{DEADLINE_PERIOD_MAX_US} us; {timeslice_ms} ms / {share_pct} % gives {period_us:.0f} us",
            )

    def id_head(self, timeslice_ms: float, params: NoParams) -> str:
        """``ts1ms``: the timeslice, as deadline run ids have always said it."""
        return f"ts{timeslice_ms:g}ms"

    def grid_point(self, share_pct: float, values: list) -> tuple[float, NoParams]:
        """The spec's timeslice."""
        return values[0], NoParams()


MODEL = Deadline()
