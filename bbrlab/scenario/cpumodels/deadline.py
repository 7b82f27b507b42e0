"""``deadline``, the default model: SCHED_DEADLINE on the vCPU threads, runtime = the timeslice, period = timeslice
/ share, and a deadline set by ``deadline_mode`` (applied by :mod:`bbrlab.contention.deadline`):

* ``constrained`` (the default, the paper's setting, section 4.2): deadline = runtime. The runtime must be used
  within a timeslice of the period's start; a vCPU that wakes later in the period (after an idle sleep) waits for
  the next one.
* ``implicit``: deadline = period. The runtime is a budget the vCPU may use anywhere in the period.

Both admit the same bandwidth (runtime / period). Its checks are the kernel's limits on the period and the runtime
and the mode's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core.errors import ValidationError

from .base import omitted_at_default

#: Limits the kernel applies to SCHED_DEADLINE (defaults of sched_deadline_period_{min,max}_us).
DEADLINE_PERIOD_MIN_US = 100
DEADLINE_PERIOD_MAX_US = 4_194_304
DEADLINE_RUNTIME_MIN_NS = 1024

#: The deadline modes: constrained (deadline = runtime, the default) and implicit (deadline = period).
DEADLINE_MODES = ("constrained", "implicit")
DEFAULT_DEADLINE_MODE = DEADLINE_MODES[0]


@dataclass(frozen=True)
class DeadlineParams:
    """deadline's parameter: ``deadline_mode``, constrained (deadline = runtime) or implicit (deadline = period).
    A record leaves it out when constrained, so records made before it read as constrained, with their run ids."""

    deadline_mode: str = omitted_at_default(DEFAULT_DEADLINE_MODE)


def check_deadline_mode(value: object, field: str = "contention.deadline_mode") -> str:
    """``value`` if it is one of :data:`DEADLINE_MODES`; a :class:`ValidationError` on ``field`` otherwise."""
    if not isinstance(value, str) or value not in DEADLINE_MODES:
        raise ValidationError(field, value, "one of constrained (deadline = runtime, the paper's) or implicit "
                              "(deadline = period)")
    return value


class Deadline:
    """SCHED_DEADLINE with the contention's timeslice (see the module docstring)."""

    name = "deadline"
    params_type = DeadlineParams
    uses_timeslice, uses_cgroup, local_only, adds_load = True, False, False, False
    fixed_share_pct = None
    spec_keys, own_shares_key = ("timeslices_ms", "deadline_modes"), None

    def validate(self, share_pct: float, timeslice_ms: float, params: DeadlineParams) -> None:
        """The mode's name; below 100 %: a runtime of at least the kernel's minimum and a period the kernel takes
        (the deadline lies between them in either mode)."""
        check_deadline_mode(params.deadline_mode)
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

    def id_head(self, timeslice_ms: float, params: DeadlineParams) -> str:
        """``ts1ms``: the timeslice, as deadline run ids have always said it; ``ts1ms-implicit`` in implicit mode."""
        mode = "" if params.deadline_mode == DEFAULT_DEADLINE_MODE else f"-{params.deadline_mode}"
        return f"ts{timeslice_ms:g}ms{mode}"

    def grid_point(self, share_pct: float, values: list) -> tuple[float, DeadlineParams]:
        """The spec's timeslice and deadline mode."""
        return values[0], DeadlineParams(values[1])


MODEL = Deadline()
