"""competing-load contention: busy threads beside each vCPU thread on one CPU, shared under the fair scheduler.

For a share s, each vCPU thread is pinned (``sched_setaffinity``) to a CPU of its own, the last ones it may use,
and n = (100 - s) / s busy loops rounded half up (:func:`bbrlab.core.contention_models.load_threads`) are started
and pinned there with it. With equal weights the vCPU thread gets 1 / (n + 1) of that CPU when it is busy: 25 %
-> 3 loops (25 %), 40 % -> 2 loops (33 %); the record says the n used and the share it gives. Each loop is a
``sh`` in a session of its own, so with autogroup scheduling each is one group of the same weight as the vCPU's.
The loops are killed and the vCPU threads' CPU masks given back on every exit; this works on this machine only.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field

from bbrlab.core.contention_models import load_share_pct
from bbrlab.core.errors import BbrlabError, TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.core.scenario import Contention

from .evidence import AchievedShare, ContentionEvidence, ContentionRecord, ThreadEvidence, steal_note
from .sched import SchedPolicy
from .schedulers import scheduler_for
from .threadstat import ThreadSample, sample_threads, usage_between

BUSY_LOOP = ["sh", "-c", "while :; do :; done"]


class LoadRestoreError(BbrlabError):
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

    def __post_init__(self):
        if not isinstance(self.contention, Contention) or self.contention.model != "competing-load":
            raise ValidationError("contention.model", getattr(self.contention, "model", self.contention),
                                  "competing-load for a LoadSession")
        if not self.host.is_local:
            raise ValidationError("contention.model", "competing-load", "deadline for a VM on another host "
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
            raise ValidationError("contention.model", "competing-load", f"a CPU for each of the {len(self.thread_ids)} "
                                  f"vCPU thread(s); they may run on {allowed} only")
        self.cpus = {tid: allowed[-(i + 1)] for i, tid in enumerate(self.thread_ids)}

    def apply(self) -> None:
        """Pin each thread to its CPU and start its loops there; on a failure undo it all."""
        if not self.cpus:
            self.prepare()
        try:
            for tid, cpu in self.cpus.items():
                self._pinned.append(tid)
                os.sched_setaffinity(tid, {cpu})
                for _ in range(self.contention.load_threads):
                    loop = subprocess.Popen(BUSY_LOOP, start_new_session=True, stdin=subprocess.DEVNULL)
                    self.loops.append(loop)
                    os.sched_setaffinity(loop.pid, {cpu})
        except BaseException as e:
            try:
                self.restore()
            except LoadRestoreError as r:
                e.add_note(str(r))
            raise
        self._start = sample_threads(self.host, self.thread_ids)

    def finish(self) -> ContentionEvidence:
        """Whether the loops still ran and the pins held, and the CPU each vCPU thread used since :meth:`apply`."""
        loops_alive = all(p.poll() is None for p in self.loops)
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
        self.evidence = ContentionEvidence("competing-load", all(t.held for t in threads),
                                           load_share_pct(self.contention.load_threads), threads, None,
                                           AchievedShare.of(threads, steal_note(self.accelerator)))
        return self.evidence

    def restore(self) -> None:
        """Kill every loop and give every pinned thread its CPU mask back. Safe to call more than once."""
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
            raise LoadRestoreError("competing-load: " + "; ".join(problems))

    @property
    def unrestored(self) -> list[int]:
        """Threads still pinned by this session."""
        return list(self._pinned)

    def record(self) -> ContentionRecord:
        """The ``metadata.contention`` part of a run record; ``applied_model`` holds the loops and CPUs."""
        n = self.contention.load_threads
        return ContentionRecord(self.contention, self.host.name, "competing-load", None, dict(self.previous),
                                dict(self.previous), self.evidence,
                                {"load_threads_per_vcpu": n, "share_given_pct": round(load_share_pct(n), 2),
                                 "cpus": {str(t): c for t, c in self.cpus.items()}, "loop": " ".join(BUSY_LOOP)})
