"""How much CPU a thread really got: snapshots of ``/proc/<tid>/schedstat`` on a host.

``/proc/<tid>/schedstat`` holds three counters kept by the scheduler for every thread:
time spent running (ns), time spent runnable but waiting (ns), and the number of times it
was given the CPU. Two snapshots and the host's clock (``/proc/uptime``) between them give
the share of one CPU the thread used: under SCHED_DEADLINE with runtime/period = 25 % a busy
thread uses about 25 %; an idle one uses less (a halted vCPU does not spend its budget).

The thread's start time (field 22 of ``/proc/<tid>/stat``) tells a live thread from a new
one that reused its id. Everything is read in one command on the host, so the counters and
the clock belong together.

A :class:`ThreadIdentity` (process id, name, start time, the host's boot id) is what a thread id is
pinned to (:mod:`bbrlab.contention.vcpu`); :func:`open_thread_dir` holds a thread's ``/proc`` directory, which
stops answering once that thread is gone, even if its id is handed to a new thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from bbrlab.core.hosts import Host

UPTIME = "/proc/uptime"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class ThreadSample:
    """One thread's counters at one moment (``uptime_s`` is the host's clock then)."""

    tid: int
    comm: str
    start_ticks: int
    cpu_ns: int
    wait_ns: int
    timeslices: int
    uptime_s: float

    def to_dict(self) -> dict:
        """Every field by name (times in ns, ``uptime_s`` in s), JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class ThreadUsage:
    """What a thread used between two samples."""

    tid: int
    comm: str
    wall_s: float
    cpu_s: float
    wait_s: float
    timeslices: int
    same_thread: bool

    @property
    def cpu_share_pct(self) -> float:
        """CPU time used as a percentage of wall time (100 = one full CPU)."""
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        """Every field by name (times in s) plus ``cpu_share_pct`` rounded to 0.01: the usage keys of a
        thread in a run record's ``metadata.contention.evidence.threads[]``."""
        d = asdict(self)
        d["cpu_share_pct"] = round(self.cpu_share_pct, 2)
        return d


def read_proc_files(host: Host, paths: Sequence[str]) -> dict[str, str]:
    """Contents of ``paths`` on ``host``; a file that cannot be read (thread gone) is absent."""
    if host.is_local:
        out = {}
        for p in paths:
            try:
                with open(p) as f:
                    out[p] = f.read()
            except OSError:
                pass
        return out
    # grep -H prefixes each line with its file name, so one command reads them all and a missing
    # file only drops its own lines (grep then exits 2; that is expected here).
    res = host.run(["grep", "-H", "", *paths], check=False)
    out: dict[str, str] = {}
    for line in res.stdout.splitlines():
        for p in paths:
            if line.startswith(p + ":"):
                out[p] = out.get(p, "") + line[len(p) + 1:] + "\n"
                break
    return out


def _parse_stat(text: str) -> tuple[str, int]:
    """(comm, start time in clock ticks) from ``/proc/<tid>/stat``; comm may hold spaces and parens."""
    comm = text[text.index("(") + 1: text.rindex(")")]
    fields_after_comm = text[text.rindex(")") + 2:].split()
    # Field 3 (state) is the first after comm, so field 22 (starttime) is index 22 - 3.
    return comm, int(fields_after_comm[22 - 3])


def thread_state(stat_text: str) -> str:
    """The state letter (``R`` runnable, ``S`` sleeping, ...) from ``/proc/<tid>/stat``."""
    return stat_text[stat_text.rindex(")") + 2:].split()[0]


def sample_threads(host: Host, thread_ids: Sequence[int]) -> dict[int, ThreadSample]:
    """Snapshot every thread in ``thread_ids``; threads that no longer exist are left out."""
    paths = [UPTIME]
    for tid in thread_ids:
        paths += [f"/proc/{tid}/schedstat", f"/proc/{tid}/stat"]
    files = read_proc_files(host, paths)
    # /proc/uptime ticks in 10 ms steps; here the same clock (CLOCK_BOOTTIME) is read more finely.
    uptime_s = time.clock_gettime(time.CLOCK_BOOTTIME) if host.is_local else float(files[UPTIME].split()[0])
    samples = {}
    for tid in thread_ids:
        sched, stat = files.get(f"/proc/{tid}/schedstat"), files.get(f"/proc/{tid}/stat")
        if not sched or not stat:
            continue
        cpu_ns, wait_ns, slices = (int(x) for x in sched.split()[:3])
        comm, start_ticks = _parse_stat(stat)
        samples[tid] = ThreadSample(tid, comm, start_ticks, cpu_ns, wait_ns, slices, uptime_s)
    return samples


def usage_between(first: ThreadSample, last: ThreadSample) -> ThreadUsage:
    """CPU used by one thread between two of its samples."""
    return ThreadUsage(
        tid=first.tid,
        comm=first.comm,
        wall_s=round(last.uptime_s - first.uptime_s, 3),
        cpu_s=(last.cpu_ns - first.cpu_ns) / 1e9,
        wait_s=(last.wait_ns - first.wait_ns) / 1e9,
        timeslices=last.timeslices - first.timeslices,
        same_thread=first.start_ticks == last.start_ticks,
    )


# -- which thread a thread id is -------------------------------------------------------------------

@dataclass(frozen=True)
class ThreadIdentity:
    """Who holds thread id ``tid``: its process (``pid``, the tgid), name (``comm``), start time in clock
    ticks since the host booted (field 22 of ``/proc/<tid>/stat``) and the host's ``boot_id``.

    A thread id freed by an exited thread can be handed to a new thread (``pid_max`` is 32768 on many
    hosts); the new one differs in start time at least."""

    tid: int
    pid: int
    comm: str
    start_ticks: int
    boot_id: str = ""

    def to_dict(self) -> dict:
        """Every field by name: one entry of ``threads`` in the vCPU pins file
        (:func:`bbrlab.contention.vcpu.save_pins`); :meth:`from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ThreadIdentity:
        """The identity stored by :meth:`to_dict` (unknown keys are an error)."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown thread identity field(s) {sorted(unknown)}")
        return cls(tid=int(d["tid"]), pid=int(d["pid"]), comm=str(d["comm"]), start_ticks=int(d["start_ticks"]),
                   boot_id=str(d.get("boot_id", "")))

    def differences(self, now: ThreadIdentity) -> list[str]:
        """How the thread holding the id ``now`` differs from this one (empty: the same thread)."""
        out = []
        if self.boot_id and now.boot_id and self.boot_id != now.boot_id:
            out.append(f"the host rebooted (boot id {now.boot_id}, pinned {self.boot_id})")
        for name in ("pid", "comm", "start_ticks"):
            mine, theirs = getattr(self, name), getattr(now, name)
            if mine != theirs:
                out.append(f"{name} {theirs!r} (pinned {mine!r})")
        return out

    def stat_matches(self, stat_text: str) -> bool:
        """Whether ``/proc/<tid>/stat`` text is this thread's (same name and start time)."""
        return _parse_stat(stat_text) == (self.comm, self.start_ticks)

    def describe(self) -> str:
        """The thread in words for messages: id, name, process and start tick."""
        return f"thread {self.tid} ({self.comm!r} of process {self.pid}, started at tick {self.start_ticks})"


def _tgid(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    return None


def read_identities(host: Host, thread_ids: Sequence[int]) -> dict[int, ThreadIdentity]:
    """The identity of each thread in ``thread_ids`` on ``host`` now; ids no thread holds are left out."""
    paths = [BOOT_ID]
    for tid in thread_ids:
        paths += [f"/proc/{tid}/stat", f"/proc/{tid}/status"]
    files = read_proc_files(host, paths)
    boot_id = files.get(BOOT_ID, "").strip()
    out = {}
    for tid in thread_ids:
        stat, status = files.get(f"/proc/{tid}/stat"), files.get(f"/proc/{tid}/status")
        pid = _tgid(status) if status else None
        if not stat or pid is None:
            continue
        comm, start_ticks = _parse_stat(stat)
        out[tid] = ThreadIdentity(tid, pid, comm, start_ticks, boot_id)
    return out


def open_thread_dir(identity: ThreadIdentity) -> int | None:
    """An open descriptor of ``/proc/<pid>/task/<tid>`` on this machine if that directory is still the
    thread ``identity`` names, else None. Files opened through it (:func:`read_stat_at`) fail once that
    thread is gone, also after its id went to a new thread: the descriptor holds the thread, not the id."""
    try:
        fd = os.open(f"/proc/{identity.pid}/task/{identity.tid}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    stat = read_stat_at(fd)
    if stat is None or not identity.stat_matches(stat):
        os.close(fd)
        return None
    return fd


def read_stat_at(dir_fd: int) -> str | None:
    """``stat`` of the thread whose directory ``dir_fd`` holds, or None when that thread is gone."""
    try:
        fd = os.open("stat", os.O_RDONLY, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
