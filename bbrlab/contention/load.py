"""competing-load contention: busy threads beside each vCPU thread on one CPU, shared under the fair scheduler.

For a share s, each vCPU thread is pinned (``sched_setaffinity``) to a CPU of its own, the last ones it may use,
and n = (100 - s) / s busy loops rounded half up (:func:`bbrlab.scenario.contention_models.load_threads`) are started
and pinned there with it. With equal weights the vCPU thread gets 1 / (n + 1) of that CPU when it is busy: 25 %
-> 3 loops (25 %), 40 % -> 2 loops (33 %); the record says the n used and the share it gives. Each loop is a
``sh`` in a session of its own, so with autogroup scheduling each is one group of the same weight as the vCPU's.
The loops are killed and the vCPU threads' CPU masks given back on every exit; this works on this machine only.

Before it pins anything the session writes a ledger entry (:mod:`bbrlab.contention.ledger`: its owner's pid,
start time and boot, each vCPU thread with its start time and CPU mask before, and a random token), and each
loop's ``$0`` is ``bbrlab-load:<token>`` (:func:`marker`). After a SIGKILL of its owner :func:`clear_leftovers`
reads the entries whose owner is gone, kills the loops of this user that carry the entry's token, gives each
thread the entry names (the same thread: same start time) its CPU mask back, and removes the entry. A command
line alone directs nothing: a loop forged by another user is neither killed nor believed. While the body runs,
the state watch checks that every loop still runs and each vCPU thread and its loops are still pinned to their
CPU (:meth:`LoadSession.deviations`).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.core import owners
from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.scenario.contention_models import load_share_pct
from bbrlab.scenario.cpumodels import competing_load
from bbrlab.scenario.scenario import Contention

from . import cgroups, ledger
from .deadline import ContentionRestoreError
from .evidence import AchievedShare, ContentionEvidence, ContentionRecord, ThreadEvidence, steal_note
from .sched import SchedPolicy
from .schedulers import scheduler_for
from .threadstat import ThreadSample, sample_threads, usage_between
from .watch import StateWatch

BUSY_LOOP = ["sh", "-c", "while :; do :; done"]
MARKER_PREFIX = "bbrlab-load:"


def marker(token: str) -> str:
    """A loop's ``$0``: the token of its session's ledger entry."""
    return f"{MARKER_PREFIX}{token}"


@dataclass(frozen=True)
class PinnedThread:
    """A vCPU thread a session pins: its ``tid``, start time (``ticks``) and CPU ``mask`` before."""

    tid: int
    ticks: int | None
    mask: frozenset[int]

    def to_dict(self) -> dict:
        """What the ledger entry keeps of it."""
        return {"tid": self.tid, "ticks": self.ticks, "mask": sorted(self.mask)}

    @classmethod
    def from_dict(cls, d: dict) -> PinnedThread:
        """Read back from an entry (:class:`ValueError`/:class:`TypeError` for anything else)."""
        ticks = d["ticks"]
        if ticks is not None and not isinstance(ticks, int) or not isinstance(d["tid"], int) or \
                not all(isinstance(c, int) and c >= 0 for c in d["mask"]) or not d["mask"]:
            raise ValueError(f"not a pinned thread: {d!r}")
        return cls(d["tid"], ticks, frozenset(d["mask"]))

    def same_thread(self) -> bool:
        """Whether ``tid`` still names the thread that was pinned (same start time)."""
        return self.ticks is not None and owners.start_ticks(self.tid) == self.ticks


@dataclass(frozen=True)
class LeftoverLoad:
    """What a competing-load session whose owner is gone left: its ledger ``entry``, the busy ``loops`` of
    this user carrying the entry's token, and the ``threads`` it pinned."""

    entry: ledger.Entry
    loops: list[int]
    threads: list[PinnedThread]


def _loops_with(token: str, proc: Path) -> list[int]:
    """The busy loops of this user whose command line is the loop with ``token``'s marker."""
    want = [a.encode() for a in [*BUSY_LOOP, marker(token)]]
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:4] == want and ledger.ours(int(entry.name)):
            found.append(int(entry.name))
    return found


def leftovers(proc: Path = Path("/proc"), *, include_live_owners: bool = False) -> list[LeftoverLoad]:
    """What competing-load sessions whose owner is gone left on this machine, read from their ledger entries
    (or every session's, ``include_live_owners``). Entries that cannot be read as a load's are skipped."""
    found = []
    for entry in ledger.left("load", include_live_owners=include_live_owners).entries:
        try:
            token = entry.data["token"]
            if not isinstance(token, str) or not token.isalnum():
                raise ValueError(token)
            threads = [PinnedThread.from_dict(t) for t in entry.data["threads"]]
        except (KeyError, TypeError, ValueError):
            continue
        found.append(LeftoverLoad(entry, _loops_with(token, proc), threads))
    return found


#: How long :func:`clear_leftovers` waits for the loops it killed to be gone (SIGKILL acts at once; their
#: new parent, init, reaps them when it gets to it) [s].
KILL_WAIT_S = 5.0


def _dead(pid: int) -> bool:
    """No process ``pid`` any more, or only its zombie (it runs no more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _wait_dead(pids: list[int]) -> list[int]:
    """Wait until every process is dead (at most :data:`KILL_WAIT_S`); the pids of those still running."""
    deadline = time.monotonic() + KILL_WAIT_S
    running = list(pids)
    while running:
        running = [pid for pid in running if not _dead(pid)]
        if not running or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return running


def _give_back(thread: PinnedThread) -> str | None:
    """Give ``thread`` its CPU mask back when it is still the thread pinned and still on one CPU, as the
    session left it; what went wrong, or None."""
    try:
        if thread.same_thread() and len(os.sched_getaffinity(thread.tid)) == 1:
            os.sched_setaffinity(thread.tid, thread.mask)
    except ProcessLookupError:
        pass
    except OSError as e:
        return f"thread {thread.tid}: could not give back CPUs {sorted(thread.mask)}: {e}"
    return None


def clear_leftovers() -> list[int]:
    """Kill the busy loops a killed bbrlab process left and give each vCPU thread they competed with its CPU mask
    back, as its ledger entry says; the loops' pids. An entry is removed once all it names is undone."""
    found = leftovers()
    problems = []
    for left in found:
        for pid in left.loops:
            try:
                os.killpg(pid, signal.SIGKILL)  # each loop leads a session (and group) of its own
            except ProcessLookupError:
                pass
        mine = [f"busy loop {pid} still runs {KILL_WAIT_S:g} s after SIGKILL" for pid in _wait_dead(left.loops)]
        mine += [p for p in map(_give_back, left.threads) if p]
        if not mine:
            ledger.drop(left.entry)
        problems += mine
    if problems:
        raise TestbedError("leftover competing-load: " + "; ".join(problems))
    return sorted(pid for left in found for pid in left.loops)


class LoadRestoreError(ContentionRestoreError):
    """A busy loop could not be stopped or a CPU mask not given back (the message says which)."""


@dataclass
class LoadSession:
    """competing-load on ``thread_ids`` of ``host`` (this machine), with the steps of the other sessions."""

    host: Host
    thread_ids: list[int]
    contention: Contention
    accelerator: str | None = None
    masks: dict[int, set[int]] = field(default_factory=dict)
    cpus: dict[int, int] = field(default_factory=dict)
    previous: dict[int, SchedPolicy] = field(default_factory=dict)
    loops: list[subprocess.Popen] = field(default_factory=list)
    evidence: ContentionEvidence | None = None
    _pinned: list[int] = field(default_factory=list)
    _start: dict[int, ThreadSample] = field(default_factory=dict)
    _watch: StateWatch | None = None
    _loop_cpus: dict[int, int] = field(default_factory=dict)
    _entry: ledger.Entry | None = None

    #: The model this session applies (:data:`bbrlab.contention.models.SESSIONS` is filled from it).
    MODELS = (competing_load.MODEL.name,)

    def __post_init__(self):
        model = getattr(self.contention, "model", self.contention)
        if not isinstance(self.contention, Contention) or model not in self.MODELS:
            raise ValidationError("contention.model", model, " or ".join(self.MODELS) + " for a LoadSession")
        if not self.host.is_local:
            raise ValidationError("contention.model", model, "deadline for a VM on another host "
                                  "(competing-load starts its loops on this machine only, for now)")
        self.thread_ids = [int(t) for t in self.thread_ids]
        self.scheduler = scheduler_for(self.host)

    def prepare(self) -> None:
        """Read each thread's CPU mask and policy and choose its CPU; changes nothing."""
        try:
            self.masks = {tid: set(os.sched_getaffinity(tid)) for tid in self.thread_ids}
        except OSError as e:
            raise TestbedError(f"cannot read a thread's CPU mask ({e}); nothing was changed") from e
        self.previous = {tid: self.scheduler.get(tid) for tid in self.thread_ids}
        allowed = sorted(set.intersection(*self.masks.values()))
        if len(allowed) < len(self.thread_ids):
            raise ValidationError("contention.model", self.contention.model, f"a CPU for each of the {len(self.thread_ids)} "
                                  f"vCPU thread(s); they may run on {allowed} only")
        self.cpus = {tid: allowed[-(i + 1)] for i, tid in enumerate(self.thread_ids)}

    def apply(self) -> None:
        """Pin each thread to its CPU and start its loops there; on a failure undo it all."""
        if not self.cpus:
            self.prepare()
        token = secrets.token_hex(16)
        threads = [PinnedThread(tid, owners.start_ticks(tid), frozenset(self.masks[tid])) for tid in self.cpus]
        self._entry = ledger.write("load", {"token": token, "threads": [t.to_dict() for t in threads]})
        try:
            for tid, cpu in self.cpus.items():
                self._pinned.append(tid)
                os.sched_setaffinity(tid, {cpu})
                for _ in range(self.contention.load_threads):
                    loop = subprocess.Popen([*BUSY_LOOP, marker(token)],
                                            start_new_session=True, stdin=subprocess.DEVNULL)
                    self.loops.append(loop)
                    os.sched_setaffinity(loop.pid, {cpu})
                    self._loop_cpus[loop.pid] = cpu
        except BaseException as e:
            try:
                self.restore()
            except LoadRestoreError as r:
                e.add_note(str(r))
            raise
        self._start = sample_threads(self.host, self.thread_ids)

    def deviations(self) -> list[tuple[int, str]]:
        """``(tid, what is seen)`` for a vCPU thread no longer pinned to its CPU, and (tid 0) a loop that stopped
        or left its CPU: the watch's check. Empty: the load holds."""
        seen = []
        for tid, cpu in self.cpus.items():
            try:
                mask = os.sched_getaffinity(tid)
            except OSError as e:
                seen.append((tid, f"cannot read its CPU mask: {e.strerror or e}"))
                continue
            if mask != {cpu}:
                seen.append((tid, f"may run on CPUs {sorted(mask)}, pinned to {cpu}"))
        for loop in self.loops:
            if loop.poll() is not None:
                seen.append((0, f"busy loop {loop.pid} ended (exit status {loop.returncode})"))
                continue
            try:
                mask = os.sched_getaffinity(loop.pid)
            except OSError:
                continue  # ended between the two looks: the next round says so
            if mask != {self._loop_cpus[loop.pid]}:
                seen.append((0, f"busy loop {loop.pid} may run on CPUs {sorted(mask)}, pinned to "
                                f"{self._loop_cpus[loop.pid]}"))
        return seen

    def start_watch(self, interval_s: float | None) -> None:
        """Run :meth:`deviations` every ``interval_s`` until :meth:`finish` (None, or no loops: don't)."""
        if interval_s is None or not self.loops:
            return
        self._watch = StateWatch(self.deviations, interval_s)
        self._watch.start()

    def stop_watch(self):
        """Stop the watch (if one runs) and return its report."""
        watch, self._watch = self._watch, None
        return watch.stop() if watch is not None else None

    def finish(self) -> ContentionEvidence:
        """Whether the loops still ran and the pins held (now and as the watch saw it), and the CPU each vCPU
        thread used since :meth:`apply`."""
        watch = self.stop_watch()
        loops_alive = all(p.poll() is None for p in self.loops) and not (watch and watch.deviations)
        end = sample_threads(self.host, self.thread_ids)
        threads = []
        for tid in self.thread_ids:
            try:
                pinned = os.sched_getaffinity(tid) == {self.cpus[tid]}
            except OSError:
                threads.append(ThreadEvidence(tid, None, False, True))
                continue
            usage = usage_between(self._start[tid], end[tid]) if tid in self._start and tid in end else None
            same = usage is not None and usage.same_thread
            threads.append(ThreadEvidence(tid, self.scheduler.get(tid), pinned and loops_alive and same, False, usage,
                                          got_cpu=same and usage.cpu_s > 0))
        self.evidence = ContentionEvidence(self.contention.model, all(t.held for t in threads),
                                           load_share_pct(self.contention.load_threads), threads, watch,
                                           AchievedShare.of(threads, steal_note(self.accelerator)),
                                           foreign_limits=cgroups.foreign_limits(self.thread_ids))
        return self.evidence

    def restore(self) -> None:
        """Kill every loop and give every pinned thread its CPU mask back. Safe to call more than once."""
        self.stop_watch()
        problems = []
        for loop in list(self.loops):
            try:
                os.killpg(loop.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            loop.wait()
            self.loops.remove(loop)
        for tid in list(self._pinned):
            try:
                os.sched_setaffinity(tid, self.masks[tid])
            except ProcessLookupError:
                pass
            except OSError as e:
                problems.append(f"thread {tid}: could not give back CPUs {sorted(self.masks[tid])}: {e}")
                continue
            self._pinned.remove(tid)
        if problems:
            raise LoadRestoreError(f"{self.contention.model}: " + "; ".join(problems))
        if self._entry is not None:
            ledger.drop(self._entry)
            self._entry = None

    @property
    def unrestored(self) -> list[int]:
        """Threads still pinned by this session."""
        return list(self._pinned)

    def record(self) -> ContentionRecord:
        """The ``metadata.contention`` part of a run record; ``applied_model`` holds the loops and CPUs."""
        n = self.contention.load_threads
        return ContentionRecord(self.contention, self.host.name, self.contention.model, None, dict(self.previous),
                                dict(self.previous), self.evidence,
                                {"load_threads_per_vcpu": n, "share_given_pct": round(load_share_pct(n), 2),
                                 "cpus": {str(t): c for t, c in self.cpus.items()}, "loop": " ".join(BUSY_LOOP)})
