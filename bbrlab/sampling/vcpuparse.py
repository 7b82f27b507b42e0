"""The text of a tracefs instance's ``trace_pipe`` turned into on-CPU / off-CPU intervals per thread.

Each line is one event: ``<comm>-<pid> [<cpu>] <flags> <sec>.<usec>: <event>: <fields>``. The trace clock is
``mono`` (CLOCK_MONOTONIC), printed by the kernel with microsecond resolution; times here are integer ns
(the microseconds x 1000). A thread's comm may hold spaces (QEMU's ``CPU 0/TCG``), so only the bracketed CPU
and the timestamp anchor a line.

Four kinds of events matter:

- ``sched_switch``: ``prev_pid`` leaves the CPU (``prev_state``: ``R``/``R+`` still runnable, i.e. preempted or
  throttled; ``S``, ``D``... asleep), ``next_pid`` gets it;
- ``sched_wakeup``: ``pid`` becomes runnable (splits an off-CPU gap into asleep and waiting);
- ``sched_stat_runtime``: the scheduler accounted ``runtime`` ns of CPU to the running ``pid`` since it last did or
  since the thread got the CPU: the first one after a switch-in dates that switch-in, when the kernel did not
  record it (see :meth:`ThreadTimeline._infer_on`);
- ``tracing_mark_write``: the tracer's own markers (:mod:`bbrlab.sampling.vcputrace`): ``bbrlab-b K`` and
  ``bbrlab-e K`` bracket exchange ``K``, ``bbrlab-rt K <sec.usec>`` carries CLOCK_REALTIME read between them,
  ``bbrlab-st K <tid> <run_ns> <wait_ns> <slices>`` a thread's ``/proc/<tid>/schedstat`` read just before, and
  ``bbrlab-steal K <ticks>`` the host's own steal time (``/proc/stat``, when the host is itself a VM).
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

_LINE = re.compile(r"\[(\d{3,})\]\s+(?:\S+\s+)?(\d+)\.(\d{6}):\s+(\w+):\s?(.*)$")
_SWITCH = re.compile(r"prev_pid=(-?\d+) prev_prio=-?\d+ prev_state=(\S+) ==> next_comm=.* next_pid=(-?\d+) ")
_WAKEUP = re.compile(r"pid=(\d+) ")
_CPU_ID = re.compile(r"cpu_id=(\d+)")
_RUNTIME = re.compile(r"pid=(\d+) runtime=(\d+)")
#: How an on-CPU interval's unrecorded switch-in was dated, best first (:meth:`ThreadTimeline._infer_on`).
INFERRED = ("runtime", "idle-exit", "wakeup", "bound")


class Event(NamedTuple):
    """One trace event: ``kind`` switch, wakeup, runtime, idle_exit (``cpu`` leaves its idle state) or marker, at
    ``mono_ns`` on ``cpu``. A switch has ``prev_tid``, ``prev_state`` and ``next_tid``; a wakeup ``tid``; a runtime
    ``tid`` and ``runtime_ns`` (CPU time accounted to it); a marker its ``text``. A named tuple, not a frozen
    dataclass: a 10 s sampled run's trace makes about 400,000 of them, three times faster so."""

    kind: str
    mono_ns: int
    cpu: int
    prev_tid: int = -1
    prev_state: str = ""
    next_tid: int = -1
    tid: int = -1
    text: str = ""
    runtime_ns: int = 0


def parse_line(line: str) -> Event | None:
    """The event on one line of trace text; None for anything else (comments, other events, the reader's
    CPU report)."""
    m = _LINE.search(line)
    if m is None:
        return None
    cpu, ns = int(m.group(1)), int(m.group(2)) * 1_000_000_000 + int(m.group(3)) * 1000
    name, rest = m.group(4), m.group(5)
    if name == "sched_switch":
        s = _SWITCH.search(rest + " ")
        return Event("switch", ns, cpu, prev_tid=int(s.group(1)), prev_state=s.group(2),
                     next_tid=int(s.group(3))) if s else None
    if name in ("sched_wakeup", "sched_wakeup_new"):
        w = _WAKEUP.search(rest + " ")
        return Event("wakeup", ns, cpu, tid=int(w.group(1))) if w else None
    if name == "sched_stat_runtime":
        r = _RUNTIME.search(rest)
        return Event("runtime", ns, cpu, tid=int(r.group(1)), runtime_ns=int(r.group(2))) if r else None
    if name == "tracing_mark_write":
        return Event("marker", ns, cpu, text=rest.strip())
    if name == "cpu_idle" and "state=4294967295 " in rest + " ":  # the CPU leaves idle (state -1)
        c = _CPU_ID.search(rest)
        return Event("idle_exit", ns, int(c.group(1)) if c else cpu)
    return None


@dataclass(frozen=True)
class Exchange:
    """One marker exchange: its bracket in trace time, CLOCK_REALTIME read inside it, the schedstat run time
    of each thread (``schedstat[tid] = (marker mono_ns, run_ns)``)."""

    key: str
    begin_ns: int
    end_ns: int
    realtime_ns: int | None
    realtime_mark_ns: int | None
    schedstat: dict[int, tuple[int, int]]
    steal_ticks: int | None = None

    @property
    def realtime_offset_ns(self) -> tuple[int, int] | None:
        """CLOCK_REALTIME minus the trace clock, and its uncertainty (half the bracket it was read in), in ns."""
        if self.realtime_ns is None or self.realtime_mark_ns is None:
            return None
        low, high = self.realtime_ns - self.realtime_mark_ns, self.realtime_ns - self.begin_ns
        return (low + high) // 2, (high - low + 1) // 2


def exchanges(events: Iterable[Event]) -> dict[str, Exchange]:
    """The complete marker exchanges among ``events``, by key."""
    parts: dict[str, dict] = {}
    for e in events:
        if e.kind != "marker" or not e.text.startswith("bbrlab-"):
            continue
        word, *args = e.text.split()
        if not args:
            continue
        p = parts.setdefault(args[0], {"st": {}})
        if word == "bbrlab-b":
            p["b"] = e.mono_ns
        elif word == "bbrlab-e":
            p["e"] = e.mono_ns
        elif word == "bbrlab-rt" and len(args) == 2:
            sec, _, usec = args[1].partition(".")
            p["rt"], p["rt_mark"] = int(sec) * 1_000_000_000 + int(usec.ljust(6, "0")[:6]) * 1000, e.mono_ns
        elif word == "bbrlab-steal" and len(args) == 2:
            p["steal"] = int(args[1])
        elif word == "bbrlab-st" and len(args) >= 3:
            p["st"][int(args[1])] = (e.mono_ns, int(args[2]))
    return {k: Exchange(k, p["b"], p["e"], p.get("rt"), p.get("rt_mark"), p["st"], p.get("steal"))
            for k, p in parts.items() if "b" in p and "e" in p}


@dataclass
class Interval:
    """One stretch of a thread's time in trace clock ns: on a CPU (``on``) or off it. An off interval says how it
    began (``left_state``, the thread's state when it left the CPU) and when the thread was woken in it (if it
    slept). ``clipped``: one end is the window's edge, not an event. ``inferred``: an on-CPU interval whose
    switch-in was missing from the trace, its start taken from the first runtime the scheduler accounted to it
    (``runtime``), its CPU's idle exit (``idle-exit``), a wakeup (``wakeup``) or an upper bound (``bound``).
    ``accounted_start_ns``, ``accounted_end_ns``: on-CPU, where the scheduler's accounting of the thread's run time
    in it began (its first accounting's time minus the runtime it counted; never before the thread last left a
    CPU) and its last accounting (at the switch-out, a few microseconds before the switch event), when the trace
    has ``sched_stat_runtime``."""

    tid: int
    on: bool
    start_ns: int
    end_ns: int
    cpu: int | None = None
    left_state: str = ""
    woken_ns: int | None = None
    clipped: bool = False
    inferred: str = ""
    accounted_start_ns: int | None = None
    accounted_end_ns: int | None = None

    @property
    def length_ns(self) -> int:
        """How long it lasted."""
        return self.end_ns - self.start_ns


#: Stands for None in an integer column of :class:`IntervalColumns`.
NONE = -(1 << 63)
_INT_FIELDS = ("tid", "start_ns", "end_ns", "cpu", "woken_ns", "accounted_start_ns", "accounted_end_ns")


class IntervalColumns(Sequence):
    """Intervals held column by column, 8 bytes an integer and one a flag (a trace at its cap has about 1.4 M of
    them: as objects they took about 300 MB), read as :class:`Interval` objects made on demand (a sequence:
    ``len``, indexing, iteration, ``index``, ``==`` with a list of intervals). :meth:`column` gives a field of every
    interval as a numpy array (None as :data:`NONE` in the integer fields, a text field as codes into
    :meth:`labels`)."""

    def __init__(self):
        self._ints = {name: array("q") for name in _INT_FIELDS}
        self._flags = array("b")  # 1: on, 2: clipped
        self._left = array("h")
        self._inferred = array("h")
        self._labels: list[str] = []
        self._codes: dict[str, int] = {}

    def _code(self, text: str) -> int:
        code = self._codes.get(text)
        if code is None:
            code = self._codes[text] = len(self._labels)
            self._labels.append(text)
        return code

    def append(self, iv: Interval) -> None:
        """Add one interval at the end."""
        for name in _INT_FIELDS:
            value = getattr(iv, name)
            self._ints[name].append(NONE if value is None else value)
        self._flags.append(int(iv.on) | int(iv.clipped) << 1)
        self._left.append(self._code(iv.left_state))
        self._inferred.append(self._code(iv.inferred))

    def __len__(self) -> int:
        return len(self._flags)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        ints = {name: self._ints[name][i] for name in _INT_FIELDS}
        ints = {k: None if v == NONE else v for k, v in ints.items()}
        flags = self._flags[i]
        return Interval(ints["tid"], bool(flags & 1), ints["start_ns"], ints["end_ns"], ints["cpu"],
                        self._labels[self._left[i]], ints["woken_ns"], bool(flags & 2), self._labels[self._inferred[i]],
                        ints["accounted_start_ns"], ints["accounted_end_ns"])

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        if isinstance(other, IntervalColumns | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"IntervalColumns({len(self)} intervals)"

    def column(self, name: str) -> np.ndarray:
        """One field of every interval as a numpy array (a view: do not keep it past the next :meth:`append`)."""
        if name in self._ints:
            return np.frombuffer(self._ints[name], dtype=np.int64) if len(self) else np.zeros(0, np.int64)
        if name in ("on", "clipped"):
            flags = np.frombuffer(self._flags, dtype=np.int8) if len(self) else np.zeros(0, np.int8)
            return (flags & (1 if name == "on" else 2)) != 0
        if name in ("left_state", "inferred"):
            codes = self._left if name == "left_state" else self._inferred
            return np.frombuffer(codes, dtype=np.int16) if len(self) else np.zeros(0, np.int16)
        raise KeyError(name)

    def labels(self) -> list[str]:
        """The texts the codes of :meth:`column` ("left_state", "inferred") stand for."""
        return list(self._labels)

    @classmethod
    def merged(cls, parts: Sequence[IntervalColumns]) -> IntervalColumns:
        """The intervals of ``parts`` sorted by (start, thread), stably (in the parts' order where both tie). The parts
        are emptied as their columns are taken over (one column more than the result is held at once); a single
        part already in that order is returned as it is."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls()
        start = np.concatenate([p.column("start_ns") for p in parts])
        tid = np.concatenate([p.column("tid") for p in parts])
        order = np.lexsort((tid, start))
        del start, tid
        if len(parts) == 1 and bool(np.all(order[1:] > order[:-1])):
            return parts[0]
        out = cls()
        for name in _INT_FIELDS:
            out._ints[name] = array("q", np.concatenate([p.column(name) for p in parts])[order].tobytes())
            for p in parts:
                p._ints[name] = array("q")
        out._flags = array("b", np.concatenate([np.frombuffer(p._flags, np.int8) for p in parts])[order].tobytes())
        for field_name in ("_left", "_inferred"):
            recoded = [np.array([out._code(t) for t in p._labels], dtype=np.int16)[np.frombuffer(getattr(p, field_name),
                       np.int16)] for p in parts]
            setattr(out, field_name, array("h", np.concatenate(recoded)[order].tobytes()))
        for p in parts:
            p._flags, p._left, p._inferred = array("b"), array("h"), array("h")
        return out


@dataclass
class ThreadTimeline:
    """The intervals of one thread between ``window`` ends (trace clock ns), built event by event."""

    tid: int
    window: tuple[int, int]
    intervals: IntervalColumns = field(default_factory=IntervalColumns)
    events: int = 0
    _state: bool | None = None
    _since: int = 0
    _cpu: int | None = None
    _left: str = ""
    _woken: int | None = None
    _ran_from: int | None = None
    _accounted: int | None = None
    _accounted_from: int | None = None
    _last_out: int | None = None

    def feed(self, e: Event, idle_exit_ns: int | None = None) -> None:
        """Take one event of this thread (events in time order); ``idle_exit_ns``: when ``e``'s CPU last left idle."""
        lo, hi = self.window
        if not lo <= e.mono_ns <= hi:
            return
        self.events += 1
        if e.kind == "wakeup":
            if self._state is not True and self._woken is None:
                self._woken = e.mono_ns
            return
        if e.kind == "runtime":
            if self._state is not True and self._ran_from is None:  # the first accounting since it left a CPU
                self._ran_from = max(self._since, e.mono_ns - e.runtime_ns)  # (or in the window: _since is 0)
            elif self._state is True and self._accounted_from is None:
                self._accounted_from = max(self._last_out or 0, e.mono_ns - e.runtime_ns)
            self._accounted = e.mono_ns
            return
        going_on = e.next_tid == self.tid
        if self._state is None:  # first switch: before it the thread was in the other state since the window began
            self._state, self._since = not going_on, lo
            if not going_on and self._ran_from is not None and self._ran_from > lo:
                # unless its first accounting in the window began after the window did: then it got the CPU then
                # (any earlier accounting inside the window would have been traced), its switch-in unrecorded
                self._state = False
            elif going_on:
                self._ran_from = None
        if going_on and self._state is False:
            self._close(e.mono_ns)
            self._last_out = self._since
            self._state, self._since, self._cpu, self._ran_from, self._accounted = True, e.mono_ns, e.cpu, None, None
            self._accounted_from = None
        elif not going_on and self._state is True:
            self._close(e.mono_ns)
            self._state, self._since, self._left, self._woken, self._ran_from = False, e.mono_ns, e.prev_state, None, None
        elif not going_on:  # it left a CPU it was never seen getting: its switch-in was not recorded
            self._infer_on(e, idle_exit_ns)

    def _infer_on(self, out: Event, idle_exit_ns: int | None) -> None:
        """An on-CPU interval whose switch-in the kernel did not record (on this project's host, no event in an idle
        task's context on CPU 1 is ever recorded, so every switch from idle to a thread there is missing).

        The scheduler accounts a running thread's CPU time at every tick and when it leaves the CPU, and its first
        accounting after the switch-in covers the time since the switch-in: that dates it (``runtime``; to within
        microseconds: after a wakeup the kernel's count starts at the wakeup, a median 11 us before the switch on
        this host, and it leaves out interrupt time). Kernels that do not
        account the thread's class through ``sched_stat_runtime`` (before 6.8 only CFS threads) fall back: a
        running thread stays on its CPU, so it began when that CPU last left idle (``idle-exit``), if that was
        after the previous interval began; else when the thread was woken, if it slept (``wakeup``); else at the
        end of the previous interval (``bound``, an upper bound). It is marked ``inferred`` with how."""
        if self._ran_from is not None:
            start, how = self._ran_from, "runtime"
        elif idle_exit_ns is not None and self._since < idle_exit_ns <= out.mono_ns:
            start, how = idle_exit_ns, "idle-exit"
        elif self._woken is not None:
            start, how = self._woken, "wakeup"
        else:
            start, how = self._since, "bound"
        if start > self._since:
            self._close(start)
        self._state, self._since, self._cpu = True, start, out.cpu
        self._close(out.mono_ns, inferred=how)
        self._state, self._since, self._left, self._woken, self._ran_from = False, out.mono_ns, out.prev_state, None, None

    def _close(self, at_ns: int, clipped: bool = False, inferred: str = "") -> None:
        first = not self.intervals
        acc_from = self._since if inferred == "runtime" else self._accounted_from
        accounted = (acc_from, self._accounted) if self._state and None not in (acc_from, self._accounted) and \
            self._since <= self._accounted <= at_ns else (None, None)
        iv = Interval(self.tid, bool(self._state), self._since, at_ns, self._cpu if self._state else None,
                      "" if self._state else self._left, None if self._state else self._woken,
                      clipped or (first and self._since == self.window[0]), inferred, *accounted)
        if self._state:
            self._accounted = self._accounted_from = None
        if iv.length_ns > 0:
            self.intervals.append(iv)

    def finish(self, on_when_silent: bool) -> list[Interval]:
        """Close the last interval at the window's end. A thread without a switch in the window was in one
        state throughout: on the CPU if ``on_when_silent`` (its schedstat says it ran)."""
        if self._state is None:
            self._state, self._since = on_when_silent, self.window[0]
        self._close(self.window[1], clipped=True)
        return self.intervals


def timelines(events: Iterable[Event], windows: dict[int, tuple[int, int]],
              on_when_silent: dict[int, bool]) -> dict[int, ThreadTimeline]:
    """Each thread's timeline from time-ordered ``events``, within its window."""
    lines = {tid: ThreadTimeline(tid, w) for tid, w in windows.items()}
    idle_exits: dict[int, int] = {}
    for e in events:
        if e.kind == "idle_exit":
            idle_exits[e.cpu] = e.mono_ns
            continue
        for tid in {e.prev_tid, e.next_tid, e.tid} & lines.keys():
            lines[tid].feed(e, idle_exits.get(e.cpu))
    for tid, line in lines.items():
        line.finish(on_when_silent.get(tid, False))
    return lines


def percentile(sorted_values: list[int], q: float) -> int:
    """The ``q`` quantile (0..1) of ascending values, nearest rank."""
    if not sorted_values:
        raise ValueError("no values")
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def gap_stats_ms(intervals: Iterable[Interval] | IntervalColumns) -> dict:
    """Count and length distribution (ms) of the complete off-CPU gaps (not clipped by the window)."""
    if isinstance(intervals, IntervalColumns):
        off = ~intervals.column("on") & ~intervals.column("clipped")
        lengths = intervals.column("end_ns")[off] - intervals.column("start_ns")[off]
        return _gap_stats(np.sort(lengths).tolist())
    return _gap_stats(sorted(iv.length_ns for iv in intervals if not iv.on and not iv.clipped))


def _gap_stats(gaps: list[int]) -> dict:
    if not gaps:
        return {"count": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    return {"count": len(gaps), **{f"{name}_ms": round(percentile(gaps, q) / 1e6, 4)
                                   for name, q in (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))}}


def parse_times(text: str) -> float | None:
    """Seconds of CPU (user + system) of a bash script and its children, from the two lines of ``times``."""
    lines = re.findall(r"^(\d+)m([\d.]+)s (\d+)m([\d.]+)s$", text, re.MULTILINE)
    if len(lines) < 2:
        return None
    return round(sum(int(um) * 60 + float(us) + int(sm) * 60 + float(ss) for um, us, sm, ss in lines[-2:]), 6)
