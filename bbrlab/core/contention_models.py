"""The contention models a scenario can ask for (issue #28), their parameters and their checks.

- ``deadline`` (the default): SCHED_DEADLINE on the vCPU threads, runtime = timeslice, period = timeslice / share
  (:mod:`bbrlab.contention.deadline`);
- ``cfs-quota``: the vCPU threads in a cgroup of their own with CFS bandwidth control, quota = share x period
  (``period_ms``, default :data:`CFS_DEFAULT_PERIOD_MS`; :mod:`bbrlab.contention.cfs`);
- ``competing-load``: ``n`` CPU-bound threads pinned to the vCPU thread's CPU under the fair scheduler, equal
  weights, so the vCPU gets 1 / (n + 1) of it (:func:`load_threads`; :mod:`bbrlab.contention.load`);
- ``none``: nothing is changed (the share must be 100 %).

Only the checks live here (the scenario's :class:`~bbrlab.core.scenario.Contention` calls them), so the
model's rules are in one place and the scenario module stays small.
"""

from __future__ import annotations

import math

from .errors import ValidationError

MODELS = ("deadline", "cfs-quota", "competing-load", "none")
DEFAULT_MODEL = "deadline"
#: CFS bandwidth control's default period (the kernel's, libvirt's and container runtimes' default) [ms].
CFS_DEFAULT_PERIOD_MS = 100.0
#: The kernel's range for the CFS period (``cpu.cfs_period_us`` / ``cpu.max``: 1 ms .. 1 s) [ms].
CFS_PERIOD_MIN_MS, CFS_PERIOD_MAX_MS = 1.0, 1000.0
#: The kernel's smallest CFS quota (1000 us) [ms].
CFS_QUOTA_MIN_MS = 1.0
#: At most this many competing threads (a share below about 1.5 %).
MAX_LOAD_THREADS = 64


def load_threads(share_pct: float) -> int:
    """Equal-weight competing threads that leave the vCPU thread ``share_pct`` of its CPU under the fair scheduler:
    n = (1 - s) / s rounded half up (the vCPU gets 1 / (n + 1): 25 % -> 3, 50 % -> 1, 40 % -> 2 (33 %)); 0 at 100 %."""
    if share_pct >= 100:
        return 0
    return int(math.floor((100.0 - share_pct) / share_pct + 0.5 + 1e-9))  # in percent: 40 % gives 1.5 exactly


def load_share_pct(threads: int) -> float:
    """The share the vCPU thread gets beside ``threads`` equal-weight competitors: 100 / (threads + 1) [%]."""
    return 100.0 / (threads + 1)


def check_model(model: object, share_pct: float, timeslice_ms: float, period_ms: object) -> None:
    """Check a contention's model and its parameters; each error names the field and what is allowed."""
    if model not in MODELS:
        raise ValidationError("contention.model", model, "one of " + ", ".join(MODELS))
    if model != "cfs-quota" and period_ms is not None:
        raise ValidationError("contention.period_ms", period_ms,
                              "none except for model cfs-quota (deadline's period is timeslice / share)")
    if model == "none" and share_pct < 100:
        raise ValidationError("contention.cpu_share_pct", share_pct, "100 with model none (no contention)")
    if model == "cfs-quota":
        _check_cfs(share_pct, period_ms)
    if model == "competing-load" and share_pct < 100:
        n = load_threads(share_pct)
        if not 1 <= n <= MAX_LOAD_THREADS:
            raise ValidationError("contention.cpu_share_pct", share_pct,
                                  f"a share that needs 1 to {MAX_LOAD_THREADS} competing threads with model "
                                  f"competing-load (n = (100 - share) / share rounded: {n})")


def _check_cfs(share_pct: float, period_ms: object) -> None:
    if isinstance(period_ms, bool) or not isinstance(period_ms, int | float) \
            or not CFS_PERIOD_MIN_MS <= period_ms <= CFS_PERIOD_MAX_MS:
        raise ValidationError("contention.period_ms", period_ms,
                              f"{CFS_PERIOD_MIN_MS:g} <= period_ms <= {CFS_PERIOD_MAX_MS:g} ms (the kernel's CFS period range)")
    quota_ms = period_ms * share_pct / 100.0
    if share_pct < 100 and quota_ms < CFS_QUOTA_MIN_MS:
        raise ValidationError("contention.cpu_share_pct", share_pct,
                              f"a quota (share x period_ms) of at least {CFS_QUOTA_MIN_MS:g} ms (the kernel's minimum); "
                              f"{share_pct} % of {period_ms} ms is {quota_ms:g} ms")
