"""How much of this machine's CPU went to processes outside the testbed while a run transferred.

:mod:`bbrlab.contention.hostcpu` says how busy the host's CPUs were; on the local testbed most of that is the
testbed itself (the sender's and the emulator's QEMU, the receiver's iperf3 in its network namespace, bbrlab
and the commands it started). What is left is someone else's work competing with the testbed for the same
CPUs: a compiler, another developer's tests, a busy loop. This module measures that remainder from two
snapshots of ``/proc`` (a :class:`Snapshot` each: ``/proc/stat`` and every ``/proc/<pid>/stat``):

    other ticks = (user + nice + system ticks of all CPUs) - (CPU ticks of the testbed's processes)

over the same window, both in clock ticks (USER_HZ). The testbed's processes (:class:`Ours`) are its QEMU
processes (a process's ``utime``/``stime`` count all its threads, those ended too), every process in one of
its network namespaces, and this process with all its descendants. A process's ticks include what its
reaped children used (``cutime``/``cstime``); a process of ours that ended within the window is counted in
its parent (only its part within the window: its ticks at the first snapshot are taken off), and one that was
never ours and ended within the window stays in the "other" part, as it should.

Left out of both sides: irq, softirq and steal time. Softirq is where the host forwards the testbed's packets
between its taps (no process is charged for it), and steal is time the host's own hypervisor took; both are
recorded next to the result (``softirq_pct``, ``steal_pct``) instead. The result is a share of all CPUs
(``other_busy_pct``: a busy loop on one core of a 2-core machine is about 50 %) and in CPUs
(``other_cpus``); it cannot be split per CPU, since a process's ticks are not. The per-process counters and
``/proc/stat`` are kept by different kernel paths, so the difference can come out negative on a quiet host
(measured: -22 to +3 ticks of 431-724 over 2 s testbed runs, up to 5 % of all CPUs); ``other_ticks`` keeps
it as measured, ``other_busy_pct`` is clamped at 0.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .hostcpu import CpuTimes, parse_proc_stat

#: The /proc/stat fields that are a process's own CPU time (irq, softirq and steal are not).
PROCESS_FIELDS = ("user", "nice", "system")
#: How many of the busiest processes outside the testbed a record names.
TOP = 5


@dataclass(frozen=True)
class ProcTimes:
    """One process from ``/proc/<pid>/stat``: its name, parent, start (ticks since boot) and CPU ticks (its
    own ``utime + stime`` and its reaped children's ``cutime + cstime``)."""

    pid: int
    comm: str
    ppid: int
    start_ticks: int
    own_ticks: int
    children_ticks: int

    @property
    def ticks(self) -> int:
        """All CPU ticks charged to the process: its own and its reaped children's."""
        return self.own_ticks + self.children_ticks


def parse_pid_stat(pid: int, text: str) -> ProcTimes:
    """One ``/proc/<pid>/stat`` line (the name, in parentheses, may hold spaces and parentheses)."""
    close = text.rindex(")")
    comm = text[text.index("(") + 1:close]
    rest = text[close + 2:].split()  # rest[0] is field 3 (state): field n is rest[n - 3]
    return ProcTimes(pid=pid, comm=comm, ppid=int(rest[1]), start_ticks=int(rest[19]),
                     own_ticks=int(rest[11]) + int(rest[12]), children_ticks=int(rest[13]) + int(rest[14]))


@dataclass(frozen=True)
class Snapshot:
    """``/proc/stat`` and every process at one moment; ``netns`` maps a pid to its network namespace's inode
    (only where it could be read)."""

    cpu: CpuTimes
    procs: dict[int, ProcTimes]
    netns: dict[int, int] = field(default_factory=dict)
    at_s: float = 0.0  # time.monotonic() when taken


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process ended meanwhile
        return None


def _netns_inode(pid: int, proc: Path) -> int | None:
    try:
        return os.stat(proc / str(pid) / "ns" / "net").st_ino
    except OSError:
        return None


def snapshot(proc: Path = Path("/proc")) -> Snapshot:
    """Every process's CPU ticks and network namespace, then ``/proc/stat``, from ``proc`` (a copy of /proc in
    a test)."""
    procs, netns = {}, {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        text = _read(f"{entry.path}/stat")
        if text is None:
            continue
        try:
            procs[pid] = parse_pid_stat(pid, text)
        except (ValueError, IndexError):
            continue
        inode = _netns_inode(pid, proc)
        if inode is not None:
            netns[pid] = inode
    return Snapshot(parse_proc_stat((proc / "stat").read_text()), procs, netns, time.monotonic())


@dataclass(frozen=True)
class Ours:
    """The testbed's processes: its QEMU pids (each with its start ticks, so a pid reused is not taken for
    it), the inodes of its network namespaces, and the root of bbrlab's own process tree (this process)."""

    qemu: dict[int, int | None] = field(default_factory=dict)  # pid -> start ticks (None: any)
    netns_inodes: frozenset[int] = frozenset()
    root_pid: int = field(default_factory=os.getpid)

    def pids(self, snap: Snapshot) -> set[int]:
        """The pids in ``snap`` that belong to the testbed."""
        ours = {pid for pid, ticks in self.qemu.items()
                if pid in snap.procs and ticks in (None, snap.procs[pid].start_ticks)}
        ours |= {pid for pid, inode in snap.netns.items() if inode in self.netns_inodes}
        children: dict[int, list[int]] = {}
        for p in snap.procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        todo = [self.root_pid] if self.root_pid in snap.procs else []
        while todo:  # bbrlab and everything it started that still runs under it
            pid = todo.pop()
            ours.add(pid)
            todo.extend(c for c in children.get(pid, ()) if c not in ours)
        return ours


def netns_inodes(names: Iterable[str], run_dir: Path = Path("/run/netns")) -> frozenset[int]:
    """The inodes of the named network namespaces (``ip netns`` keeps them under /run/netns); a name not
    found is left out."""
    found = set()
    for name in names:
        try:
            found.add(os.stat(run_dir / name).st_ino)
        except OSError:
            continue
    return frozenset(found)


def _same(a: ProcTimes | None, b: ProcTimes) -> bool:
    return a is not None and a.start_ticks == b.start_ticks


def _window_ticks(first: Snapshot, last: Snapshot, pids: set[int], *, own: bool = False) -> dict[int, int]:
    """Each of ``pids``' CPU ticks within the window (all its ticks when it started within it), with its
    reaped children's unless ``own``."""
    out = {}
    for pid in pids:
        p = last.procs.get(pid)
        if p is None:
            continue
        before = first.procs.get(pid)
        ticks = (lambda q: q.own_ticks) if own else (lambda q: q.ticks)
        out[pid] = ticks(p) - (ticks(before) if _same(before, p) else 0)
    return out


def _ended_in_parents(first: Snapshot, last: Snapshot, ours_first: set[int], ours_last: set[int]) -> int:
    """Ticks to take off the parents' ``cutime``: what each process of ours that ended within the window had
    used before it (its parent, ours too, was charged its whole life when it reaped it)."""
    gone = 0
    for pid in ours_first:
        p = first.procs[pid]
        if _same(last.procs.get(pid), p):
            continue
        if p.ppid in ours_first | ours_last:
            gone += p.ticks
    return gone


@dataclass(frozen=True)
class OutsideLoad:
    """``metadata.host_other`` of a run record, as :func:`between` gives it: this machine's CPU outside the
    testbed's processes during the transfer. ``top`` stays as written: pid, comm and cpu_pct of each."""

    other_busy_pct: float | None
    other_cpus: float | None
    testbed_pct: float | None
    process_busy_pct: float | None
    softirq_pct: float | None
    steal_pct: float | None
    window_s: float
    cpus: int
    ticks: int
    other_ticks: int
    testbed_ticks: int
    testbed_processes: int
    top: list[dict]


def between(first: Snapshot, last: Snapshot, ours: Ours) -> dict:
    """The CPU used outside the testbed between two snapshots, as recorded (``metadata.host_other``): the
    share of all CPUs (``other_busy_pct``), in CPUs (``other_cpus``), the testbed's own share
    (``testbed_pct``), the host's process busy share, softirq and steal, the ticks they rest on, and the
    busiest processes outside the testbed (``top``: pid, name, % of one CPU, their own threads' time: a
    shell's reaped children, which may have run before the window, are not added to it)."""
    d = {k: last.cpu.ticks["cpu"].get(k, 0) - first.cpu.ticks["cpu"].get(k, 0) for k in last.cpu.ticks["cpu"]}
    total = sum(d.values())
    cpus = sum(1 for name in last.cpu.ticks if name != "cpu")
    process_busy = sum(d[k] for k in PROCESS_FIELDS)
    ours_first, ours_last = ours.pids(first), ours.pids(last)
    mine = _window_ticks(first, last, ours_first | ours_last)
    ours_ticks = sum(mine.values()) - _ended_in_parents(first, last, ours_first, ours_last)
    other = process_busy - ours_ticks
    others = _window_ticks(first, last, set(last.procs) - ours_first - ours_last, own=True)
    per_cpu_ticks = total / cpus if cpus else 0

    def pct(ticks: float) -> float | None:
        return round(100.0 * ticks / total, 2) if total > 0 else None

    top = sorted(((t, pid) for pid, t in others.items() if t > 0), reverse=True)[:TOP]
    return {"other_busy_pct": None if total <= 0 else max(0.0, pct(other)),
            "other_cpus": round(max(0, other) / per_cpu_ticks, 3) if per_cpu_ticks else None,
            "testbed_pct": pct(ours_ticks), "process_busy_pct": pct(process_busy),
            "softirq_pct": pct(d.get("softirq", 0) + d.get("irq", 0)), "steal_pct": pct(d.get("steal", 0)),
            "window_s": round(last.at_s - first.at_s, 3), "cpus": cpus, "ticks": total,
            "other_ticks": other, "testbed_ticks": ours_ticks,
            "testbed_processes": len(ours_first | ours_last),
            "top": [{"pid": pid, "comm": last.procs[pid].comm,
                     "cpu_pct": round(100.0 * t / per_cpu_ticks, 1) if per_cpu_ticks else None}
                    for t, pid in top]}


@contextmanager
def watching(ours: Ours) -> Iterator[dict]:
    """Snapshot ``/proc`` before and after the block; the yielded dict holds :func:`between` after it (nothing
    when the block raised)."""
    first = snapshot()
    found: dict = {}
    yield found
    found.update(between(first, snapshot(), ours))


def sample_now(ours: Ours, seconds: float = 1.5) -> dict:
    """:func:`between` over the next ``seconds``: how busy the host is right now outside the testbed (for
    ``bbrlab doctor`` and a campaign's start)."""
    with watching(ours) as found:
        time.sleep(seconds)  # the measurement window itself
    return found


def of_testbed(tb) -> Ours:
    """The processes of testbed ``tb`` on this machine: its QEMU processes (a local testbed's, or a lab
    sender's QEMU when its hypervisor is this machine), its roles' network namespaces, and bbrlab's tree."""
    qemu: dict[int, int | None] = {}
    local = getattr(tb, "local", None)
    pids = [p for p in (local.qemu_pids.values() if local else []) if p]
    if not pids and tb.sender.hypervisor.is_local:
        pid = tb.sender.qemu_pid()
        pids = [pid] if pid else []
    for pid in pids:
        qemu[int(pid)] = None
    names = [getattr(role.host, "netns", "") for role in (tb.sender, tb.emulator, tb.receiver)]
    return Ours(qemu=qemu, netns_inodes=netns_inodes(n for n in names if n))
