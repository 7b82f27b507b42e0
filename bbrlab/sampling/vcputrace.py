"""When the sender's vCPU threads ran: a trace of their scheduler events on the hypervisor host, per run.

Usage::

    with traced(hypervisor_host, vcpu_tids) as trace:
        run_the_transfer()
    result = trace.result          # a VcpuTrace: intervals, summary, schedstat check, cost

How: a tracefs instance of its own (``/sys/kernel/tracing/instances/bbrlab-<machine>-<pid>-<ticks>-<n>``, never
the global buffer) with ``sched_switch`` and ``sched_wakeup`` filtered in the kernel to the thread ids, on the
``mono`` trace clock. A reader on the host (``dd`` on ``trace_pipe``, under bash so its CPU time is reported by
``times`` when it ends) streams the events here into a scratch file; at most ``max_bytes`` (then the trace says
it is capped). At the start and at the end one bash script writes markers into the instance
(:mod:`bbrlab.sampling.vcpuparse`): CLOCK_REALTIME (``$EPOCHREALTIME``) between two markers, which gives
realtime minus the trace clock with its uncertainty, and each thread's ``/proc/<tid>/schedstat``, which the
trace's on-CPU time over the same window is compared with. The instance is removed on every exit (signals
included, as :func:`bbrlab.core.signals.restore_on_signals` restores); a killed owner's instance is
removed by :func:`clear_leftovers` (run recovery).
"""

from __future__ import annotations

import itertools
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bbrlab.core import owners
from bbrlab.core.commands import CommandError
from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.core.ownedpids import KILL_OURS_SH
from bbrlab.core.signals import restore_on_signals

from . import vcpuparse as vp

TRACEFS = "/sys/kernel/tracing"
INSTANCES = f"{TRACEFS}/instances"
#: Ring buffer per CPU of the instance; the reader empties it as it goes.
BUFFER_KB = 4096
#: Bytes of trace text read at most (about 1.3 M events): beyond it the trace is capped.
MAX_BYTES = 256 << 20
#: Relative difference allowed between the trace's on-CPU time and schedstat's run time.
SCHEDSTAT_TOLERANCE = 0.02
#: The unit of /proc/stat's counters (USER_HZ, 100 on every Linux architecture bbrlab runs on).
USER_HZ = 100
_NAME = re.compile(r"^bbrlab-([0-9A-Za-z]{1,8})-(\d+)-(\d+)-(\d+)$")
_counter = itertools.count()

_SETUP = r"""set -e
d=$1; sw=$2; wk=$3; kb=$4
mkdir "$d"
echo mono > "$d/trace_clock"
echo "$kb" > "$d/buffer_size_kb"
echo "$sw" > "$d/events/sched/sched_switch/filter"
echo "$wk" > "$d/events/sched/sched_wakeup/filter"
echo 1 > "$d/events/sched/sched_switch/enable"
echo 1 > "$d/events/sched/sched_wakeup/enable"
if [ -d "$d/events/sched/sched_stat_runtime" ]; then  # CPU time accounted: dates switch-ins left unrecorded
  echo "$wk" > "$d/events/sched/sched_stat_runtime/filter"
  echo 1 > "$d/events/sched/sched_stat_runtime/enable"
fi
if [ -d "$d/events/power/cpu_idle" ]; then  # idle exits: where a switch out of idle goes unrecorded
  echo "state == 4294967295" > "$d/events/power/cpu_idle/filter"
  echo 1 > "$d/events/power/cpu_idle/enable"
fi
"""
#: The reader: every READ_PERIOD_S it empties the buffer without blocking (a reader blocked on trace_pipe is
#: woken by every event, preempting the traced thread each time: the trace would disturb what it measures).
#: SIGTERM makes it read once more and end; it reports its own and its children's CPU with ``times``.
READ_PERIOD_S = 0.2
_READER = KILL_OURS_SH + r"""p=$1; max=$3; err=$4; period=$5; pid_line $$ > "$2"
stop=0; total=0; trap 'stop=1' TERM
mkfifo "$err.wait"; exec 9<>"$err.wait"  # read -t on a fifo nobody writes: a sleep without a fork
while [ -e "$p" ]; do
  dd if="$p" iflag=nonblock bs=65536 2> "$err"
  mapfile -t L < "$err"; w=(${L[-1]}); total=$((total + ${w[0]:-0}))
  [ "$stop" = 1 ] && break
  [ "$total" -ge "$max" ] && { echo "bbrlab-capped $total"; break; }
  read -r -t "$period" -u 9 _
done
times
"""
#: $1 the reader's pid file: SIGTERM to the reader while its pid still names it (:mod:`bbrlab.core.ownedpids`).
_STOP_READER = KILL_OURS_SH + 'read_pid_line "$1"; [ -n "$pid" ] && same "$pid" "$ticks" && kill -TERM "$pid" 2>/dev/null; true'
_EXCHANGE = r"""m=$1/trace_marker; k=$2; shift 2
echo "bbrlab-b $k" > "$m"
echo "bbrlab-rt $k $EPOCHREALTIME" > "$m"
for t; do read -r s < "/proc/$t/schedstat" && echo "bbrlab-st $k $t $s" > "$m"; done
read -r _ _ _ _ _ _ _ _ st _ < /proc/stat; echo "bbrlab-steal $k $st" > "$m"
echo "bbrlab-e $k" > "$m"
"""
_FIND_READERS = (r'find /proc/[0-9]*/fd -maxdepth 1 -lname "$1/trace_pipe" 2>/dev/null | '
                 r"cut -d/ -f3 | sort -u; true")


class VcpuTraceError(BbrlabError):
    """The trace could not be set up or read (the message says what the host answered)."""


def instance_name() -> str:
    """A new instance name for this process: ``bbrlab-<machine id, 8>-<pid>-<start ticks>-<n>``."""
    me = owners.Owner.current()
    return f"bbrlab-{me.machine[:8]}-{me.pid}-{me.ticks}-{next(_counter)}"


def _filters(tids: Sequence[int]) -> tuple[str, str]:
    switch = " || ".join(f"prev_pid == {t} || next_pid == {t}" for t in tids)
    return switch, " || ".join(f"pid == {t}" for t in tids)


@dataclass(frozen=True)
class GapStats:
    """The complete off-CPU gaps of a trace: how many, and their length's median, 90th and 99th percentile and
    maximum [ms] (None without gaps)."""

    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None


@dataclass(frozen=True)
class TraceSummary:
    """``metadata.vcpu_trace`` of a run record (docs/run-record.md): the intervals' ``file``, then
    :meth:`VcpuTrace.summary`'s keys in their order. ``threads``, ``schedstat`` and ``inferred_switch_ins`` stay
    as the summary writes them (per-thread rows, how each switch-in was inferred)."""

    file: str
    instance: str
    clock: str
    resolution_us: int
    traced_s: float
    realtime_offset_ns: int
    offset_uncertainty_ns: int
    realtime_drift_ns: int
    on_cpu_share: float
    gaps: GapStats
    longest_gap_ms: float | None
    threads: list[dict]
    events: int
    intervals: int
    bytes_read: int
    capped: bool
    lost_events: int
    inferred_switch_ins: dict[str, int]
    reader_cpu_s: float | None
    reader_cpu_per_traced_s_ms: float | None
    schedstat: list[dict]
    schedstat_agrees: bool | None
    host_steal_s: float | None


@dataclass
class VcpuTrace:
    """One run's trace: ``intervals`` (trace clock ns; ``realtime_offset_ns`` converts to CLOCK_REALTIME),
    the per-thread and overall ``summary``, the schedstat comparison and what the tracer cost."""

    instance: str
    tids: list[int]
    intervals: vp.IntervalColumns
    realtime_offset_ns: int
    offset_uncertainty_ns: int
    realtime_drift_ns: int
    window_ns: tuple[int, int]
    events: int
    bytes_read: int
    capped: bool
    lost_events: int
    reader_cpu_s: float | None
    schedstat: list[dict] = field(default_factory=list)
    host_steal_s: float | None = None

    @property
    def traced_s(self) -> float:
        """Seconds between the start and end exchanges."""
        return (self.window_ns[1] - self.window_ns[0]) / 1e9

    def window_realtime(self) -> tuple[int, int]:
        """The trace's window as CLOCK_REALTIME ns (start, end)."""
        return self.window_ns[0] + self.realtime_offset_ns, self.window_ns[1] + self.realtime_offset_ns

    def on_spans_realtime(self) -> tuple[np.ndarray, np.ndarray]:
        """The on-CPU intervals of all threads as CLOCK_REALTIME ns: their starts and ends, sorted by start (then
        end), as numpy arrays."""
        on = self.intervals.column("on")
        start = self.intervals.column("start_ns")[on] + self.realtime_offset_ns
        end = self.intervals.column("end_ns")[on] + self.realtime_offset_ns
        order = np.lexsort((end, start))
        return start[order], end[order]

    def on_intervals_realtime(self) -> list[tuple[int, int]]:
        """The on-CPU intervals of all threads as CLOCK_REALTIME ns (start, end), sorted by start."""
        start, end = self.on_spans_realtime()
        return list(zip(start.tolist(), end.tolist(), strict=True))

    def schedstat_agrees(self) -> bool | None:
        """True when every thread's on-CPU time from the trace is within 2 % of schedstat's (None: not compared)."""
        usable = [c for c in self.schedstat if c.get("relative_diff") is not None]
        return None if not usable else all(abs(c["relative_diff"]) <= SCHEDSTAT_TOLERANCE for c in usable)

    def summary(self) -> dict:
        """``metadata.vcpu_trace`` of the run record (docs/run-record.md)."""
        ivs = self.intervals
        tid, on = ivs.column("tid"), ivs.column("on")
        length = ivs.column("end_ns") - ivs.column("start_ns")
        per_thread = []
        for t in self.tids:
            mine = tid == t
            on_ns = int(length[mine & on].sum())
            per_thread.append({"tid": t, "on_cpu_share": round(on_ns / max(1, self.window_ns[1] - self.window_ns[0]), 5),
                               "on_cpu_s": round(on_ns / 1e9, 6), "gaps": _gap_stats(length, on, ivs.column("clipped"),
                                                                                        mine)})
        gaps = vp.gap_stats_ms(ivs)
        codes, labels = ivs.column("inferred"), ivs.labels()
        inferred = {how: int((codes == labels.index(how)).sum()) if how in labels else 0 for how in vp.INFERRED}
        return {"instance": self.instance, "clock": "mono", "resolution_us": 1, "traced_s": round(self.traced_s, 6),
                "realtime_offset_ns": self.realtime_offset_ns, "offset_uncertainty_ns": self.offset_uncertainty_ns,
                "realtime_drift_ns": self.realtime_drift_ns,
                "on_cpu_share": round(sum(t["on_cpu_share"] for t in per_thread) / max(1, len(per_thread)), 5),
                "gaps": gaps, "longest_gap_ms": gaps["max_ms"], "threads": per_thread,
                "events": self.events, "intervals": len(self.intervals), "bytes_read": self.bytes_read,
                "capped": self.capped, "lost_events": self.lost_events,
                "inferred_switch_ins": inferred,
                "reader_cpu_s": self.reader_cpu_s,
                "reader_cpu_per_traced_s_ms": (None if self.reader_cpu_s is None or self.traced_s <= 0 else
                                               round(1000 * self.reader_cpu_s / self.traced_s, 4)),
                "schedstat": self.schedstat, "schedstat_agrees": self.schedstat_agrees(),
                "host_steal_s": self.host_steal_s}

    def write_csv(self, path: str | Path) -> int:
        """The intervals as CSV (times in CLOCK_REALTIME ns); returns the rows written. Written in chunks from the
        columns, never a Python object per interval at once."""
        ivs, off = self.intervals, self.realtime_offset_ns
        cols = {name: ivs.column(name) for name in ("tid", "start_ns", "end_ns", "cpu", "woken_ns", "on", "clipped",
                                                   "left_state", "inferred")}
        labels = ivs.labels()
        with open(path, "w") as f:
            f.write("tid,state,start_ns,end_ns,length_ns,cpu,left_state,woken_ns,clipped,inferred\n")
            for lo in range(0, len(ivs), CSV_CHUNK):
                part = {name: c[lo:lo + CSV_CHUNK].tolist() for name, c in cols.items()}
                f.writelines(
                    f"{tid},{'on' if on else 'off'},{start + off},{end + off},{end - start},"
                    f"{'' if cpu == vp.NONE else cpu},{labels[left]},{'' if woken == vp.NONE else woken + off},"
                    f"{int(clipped)},{labels[how]}\n"
                    for tid, on, start, end, cpu, left, woken, clipped, how in zip(
                        part["tid"], part["on"], part["start_ns"], part["end_ns"], part["cpu"], part["left_state"],
                        part["woken_ns"], part["clipped"], part["inferred"], strict=True))
        return len(ivs)


#: Intervals written to the CSV at a time.
CSV_CHUNK = 1 << 16


def _gap_stats(length: np.ndarray, on: np.ndarray, clipped: np.ndarray, mine: np.ndarray) -> dict:
    """:func:`vcpuparse.gap_stats_ms` of the intervals selected by ``mine``."""
    return vp._gap_stats(np.sort(length[mine & ~on & ~clipped]).tolist())


def _running_for(line: vp.ThreadTimeline, at_ns: int) -> int:
    """How long the thread had been on a CPU at ``at_ns`` (0 when it was off): schedstat's run time is only
    brought up to date when the scheduler accounts the running thread (a tick, a switch), so it may lag by that."""
    ivs = line.intervals
    start = ivs.column("start_ns")
    hit = np.flatnonzero(ivs.column("on") & (start <= at_ns) & (at_ns < ivs.column("end_ns")))
    return int(at_ns - start[hit[0]]) if len(hit) else 0


def _on_ns(line: vp.ThreadTimeline, t0: int, t1: int, *, to_accounting: bool) -> int:
    """On-CPU ns of the thread's intervals inside [t0, t1]: from switch to switch, or (``to_accounting``) from
    where the scheduler's accounting of each interval began to its last accounting, where the trace has them.
    Column by column (a 10 s sampled run's trace holds about 190,000 intervals)."""
    ivs = line.intervals
    start, end = ivs.column("start_ns"), ivs.column("end_ns")
    if to_accounting:
        accounted = ivs.column("accounted_start_ns") != vp.NONE
        start = np.where(accounted, ivs.column("accounted_start_ns"), start)
        end = np.where(accounted, ivs.column("accounted_end_ns"), end)
    inside = ivs.column("on") & (end > t0) & (start < t1)
    return int((np.minimum(end[inside], t1) - np.maximum(start[inside], t0)).sum())


def _compare(tid: int, first: vp.Exchange, last: vp.Exchange, line: vp.ThreadTimeline,
             runtime_ns: int | None) -> dict:
    """The trace's on-CPU ns of ``tid`` over the schedstat window against schedstat's run time.

    The kernel's run time is not switch to switch: it stops counting a few microseconds before the switch-out
    event, and after a wakeup it starts counting at the wakeup; on a vCPU that switches thousands of times a
    second that adds up to several per cent. So where the trace has the accounting events (``runtime_ns`` is
    their sum over the window), each interval is counted from where its accounting began to its last accounting
    (``trace_accounted_ns``); ``trace_on_cpu_ns`` and ``relative_diff_switch`` are from switch to switch. Where a
    read fell while the thread ran, schedstat may lag by up to how long it had run: the difference counts from
    the range of run times that allows (``relative_diff``), the plain one is ``relative_diff_raw``.
    ``relative_diff_runtime``: the accounting events' sum against schedstat (0 unless events were lost)."""
    if tid not in first.schedstat or tid not in last.schedstat:
        return {"tid": tid, "relative_diff": None, "why": "schedstat not read at both ends (thread gone?)"}
    (t0, run0), (t1, run1) = first.schedstat[tid], last.schedstat[tid]
    switched = _on_ns(line, t0, t1, to_accounting=False)
    accounted = _on_ns(line, t0, t1, to_accounting=True) if runtime_ns else None
    traced = switched if accounted is None else accounted
    sched, lag0, lag1 = run1 - run0, _running_for(line, t0), _running_for(line, t1)
    if sched <= 0:
        return {"tid": tid, "relative_diff": None, "why": "schedstat counted no run time"}
    outside = max(0, (sched - lag0) - traced, traced - (sched + lag1))
    return {"tid": tid, "trace_on_cpu_ns": switched, "trace_accounted_ns": accounted, "trace_runtime_ns": runtime_ns,
            "schedstat_run_ns": sched, "stale_allowance_ns": [lag0, lag1],
            "compared": "switch" if accounted is None else "accounted",
            "relative_diff_switch": round((switched - sched) / sched, 5),
            "relative_diff_runtime": None if not runtime_ns else round((runtime_ns - sched) / sched, 5),
            "relative_diff_raw": round((traced - sched) / sched, 5),
            "relative_diff": round(outside / sched * (1 if traced >= sched else -1), 5)}


def build(instance: str, tids: Sequence[int], text_lines: Iterator[str], *, bytes_read: int, capped: bool,
          lost_events: int, reader_cpu_s: float | None) -> VcpuTrace:
    """A :class:`VcpuTrace` from the reader's output lines: the exchanges ``start`` and ``end`` set the window."""
    lines = list(text_lines)
    return _assemble(instance, tids, lambda: iter(lines), bytes_read=bytes_read, capped=capped,
                     lost_events=lost_events, reader_cpu_s=reader_cpu_s)


def read_trace(instance: str, tids: Sequence[int], raw_path: str | Path, *, lost_events: int) -> VcpuTrace:
    """A :class:`VcpuTrace` from the reader's output in ``raw_path``, read a line at a time (twice: the markers
    first, which set the window, then the scheduler events), never whole: the same trace as :func:`build` of its
    lines. Whether it is capped, how many characters were read and the reader's CPU come from the text."""
    def lines() -> Iterator[str]:
        with open(raw_path, errors="replace") as f:
            for line in f:
                yield line.rstrip("\r\n")

    chars, capped, cpu_tail = 0, False, []
    with open(raw_path, errors="replace") as f:
        for number, line in enumerate(f):
            chars += len(line)
            capped = capped or (number > 0 and line.startswith("bbrlab-capped "))
            if _TIMES.match(line):
                cpu_tail = [*cpu_tail[-1:], line.rstrip("\r\n")]
    return _assemble(instance, tids, lines, bytes_read=chars, capped=capped, lost_events=lost_events,
                     reader_cpu_s=vp.parse_times("\n".join(cpu_tail)))


_TIMES = re.compile(r"^(\d+)m([\d.]+)s (\d+)m([\d.]+)s$")


def _assemble(instance: str, tids: Sequence[int], lines: Callable[[], Iterator[str]], *, bytes_read: int,
              capped: bool, lost_events: int, reader_cpu_s: float | None) -> VcpuTrace:
    """The trace from two passes over ``lines()``: the markers and the last event's time, then the timelines and
    the runtime the scheduler accounted to each thread between its two schedstat reads."""
    markers, events, last_ns = [], 0, None
    for e in map(vp.parse_line, lines()):
        if e is None:
            continue
        last_ns = e.mono_ns
        if e.kind == "marker":
            markers.append(e)
        else:
            events += 1
    found = vp.exchanges(markers)
    if "start" not in found or ("end" not in found and not capped):
        raise VcpuTraceError(f"{instance}: the trace lacks its {'start' if 'start' not in found else 'end'} "
                             f"markers ({len(markers) + events} events read)")
    first, last = found["start"], found.get("end")  # a capped trace ends at its last event, unchecked
    offsets = [x.realtime_offset_ns for x in (first, last) if x is not None]
    if None in offsets:
        raise VcpuTraceError(f"{instance}: a clock exchange lacks its CLOCK_REALTIME marker")
    window = (first.end_ns, last.begin_ns if last else last_ns)
    last = last or vp.Exchange("end", window[1], window[1], None, None, {})
    if len(offsets) == 1:
        offsets.append(offsets[0])
    silent_on = {}
    for tid in tids:
        if tid in first.schedstat and tid in last.schedstat:
            ran = last.schedstat[tid][1] - first.schedstat[tid][1]
            silent_on[tid] = ran > (last.schedstat[tid][0] - first.schedstat[tid][0]) / 2
    runtime = _RuntimeSums(tids, first, last)
    sched_events = (e for e in map(vp.parse_line, lines()) if e is not None and e.kind != "marker")
    timelines = vp.timelines(map(runtime.count, sched_events), {t: window for t in tids}, silent_on)
    compared = [_compare(t, first, last, timelines[t], runtime.of(t)) for t in tids]
    intervals = vp.IntervalColumns.merged([line.intervals for line in timelines.values()])  # empties the lines
    (off0, unc0), (off1, unc1) = offsets
    return VcpuTrace(instance, list(tids), intervals, (off0 + off1) // 2, max(unc0, unc1) + abs(off1 - off0) // 2,
                     off1 - off0, window, events, bytes_read, capped, lost_events, reader_cpu_s, compared,
                     None if first.steal_ticks is None or last.steal_ticks is None else
                     (last.steal_ticks - first.steal_ticks) / USER_HZ)


class _RuntimeSums:
    """The runtime the scheduler accounted to each thread between its two schedstat reads, summed from the
    ``sched_stat_runtime`` events as they pass (:meth:`count` hands each event on); None for a thread without any."""

    def __init__(self, tids: Sequence[int], first: vp.Exchange, last: vp.Exchange):
        self.between = {t: (first.schedstat[t][0], last.schedstat[t][0]) for t in tids
                        if t in first.schedstat and t in last.schedstat}
        self.sums: dict[int, int] = {}

    def count(self, e: vp.Event) -> vp.Event:
        if e.kind == "runtime" and e.tid in self.between:
            t0, t1 = self.between[e.tid]
            if t0 < e.mono_ns <= t1:
                self.sums[e.tid] = self.sums.get(e.tid, 0) + e.runtime_ns
        return e

    def of(self, tid: int) -> int | None:
        return self.sums.get(tid)


@dataclass
class TraceSession:
    """A running trace on ``host`` (made by :func:`traced`); ``result`` once it has stopped."""

    host: Host
    tids: list[int]
    name: str
    raw_path: Path
    pidfile: str
    max_bytes: int = MAX_BYTES
    stream: object = None
    result: VcpuTrace | None = None
    removed: bool = False

    @property
    def path(self) -> str:
        """The instance's directory on the host."""
        return f"{INSTANCES}/{self.name}"

    def _root(self, argv: list[str], **kw):
        return self.host.run(argv, sudo=True, **kw)

    def start(self) -> None:
        """Make the instance, start the reader, write the start exchange."""
        ensure_tracefs(self.host)
        try:
            self._root(["bash", "-c", _SETUP, "bash", self.path, *_filters(self.tids), str(BUFFER_KB)])
        except CommandError as e:
            raise VcpuTraceError(f"{self.host.name}: could not set up trace instance {self.path}: {e}") from e
        argv = ["bash", "-c", _READER, "bash", f"{self.path}/trace_pipe", self.pidfile, str(self.max_bytes),
                f"{Path(self.pidfile).parent}/dd.err", str(READ_PERIOD_S)]
        self.stream = self.host.stream(argv if self.host._is_root() else ["sudo", "-n", *argv], self.raw_path)
        self.exchange("start")

    def exchange(self, key: str) -> None:
        """Write exchange ``key``'s markers (clock, schedstat of every thread) into the instance."""
        self._root(["bash", "-c", _EXCHANGE, "bash", self.path, key, *map(str, self.tids)])

    def _stats(self) -> dict[str, int]:
        out = self._root(["sh", "-c", f'cat {self.path}/per_cpu/cpu*/stats'], check=False).stdout
        sums: dict[str, int] = {}
        for key, value in re.findall(r"^(entries|overrun|dropped events|commit overrun): (\d+)", out, re.MULTILINE):
            sums[key] = sums.get(key, 0) + int(value)
        return sums

    def stop(self) -> VcpuTrace:
        """Write the end exchange, let the reader empty the buffer, stop it and build the result."""
        self.exchange("end")
        self._root(["sh", "-c", f"echo 0 > {self.path}/tracing_on"])
        stats = self._stats()
        self._root(["sh", "-c", _STOP_READER, "sh", self.pidfile])
        if self.stream.wait(10) is None:
            raise VcpuTraceError(f"{self.host.name}: the trace reader of {self.path} did not stop")
        lost = stats.get("overrun", 0) + stats.get("dropped events", 0) + stats.get("commit overrun", 0)
        self.result = read_trace(self.name, self.tids, self.raw_path, lost_events=lost)  # never read whole
        return self.result

    def remove(self) -> None:
        """Stop any reader and remove the instance (safe to call more than once)."""
        if self.removed:
            return
        remove_instance(self.host, self.name)
        if self.stream is not None:
            self.stream.close()
        self.removed = True


def remove_instance(host: Host, name: str) -> None:
    """Turn instance ``name`` off, stop whatever reads its ``trace_pipe``, and remove it."""
    path = f"{INSTANCES}/{name}"
    host.run(["sh", "-c", f'[ -d {path} ] && echo 0 > {path}/tracing_on; true'], sudo=True)
    for _ in range(50):
        gone = host.run(["sh", "-c", f'[ ! -d {path} ] || rmdir {path}'], sudo=True, check=False)
        if gone.ok:
            return
        readers = host.run(["bash", "-c", _FIND_READERS, "bash", path], sudo=True).stdout.split()
        if readers:  # a reader holds trace_pipe open (a killed owner's): the kernel refuses the rmdir
            host.run(["kill", *readers], sudo=True, check=False)
        time.sleep(0.1)
    raise VcpuTraceError(f"{host.name}: could not remove trace instance {path}: {gone.stderr.strip()}")


def ensure_tracefs(host: Host) -> bool:
    """Make sure tracefs is mounted at :data:`TRACEFS` on ``host``: systemd mounts it at boot, a minimal machine
    (a CI runner, a container host) may not have it. Mounts it when it is missing (root); returns whether this
    call mounted it. Raises :class:`VcpuTraceError` saying what to do when it cannot."""
    if host.exists(INSTANCES):
        return False
    try:
        host.run(["mount", "-t", "tracefs", "tracefs", TRACEFS], sudo=True)
    except CommandError as e:
        raise VcpuTraceError(f"{host.name}: tracefs is not mounted at {TRACEFS} and mounting it failed ({e}); mount "
                             f"it (mount -t tracefs tracefs {TRACEFS}) or turn the trace off (vcpu_trace: off)") from e
    if not host.exists(INSTANCES):
        raise VcpuTraceError(f"{host.name}: tracefs at {TRACEFS} has no instances directory: this kernel cannot give "
                             "bbrlab a trace buffer of its own; turn the trace off (vcpu_trace: off)")
    print(f"bbrlab: mounted tracefs at {TRACEFS} on {host.name} (for the vCPU trace)", file=sys.stderr, flush=True)
    return True


def clear_leftovers(host: Host) -> list[str]:
    """Remove the bbrlab trace instances on ``host`` whose owner (a process on this machine) is gone."""
    listing = host.run(["sh", "-c", f"ls {INSTANCES} 2>/dev/null; true"], sudo=True).stdout.split()
    me = owners.machine_id()[:8]
    removed = []
    for name in listing:
        m = _NAME.match(name)
        if m and m.group(1) == me and not owners.alive(int(m.group(2)), int(m.group(3))):
            remove_instance(host, name)
            removed.append(name)
    return removed


def check_tids(tids: Sequence[object]) -> list[int]:
    """The thread ids to trace: distinct positive whole numbers, at least one."""
    if not tids or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tids):
        raise ValidationError("vcpu_trace thread ids", list(tids), "one or more positive thread ids")
    if len(set(tids)) != len(tids):
        raise ValidationError("vcpu_trace thread ids", list(tids), "distinct thread ids")
    return list(tids)  # type: ignore[arg-type]


@contextmanager
def _scratch(host: Host, private: str) -> Iterator[str]:
    """Where the trace's text lands on this machine: in the private directory when ``host`` is this machine
    (stamped with its owner, so a SIGKILL leaves nothing the recovery does not remove), else a temporary one."""
    if host.is_local:
        yield private
        return
    with tempfile.TemporaryDirectory(prefix="bbrlab-vcputrace-") as scratch:
        yield scratch


@contextmanager
def traced(host: Host, tids: Sequence[int], *, max_bytes: int = MAX_BYTES,
           handle_signals: bool = True) -> Iterator[TraceSession]:
    """Trace ``tids`` on ``host`` while the ``with`` body runs; ``session.result`` after a normal exit. The
    instance is removed on every exit; SIGTERM, SIGINT and SIGHUP remove it first and then act as before."""
    tids = check_tids(list(tids))
    with host.private_dir("vcputrace") as private, _scratch(host, private) as scratch:
        session = TraceSession(host, tids, instance_name(), Path(scratch) / "trace.txt", f"{private}/reader.pid",
                               max_bytes)
        with restore_on_signals(session.remove) if handle_signals else nullcontext():
            try:
                session.start()
                yield session
                session.stop()
            finally:
                session.remove()
