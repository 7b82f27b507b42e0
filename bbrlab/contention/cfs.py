"""cfs-quota and cfs-burst contention: the sender's vCPU threads in a cgroup of their own under CFS bandwidth
control, quota = share x period (docs/contention.md), and for cfs-burst a burst too, with the same discipline as
SCHED_DEADLINE's session: check before changing anything, apply and read back, watch during the run, restore on
every exit, record what was asked and what was read back, and what the threads really got
(``/proc/<tid>/schedstat``), and how often the quota bound: the cgroup's ``cpu.stat`` counters (periods,
throttled periods, throttled time) read when the threads went in and again after the body
(``evidence.throttling``, :mod:`bbrlab.contention.cpustat`).

All threads share the one cgroup, so the quota is ``n_threads x share x period`` (the burst likewise): each vCPU
thread may use its share on average, as with deadline, but one busy thread may borrow what idle ones leave.
The cgroup machinery (v1 or v2, detected) is :mod:`bbrlab.contention.cgroups`; the credit model
(:mod:`bbrlab.contention.credit`) is this session with a controller that moves the quota; this module works on
this machine only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.scenario.cpumodels import cfs_burst, cfs_quota
from bbrlab.scenario.scenario import Contention

from . import cgroups, cpustat
from .deadline import ContentionRestoreError
from .evidence import (
    AchievedShare,
    ContentionEvidence,
    ContentionRecord,
    ThreadEvidence,
    WatchReport,
    steal_note,
)
from .sched import SchedPolicy
from .schedulers import scheduler_for
from .threadstat import ThreadSample, read_identities, sample_threads, usage_between
from .watch import StateWatch


class CfsRestoreError(ContentionRestoreError):
    """A thread could not be moved back, or bbrlab's cgroup could not be removed (the message says which)."""


@dataclass
class CfsSession:
    """cfs-quota or cfs-burst on ``thread_ids`` of ``host`` (this machine): :meth:`prepare`, :meth:`apply`,
    :meth:`start_watch`, :meth:`finish`, :meth:`restore`, :meth:`record`, as
    :class:`~bbrlab.contention.deadline.ContentionSession`."""

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
    _stat_start: cpustat.CpuStat | None = None
    _watch: StateWatch | None = None

    #: The models this session applies (:data:`bbrlab.contention.models.SESSIONS` is filled from it).
    MODELS = (cfs_quota.MODEL.name, cfs_burst.MODEL.name)

    def __post_init__(self):
        model = getattr(self.contention, "model", self.contention)
        if not isinstance(self.contention, Contention) or model not in self.MODELS:
            raise ValidationError("contention.model", model, " or ".join(self.MODELS) + f" for a {type(self).__name__}")
        if not self.host.is_local:
            raise ValidationError("contention.model", model, f"deadline for a VM on another host ({model} moves "
                                  "threads between cgroups of this machine only, for now)")
        self.thread_ids = [int(t) for t in self.thread_ids]
        if not self.thread_ids or len(set(self.thread_ids)) != len(self.thread_ids):
            raise ValidationError("thread_ids", self.thread_ids, "distinct thread ids (each listed once)")
        self.scheduler = scheduler_for(self.host)

    @property
    def period_us(self) -> int:
        """The CFS period asked for [us]."""
        return int(round(self.contention.params.period_ms * 1000))

    @property
    def quota_us(self) -> int:
        """The cgroup's quota: share x period for each thread [us]."""
        return int(round(self.period_us * self.contention.cpu_share_pct / 100 * len(self.thread_ids)))

    @property
    def burst_us(self) -> int:
        """cfs-burst's burst for the cgroup: ``burst_ms`` for each thread [us]; 0 for the other models."""
        burst_ms = getattr(self.contention.params, "burst_ms", 0)
        return int(round(burst_ms * 1000 * len(self.thread_ids)))

    def initial_quota_us(self) -> int | None:
        """The quota the cgroup is made with (None: no limit)."""
        return self.quota_us

    def expected_limit(self) -> tuple[int | None, int]:
        """``(quota_us, period_us)`` the cgroup must have now."""
        return self.quota_us, self.period_us

    def prepare(self) -> None:
        """Find the cpu hierarchy, each thread's cgroup and policy, and (cfs-burst) that the kernel offers a
        burst; changes nothing."""
        self.hierarchy = cgroups.detect()
        missing = set(self.thread_ids) - set(read_identities(self.host, self.thread_ids))
        if missing:
            raise TestbedError(f"thread(s) {sorted(missing)} do not exist; nothing was changed")
        self.original = {tid: self.hierarchy.thread_cgroup(tid) for tid in self.thread_ids}
        if len(set(self.original.values())) != 1:
            raise TestbedError(f"the threads are in different cpu cgroups ({sorted(map(str, self.original.values()))}); "
                               f"{self.contention.model} puts them in one cgroup of their own")
        self.previous = {tid: self.scheduler.get(tid) for tid in self.thread_ids}
        if any(p.is_deadline for p in self.previous.values()):
            raise TestbedError("a thread is under SCHED_DEADLINE (a leftover?): run `bbrlab contention clear` first")
        parent = next(iter(self.original.values()))
        if self.burst_us and self.hierarchy.version == 1 and not self.hierarchy.burst_file(parent).exists():
            raise TestbedError(f"this kernel has no {self.hierarchy.burst_file(parent).name} (CFS burst came with "
                               "Linux 5.14): cfs-burst cannot be applied; nothing was changed")

    def apply(self) -> None:
        """Make the cgroup, set and read back its limit, move the threads in; on a failure undo it all."""
        if self.hierarchy is None:
            self.prepare()
        if not self.contention.unlimited:
            try:
                self.own = cgroups.create(self.hierarchy, next(iter(self.original.values())))
                self.read_back = self._set_and_read_back(self.own.path)
                for tid in self.thread_ids:
                    self.hierarchy.move(tid, self.own.path)
            except BaseException as e:
                try:
                    self.restore()
                except CfsRestoreError as r:
                    e.add_note(str(r))
                raise
        self._stat_start = self.hierarchy.cpu_stat(self.stat_cgroup)
        self._start = sample_threads(self.host, self.thread_ids)
        self.started()

    @property
    def stat_cgroup(self) -> Path:
        """The cgroup whose ``cpu.stat`` the evidence's ``throttling`` reads: bbrlab's own, or the threads' own
        cgroup when no quota was applied (a 100 % share)."""
        return self.own.path if self.own is not None else next(iter(self.original.values()))

    def _set_and_read_back(self, path: Path) -> dict:
        h, quota_us = self.hierarchy, self.initial_quota_us()
        h.set_limit(path, quota_us, self.period_us)
        if self.burst_us:
            if not h.burst_file(path).exists():
                raise TestbedError(f"{path} has no {h.burst_file(path).name} (CFS burst came with Linux 5.14): "
                                   "cfs-burst cannot be applied")
            h.set_burst(path, self.burst_us)
        quota, period = h.limit(path)
        if (quota, period) != (quota_us, self.period_us):
            raise TestbedError(f"{path} reads back quota {quota} us / period {period} us after setting "
                               f"{quota_us} / {self.period_us}")
        got = {"quota_us": quota, "period_us": period}
        if self.burst_us:
            got["burst_us"] = h.burst(path)
            if got["burst_us"] != self.burst_us:
                raise TestbedError(f"{path} reads back burst {got['burst_us']} us after setting {self.burst_us}")
        return {**got, **self.own.to_dict()}

    def started(self) -> None:
        """Called once the threads are under the contention (the credit model starts its controller here)."""

    def deviations(self) -> list[tuple[int, str]]:
        """``(tid, what is seen)`` for each thread out of bbrlab's cgroup and for a limit not the one asked
        (tid 0): the watch's check. Empty: the contention holds."""
        if self.own is None:
            return []
        h = self.hierarchy
        members = set(h.members(self.own.path))
        seen = [(tid, f"not in {self.own.path}") for tid in self.thread_ids if tid not in members]
        try:
            limit, want = h.limit(self.own.path), self.expected_limit()
            burst = h.burst(self.own.path) if self.burst_us else 0
        except OSError as e:
            return [*seen, (0, f"cannot read the limit of {self.own.path}: {e.strerror or e}")]
        if limit != want:
            seen.append((0, f"quota {limit[0]} us / period {limit[1]} us, asked {want[0]} / {want[1]}"))
        if burst != self.burst_us:
            seen.append((0, f"burst {burst} us, asked {self.burst_us}"))
        return seen

    def held(self) -> bool:
        """Whether every thread is still in bbrlab's cgroup under the limit asked."""
        return not self.deviations()

    def start_watch(self, interval_s: float | None) -> None:
        """Run :meth:`deviations` every ``interval_s`` until :meth:`finish` (None, or nothing applied: don't)."""
        if interval_s is None or self.own is None:
            return
        self._watch = StateWatch(self.deviations, interval_s)
        self._watch.start()

    def stop_watch(self) -> WatchReport | None:
        """Stop the watch (if one runs) and return its report."""
        watch, self._watch = self._watch, None
        return watch.stop() if watch is not None else None

    def finish(self) -> ContentionEvidence:
        """Whether the limit held (now and as the watch saw it), and the CPU each thread used since :meth:`apply`."""
        watch = self.stop_watch()
        held = self.held() and not (watch and watch.deviations)
        stat_end = self.hierarchy.cpu_stat(self.stat_cgroup)
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
                                           threads, watch, AchievedShare.of(threads, steal_note(self.accelerator)),
                                           foreign_limits=cgroups.foreign_limits(
                                               self.thread_ids, self.own.path if self.own else None, self.hierarchy),
                                           throttling=cpustat.between(self._stat_start, stat_end, str(self.stat_cgroup)))
        return self.evidence

    @property
    def method(self) -> str:
        """``cgroup-v1`` or ``cgroup-v2`` (the hierarchy found), ``cgroup`` before :meth:`prepare`."""
        return self.hierarchy.name if self.hierarchy else "cgroup"

    def restore(self) -> None:
        """Every thread back into its original cgroup, bbrlab's cgroup removed. Safe to call more than once."""
        self.stop_watch()
        if self.own is None:
            return
        problems = cgroups.remove(self.own, self.original)
        if problems:
            raise CfsRestoreError(f"{self.contention.model}: " + "; ".join(problems))
        self.own = None

    @property
    def unrestored(self) -> list[int]:
        """Threads still in bbrlab's cgroup."""
        return [] if self.own is None else [t for t in self.hierarchy.members(self.own.path) if t in self.thread_ids]

    def record(self) -> ContentionRecord:
        """The ``metadata.contention`` part of a run record; ``applied_model`` holds the cgroup read back."""
        return ContentionRecord(self.contention, self.host.name, self.method, None, dict(self.previous),
                                dict(self.previous), self.evidence, self.read_back)
