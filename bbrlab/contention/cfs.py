"""cfs-quota contention: the sender's vCPU threads in a cgroup of their own under CFS bandwidth control,
quota = share x period (docs/contention.md), with the same discipline as SCHED_DEADLINE's session: check before
changing anything, apply and read back, restore on every exit, record what was asked and what was read back,
and what the threads really got (``/proc/<tid>/schedstat``).

All threads share the one cgroup, so the quota is ``n_threads x share x period``: each vCPU thread may use its
share on average, as with deadline, but one busy thread may borrow what idle ones leave. The cgroup machinery
(v1 or v2, detected) is :mod:`bbrlab.contention.cgroups`; this module works on this machine only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.core.errors import BbrlabError, TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.core.scenario import Contention

from . import cgroups
from .evidence import AchievedShare, ContentionEvidence, ContentionRecord, ThreadEvidence, steal_note
from .sched import SchedPolicy
from .schedulers import scheduler_for
from .threadstat import ThreadSample, read_identities, sample_threads, usage_between


class CfsRestoreError(BbrlabError):
    """A thread could not be moved back, or bbrlab's cgroup could not be removed (the message says which)."""


@dataclass
class CfsSession:
    """cfs-quota on ``thread_ids`` of ``host`` (this machine): :meth:`prepare`, :meth:`apply`, :meth:`finish`,
    :meth:`restore`, :meth:`record`, as :class:`~bbrlab.contention.deadline.ContentionSession`."""

    host: Host
    thread_ids: list[int]
    contention: Contention
    accelerator: str | None = None
    hierarchy: cgroups.Hierarchy | None = None
    original: dict[int, Path] = field(default_factory=dict)
    previous: dict[int, SchedPolicy] = field(default_factory=dict)
    own: cgroups.OwnCgroup | None = None
    read_back: dict | None = None
    evidence: ContentionEvidence | None = None
    _start: dict[int, ThreadSample] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.contention, Contention) or self.contention.model != "cfs-quota":
            raise ValidationError("contention.model", getattr(self.contention, "model", self.contention),
                                  "cfs-quota for a CfsSession")
        if not self.host.is_local:
            raise ValidationError("contention.model", "cfs-quota", "deadline for a VM on another host (cfs-quota "
                                  "moves threads between cgroups of this machine only, for now)")
        self.thread_ids = [int(t) for t in self.thread_ids]
        if not self.thread_ids or len(set(self.thread_ids)) != len(self.thread_ids):
            raise ValidationError("thread_ids", self.thread_ids, "distinct thread ids (each listed once)")
        self.scheduler = scheduler_for(self.host)

    @property
    def period_us(self) -> int:
        """The CFS period asked for [us]."""
        return int(round(self.contention.period_ms * 1000))

    @property
    def quota_us(self) -> int:
        """The cgroup's quota: share x period for each thread [us]."""
        return int(round(self.period_us * self.contention.cpu_share_pct / 100 * len(self.thread_ids)))

    def prepare(self) -> None:
        """Find the cpu hierarchy and each thread's cgroup and policy; changes nothing."""
        self.hierarchy = cgroups.detect()
        missing = set(self.thread_ids) - set(read_identities(self.host, self.thread_ids))
        if missing:
            raise TestbedError(f"thread(s) {sorted(missing)} do not exist; nothing was changed")
        self.original = {tid: self.hierarchy.thread_cgroup(tid) for tid in self.thread_ids}
        if len(set(self.original.values())) != 1:
            raise TestbedError(f"the threads are in different cpu cgroups ({sorted(map(str, self.original.values()))}); "
                               "cfs-quota puts them in one cgroup of their own")
        self.previous = {tid: self.scheduler.get(tid) for tid in self.thread_ids}
        if any(p.is_deadline for p in self.previous.values()):
            raise TestbedError("a thread is under SCHED_DEADLINE (a leftover?): run `bbrlab contention clear` first")

    def apply(self) -> None:
        """Make the cgroup, set and read back its limit, move the threads in; on a failure undo it all."""
        if self.hierarchy is None:
            self.prepare()
        if not self.contention.unlimited:
            try:
                self.own = cgroups.create(self.hierarchy, next(iter(self.original.values())))
                self.hierarchy.set_limit(self.own.path, self.quota_us, self.period_us)
                quota, period = self.hierarchy.limit(self.own.path)
                if (quota, period) != (self.quota_us, self.period_us):
                    raise TestbedError(f"{self.own.path} reads back quota {quota} us / period {period} us after "
                                       f"setting {self.quota_us} / {self.period_us}")
                for tid in self.thread_ids:
                    self.hierarchy.move(tid, self.own.path)
                self.read_back = {"quota_us": quota, "period_us": period, **self.own.to_dict()}
            except BaseException as e:
                try:
                    self.restore()
                except CfsRestoreError as r:
                    e.add_note(str(r))
                raise
        self._start = sample_threads(self.host, self.thread_ids)

    def held(self) -> bool:
        """Whether every thread is still in bbrlab's cgroup under the limit read back."""
        if self.own is None:
            return True
        members = set(self.hierarchy.members(self.own.path))
        try:
            limit = self.hierarchy.limit(self.own.path)
        except OSError:
            return False
        return set(self.thread_ids) <= members and limit == (self.quota_us, self.period_us)

    def finish(self) -> ContentionEvidence:
        """Whether the limit held, and the CPU each thread used since :meth:`apply`."""
        held = self.held()
        end = sample_threads(self.host, self.thread_ids)
        threads = []
        for tid in self.thread_ids:
            if tid in self._start and tid in end:
                usage = usage_between(self._start[tid], end[tid])
                threads.append(ThreadEvidence(tid, self.scheduler.get(tid), held and usage.same_thread, False, usage,
                                              got_cpu=usage.same_thread and usage.cpu_s > 0))
            else:
                threads.append(ThreadEvidence(tid, None, False, True))
        self.evidence = ContentionEvidence(self.method, held and all(t.held for t in threads),
                                           100.0 if self.contention.unlimited else self.contention.cpu_share_pct,
                                           threads, None, AchievedShare.of(threads, steal_note(self.accelerator)))
        return self.evidence

    @property
    def method(self) -> str:
        """``cgroup-v1`` or ``cgroup-v2`` (the hierarchy found), ``cgroup`` before :meth:`prepare`."""
        return self.hierarchy.name if self.hierarchy else "cgroup"

    def restore(self) -> None:
        """Every thread back into its original cgroup, bbrlab's cgroup removed. Safe to call more than once."""
        if self.own is None:
            return
        problems = cgroups.remove(self.own, self.original)
        if problems:
            raise CfsRestoreError("cfs-quota: " + "; ".join(problems))
        self.own = None

    @property
    def unrestored(self) -> list[int]:
        """Threads still in bbrlab's cgroup."""
        return [] if self.own is None else [t for t in self.hierarchy.members(self.own.path) if t in self.thread_ids]

    def record(self) -> ContentionRecord:
        """The ``metadata.contention`` part of a run record; ``applied_model`` holds the cgroup read back."""
        return ContentionRecord(self.contention, self.host.name, self.method, None, dict(self.previous),
                                dict(self.previous), self.evidence, self.read_back)

