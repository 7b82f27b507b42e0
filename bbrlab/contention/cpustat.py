"""A cgroup's CFS bandwidth counters (its ``cpu.stat``) and how much they moved over a run (:class:`CfsThrottling`).

The kernel counts, per cgroup, the CFS periods in which the cgroup had a quota and used CPU (``nr_periods``),
the periods it ran out of quota and was throttled (``nr_throttled``) and how long it stayed throttled: cgroup v1
writes that time as ``throttled_time`` in nanoseconds, cgroup v2 as ``throttled_usec`` in microseconds. Kernels
with CFS burst (5.14+) add ``nr_bursts`` and the burst time (v1 ``burst_time`` [ns], v2 ``burst_usec``).
:func:`parse` reads either version's text into one :class:`CpuStat` in microseconds; :func:`between` gives the
change from one reading to the next in milliseconds, the unit a record keeps. A quota that never bound shows as
``nr_throttled`` 0: measured, not inferred.

Standard library only: the cgroup v2 test copies this module into the sender guest beside ``cgroups.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Each version's key for the throttled time and the burst time, and how many microseconds one unit is.
_TIME_KEYS = {1: (("throttled_time", "burst_time"), 1e-3), 2: (("throttled_usec", "burst_usec"), 1.0)}


@dataclass(frozen=True)
class CpuStat:
    """One reading of a cgroup's ``cpu.stat`` bandwidth counters (cumulative since the cgroup was made);
    ``nr_bursts`` and ``burst_us`` None where the kernel has no CFS burst."""

    nr_periods: int
    nr_throttled: int
    throttled_us: float
    nr_bursts: int | None = None
    burst_us: float | None = None


@dataclass(frozen=True)
class CfsThrottling:
    """``contention.evidence.throttling``: how much a cgroup's CFS counters moved while the run's body ran.

    ``nr_periods``: CFS periods in which the cgroup had a quota and ran; ``nr_throttled``: of those, the ones it
    spent its quota in and was throttled; ``throttled_ms``: the time its threads waited throttled [ms] (summed
    over the CPUs the cgroup was throttled on); ``nr_bursts`` and ``burst_ms``: times it used a burst and the
    burst time used [ms] (None on kernels without CFS burst); ``cgroup``: whose ``cpu.stat`` it was (bbrlab's
    own cgroup; the threads' own cgroup when no quota was applied)."""

    nr_periods: int
    nr_throttled: int
    throttled_ms: float
    nr_bursts: int | None
    burst_ms: float | None
    cgroup: str


def parse(text: str, version: int) -> CpuStat | None:
    """The bandwidth counters of a ``cpu.stat`` of cgroup ``version`` 1 or 2; None when the text lacks them (the
    root cgroup of v2, a cgroup without the cpu controller, an empty or unreadable file)."""
    if version not in _TIME_KEYS:
        raise ValueError(f"cgroup version {version!r}: 1 or 2")
    values: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    (throttled_key, burst_key), us_per_unit = _TIME_KEYS[version]
    if not {"nr_periods", "nr_throttled", throttled_key} <= set(values):
        return None
    burst = values.get(burst_key)
    return CpuStat(values["nr_periods"], values["nr_throttled"], values[throttled_key] * us_per_unit,
                   values.get("nr_bursts"), None if burst is None else burst * us_per_unit)


def between(start: CpuStat | None, end: CpuStat | None, cgroup: str) -> CfsThrottling | None:
    """What moved from ``start`` to ``end`` (readings of ``cgroup``), in the record's units; None when either
    reading is missing."""
    if start is None or end is None:
        return None
    bursts = None if start.nr_bursts is None or end.nr_bursts is None else end.nr_bursts - start.nr_bursts
    burst_ms = None if start.burst_us is None or end.burst_us is None else round((end.burst_us - start.burst_us) / 1e3, 3)
    return CfsThrottling(end.nr_periods - start.nr_periods, end.nr_throttled - start.nr_throttled,
                         round((end.throttled_us - start.throttled_us) / 1e3, 3), bursts, burst_ms, cgroup)
