"""The contention models a scenario can ask for (issue #28), their parameters and their checks.

- ``deadline`` (the default): SCHED_DEADLINE on the vCPU threads, runtime = timeslice, period = timeslice / share
  (:mod:`bbrlab.contention.deadline`);
- ``cfs-quota``: the vCPU threads in a cgroup of their own with CFS bandwidth control, quota = share x period
  (``period_ms``, default :data:`CFS_DEFAULT_PERIOD_MS`; :mod:`bbrlab.contention.cfs`);
- ``competing-load``: ``n`` CPU-bound threads pinned to the vCPU thread's CPU under the fair scheduler, equal
  weights, so the vCPU gets 1 / (n + 1) of it (:func:`load_threads`; :mod:`bbrlab.contention.load`);
- ``cfs-burst``: cfs-quota plus a burst (cgroup v2 ``cpu.max.burst``, v1 ``cpu.cfs_burst_us``) of ``burst_ms``
  per vCPU thread: quota a period leaves unused is kept, up to the burst, for a later period (the kernel allows
  at most the quota: :func:`_check_burst`);
- ``credit``: a credit balance as burstable cloud instances have it (:mod:`bbrlab.contention.credit`): full
  CPU while the balance lasts, credit earned at the baseline share (``cpu_share_pct``) and spent by the CPU
  used, so a busy vCPU drains (100 - baseline) % of a CPU-second per second; when it is spent the quota drops to
  the baseline (share x ``period_ms``), and full CPU comes back once :data:`CREDIT_REARM_FRACTION` of
  ``credit_s`` is earned again. ``credit_s`` [CPU-seconds] is the balance at the start and its cap;
- ``none``: nothing is changed (the share must be 100 %).

Only the checks live here (the scenario's :class:`~bbrlab.core.scenario.Contention` calls them), so the
model's rules are in one place and the scenario module stays small.
"""

from __future__ import annotations

import math

from .errors import ValidationError

MODELS = ("deadline", "cfs-quota", "cfs-burst", "credit", "competing-load", "none")
#: The models that put the vCPU threads in a cgroup of their own with CFS bandwidth control (take ``period_ms``).
CFS_MODELS = ("cfs-quota", "cfs-burst", "credit")
DEFAULT_MODEL = "deadline"
#: CFS bandwidth control's default period (the kernel's, libvirt's and container runtimes' default) [ms].
CFS_DEFAULT_PERIOD_MS = 100.0
#: The kernel's range for the CFS period (``cpu.cfs_period_us`` / ``cpu.max``: 1 ms .. 1 s) [ms].
CFS_PERIOD_MIN_MS, CFS_PERIOD_MAX_MS = 1.0, 1000.0
#: The kernel's smallest CFS quota (1000 us) [ms].
CFS_QUOTA_MIN_MS = 1.0
#: The credit balance a spec's credit runs start with unless ``credits_s`` says otherwise [CPU-seconds].
DEFAULT_CREDIT_S = 10.0
#: The largest credit balance a run may start with: an hour of one CPU [CPU-seconds].
CREDIT_MAX_S = 3600.0
#: Once spent, full CPU comes back when the balance has earned this fraction of ``credit_s`` again (hysteresis:
#: without it the controller would switch at every tick, as soon as a tick's credit was earned).
CREDIT_REARM_FRACTION = 0.1
#: How often the credit controller reads the vCPU threads' CPU time and settles the balance [s].
CREDIT_TICK_S = 0.1
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


def check_model(model: object, share_pct: float, timeslice_ms: float, period_ms: object,
                burst_ms: object = None, credit_s: object = None) -> None:
    """Check a contention's model and its parameters; each error names the field and what is allowed."""
    if model not in MODELS:
        raise ValidationError("contention.model", model, "one of " + ", ".join(MODELS))
    if model not in CFS_MODELS and period_ms is not None:
        raise ValidationError("contention.period_ms", period_ms, "none except for models " + ", ".join(CFS_MODELS)
                              + " (deadline's period is timeslice / share)")
    if (model == "cfs-burst") != (burst_ms is not None):
        raise ValidationError("contention.burst_ms", burst_ms, "a number with model cfs-burst, none with the others")
    if (model == "credit") != (credit_s is not None):
        raise ValidationError("contention.credit_s", credit_s, "a number with model credit, none with the others")
    if model == "none" and share_pct < 100:
        raise ValidationError("contention.cpu_share_pct", share_pct, "100 with model none (no contention)")
    if model in CFS_MODELS:
        _check_cfs(share_pct, period_ms)
    if model == "cfs-burst":
        _check_burst(share_pct, period_ms, burst_ms)
    if model == "credit":
        _check_credit(share_pct, credit_s)
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


def _number(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValidationError(field, value, "a number")
    return float(value)


def _check_burst(share_pct: float, period_ms: float, burst_ms: object) -> None:
    """0 < burst <= quota: the kernel refuses a burst above the quota (EINVAL from ``tg_set_cfs_bandwidth``)."""
    burst = _number("contention.burst_ms", burst_ms)
    quota_ms = period_ms * share_pct / 100.0
    if not 0 < burst or (share_pct < 100 and burst > quota_ms):
        raise ValidationError("contention.burst_ms", burst_ms,
                              f"0 < burst_ms <= the quota (share x period_ms = {quota_ms:g} ms; the kernel refuses "
                              "a burst above the quota)")


def _check_credit(share_pct: float, credit_s: object) -> None:
    """0 < credit_s <= :data:`CREDIT_MAX_S`; a baseline below 100 % needs a quota of at least 1 ms (checked
    with the period)."""
    credit = _number("contention.credit_s", credit_s)
    if not 0 < credit <= CREDIT_MAX_S:
        raise ValidationError("contention.credit_s", credit_s,
                              f"0 < credit_s <= {CREDIT_MAX_S:g} CPU-seconds (the balance at the start and its cap)")


def model_id_tag(model: str, timeslice_ms: float, share_pct: float, period_ms: float | None,
                 burst_ms: float | None, credit_s: float | None) -> str:
    """A contention in a run id: ``ts1ms-sh25`` (deadline, as always), ``cfs100ms-sh25``,
    ``cfs100ms-burst5ms-sh25``, ``credit30s-cfs100ms-sh25``, ``load-sh25``, ``none-sh100``."""
    share = "100" if share_pct >= 100 else f"{share_pct:g}"
    if model == "deadline":
        head = f"ts{timeslice_ms:g}ms"
    elif model == "cfs-quota":
        head = f"cfs{period_ms:g}ms"
    elif model == "cfs-burst":
        head = f"cfs{period_ms:g}ms-burst{burst_ms:g}ms"
    elif model == "credit":
        head = f"credit{credit_s:g}s-cfs{period_ms:g}ms"
    else:
        head = "load" if model == "competing-load" else "none"
    return f"{head}-sh{share}"
