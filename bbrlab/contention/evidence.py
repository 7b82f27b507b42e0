"""The contention part of a run record (``metadata.contention``, docs/run-record.md) as typed objects.

A :class:`ContentionRecord` says what was asked, on which host and how, the host's limits, each vCPU thread's
policy before and after the change, and the :class:`ContentionEvidence` that the policy held: each thread's
policy read back after the body and the CPU it got (:class:`ThreadEvidence`), and the policy watch's report
(:class:`WatchReport`: the deviations it saw and the stalled reservations it restarted).

``to_dict`` gives the JSON a record holds, with the keys in the order records have always had them, and
``from_dict`` reads that JSON back: ``X.from_dict(x.to_dict()) == x``. The parts whose JSON is their fields
(a deviation, the watch, the achieved share) have no such methods: :mod:`bbrlab.core.recordjson` writes and
reads them. Keys written only by later versions
(a thread's ``got_cpu``) are absent from older records and stay absent when such a record is read and written.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from bbrlab.core import recordjson
from bbrlab.scenario.scenario import Contention

from .cpustat import CfsThrottling
from .creditbalance import CreditReport
from .limits import KernelLimits
from .sched import SchedPolicy
from .threadstat import ThreadUsage


@dataclass(frozen=True)
class Deviation:
    """The watch saw thread ``tid`` under another policy than the one applied (``seen``: what it saw, or
    the error reading it) at ``at_monotonic_s`` on this machine's monotonic clock."""

    tid: int
    at_monotonic_s: float
    seen: str


@dataclass(frozen=True)
class Stall:
    """Thread ``tid`` stayed runnable without CPU for ``stalled_s`` seconds under SCHED_DEADLINE; the watch
    restarted its reservation (``restarted``), or says why it could not (``error``)."""

    tid: int
    at_monotonic_s: float
    stalled_s: float
    restarted: bool
    error: str | None = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Where nested in a typed record, read and written by :meth:`from_dict` and :meth:`to_dict`
        (:func:`bbrlab.core.recordjson.own_layout`)."""
        from bbrlab.core.recordjson import own_layout

        return own_layout(cls)

    def to_dict(self) -> dict:
        """The record's JSON of this stall (``error`` only when the restart failed)."""
        d = {"tid": self.tid, "at_monotonic_s": self.at_monotonic_s, "stalled_s": self.stalled_s,
             "restarted": self.restarted}
        if self.error is not None:
            d["error"] = self.error
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Stall:
        """A stall read from a record."""
        return cls(d["tid"], d["at_monotonic_s"], d["stalled_s"], d["restarted"], d.get("error"))


@dataclass(frozen=True)
class WatchReport:
    """What the policy watch saw while the run's body ran: ``checks`` rounds, every ``interval_s``."""

    interval_s: float
    checks: int
    deviations: list[Deviation] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)


_USAGE_KEYS = tuple(f.name for f in fields(ThreadUsage))


@dataclass(frozen=True)
class ThreadEvidence:
    """One vCPU thread after the body: its policy read back (None when the thread was ``gone``), whether
    that is the policy applied and the same thread still holds the id (``held``), the CPU it used
    (``usage``, when both snapshots were read) and whether it got any (``got_cpu``; None in records made
    before it was recorded)."""

    tid: int
    policy_after: SchedPolicy | None
    held: bool
    gone: bool = False
    usage: ThreadUsage | None = None
    got_cpu: bool | None = None

    def to_dict(self) -> dict:
        """The record's JSON of this thread: the usage's keys inline, ``gone`` and ``got_cpu`` only when known."""
        d: dict = {"tid": self.tid, "policy_after": self.policy_after.to_dict() if self.policy_after else None,
                   "held": self.held}
        if self.gone:
            d["gone"] = True
        if self.usage is not None:
            d.update(self.usage.to_dict())
        if self.got_cpu is not None:
            d["got_cpu"] = self.got_cpu
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ThreadEvidence:
        """A thread's evidence read from a record."""
        usage = ThreadUsage(**{k: d[k] for k in _USAGE_KEYS}) if "comm" in d else None
        after = d.get("policy_after")
        return cls(d["tid"], SchedPolicy.from_dict(after) if after is not None else None, d["held"],
                   d.get("gone", False), usage, d.get("got_cpu"))


#: What ``steal`` says for a sender under TCG: QEMU's TCG has no paravirtual steal clock, so the guest's
#: steal counter stays 0 whatever the host does (a 0 there would be a false number).
STEAL_UNDER_TCG = "not provided under tcg"
#: What ``steal`` says when the guest's steal counter was not read (KVM provides one; bbrlab does not read it yet).
STEAL_NOT_READ = "not read from the guest"


def steal_note(accelerator: str | None) -> str:
    """The record's ``steal`` for a sender VM run under ``accelerator`` (``kvm``, ``tcg``; None: unknown)."""
    return STEAL_UNDER_TCG if accelerator == "tcg" else STEAL_NOT_READ


@dataclass(frozen=True)
class AchievedShare:
    """What the vCPU threads really got over the body, from ``/proc/<tid>/schedstat`` deltas on the host:
    ``achieved_share_pct`` = run time / wall time per thread, averaged over the ``threads`` measured (100 = each
    vCPU thread had a whole CPU), ``wait_s`` (runnable, not running) and ``timeslices`` (times given the CPU)
    summed over them, ``wall_s`` the longest thread's wall time, and ``steal`` from the guest: a number of
    seconds, or a sentence saying why there is none (:data:`STEAL_UNDER_TCG`)."""

    achieved_share_pct: float
    wait_s: float
    timeslices: int
    wall_s: float
    threads: int
    steal: float | str = STEAL_NOT_READ

    @classmethod
    def of(cls, threads: list[ThreadEvidence], steal: float | str = STEAL_NOT_READ) -> AchievedShare | None:
        """The summary of the threads whose usage was measured on one thread throughout (None: none was)."""
        used = [t.usage for t in threads if t.usage is not None and t.usage.same_thread and t.usage.wall_s > 0]
        if not used:
            return None
        share = sum(u.cpu_share_pct for u in used) / len(used)
        return cls(round(share, 2), round(sum(u.wait_s for u in used), 6), sum(u.timeslices for u in used),
                   max(u.wall_s for u in used), len(used), steal)

@dataclass(frozen=True)
class ContentionEvidence:
    """Whether the policy held over the body (``policy_held``), thread by thread, what the watch saw
    (``watch``: None when nothing was watched, as for a 100 % share) and what the vCPU threads got
    (``achieved``: None in records made before it was recorded; their threads still have ``cpu_share_pct``) and,
    for the credit model, what its controller did (``credit``); and what else limited the vCPU threads' CPU
    besides what the run asked for (``foreign_limits``: a stale quota, burst or bbrlab cgroup; None: not
    looked at, as for a hypervisor on another host or records made before it was); for the cgroup models, how
    often the quota bound (``throttling``: the cgroup's ``cpu.stat`` deltas over the body; None for the other
    models, where it could not be read, and in records made before it was)."""

    method: str
    policy_held: bool
    configured_share_pct: float
    threads: list[ThreadEvidence] = field(default_factory=list)
    watch: WatchReport | None = None
    achieved: AchievedShare | None = None
    credit: CreditReport | None = None
    foreign_limits: list[str] | None = None
    throttling: CfsThrottling | None = None

    @property
    def stalls(self) -> list[Stall]:
        """The stalled reservations the watch restarted (none when nothing was watched)."""
        return self.watch.stalls if self.watch is not None else []

    def to_dict(self) -> dict:
        """The record's JSON of the evidence (``contention.evidence``)."""
        d = {"method": self.method, "policy_held": self.policy_held,
             "configured_share_pct": self.configured_share_pct, "threads": [t.to_dict() for t in self.threads],
             "watch": recordjson.to_json(self.watch) if self.watch is not None else None}
        if self.achieved is not None:
            d["achieved"] = recordjson.to_json(self.achieved)
        if self.credit is not None:
            d["credit"] = self.credit.to_dict()
        if self.foreign_limits is not None:
            d["foreign_limits"] = list(self.foreign_limits)
        if self.throttling is not None:
            d["throttling"] = recordjson.to_json(self.throttling)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ContentionEvidence:
        """Evidence read from a record (see :func:`evidence_from_dict` for one that may be missing)."""
        watch, achieved, credit, throttling = d.get("watch"), d.get("achieved"), d.get("credit"), d.get("throttling")
        return cls(d["method"], d["policy_held"], d["configured_share_pct"],
                   [ThreadEvidence.from_dict(t) for t in d["threads"]],
                   recordjson.from_json(WatchReport, watch) if watch is not None else None,
                   recordjson.from_json(AchievedShare, achieved) if achieved is not None else None,
                   CreditReport.from_dict(credit) if credit is not None else None,
                   d.get("foreign_limits"),
                   recordjson.from_json(CfsThrottling, throttling) if throttling is not None else None)


@dataclass(frozen=True)
class EvidenceMissing:
    """The evidence could not be collected after the body (``error`` says why): the run cannot count."""

    error: str

    def to_dict(self) -> dict:
        """The record's JSON: ``{"error": ...}`` in place of the evidence."""
        return {"error": self.error}


def evidence_from_dict(d: dict | None) -> ContentionEvidence | EvidenceMissing | None:
    """``contention.evidence`` of a record, typed: the evidence, why it is missing, or None."""
    if d is None:
        return None
    if "error" in d:
        return EvidenceMissing(d["error"])
    return ContentionEvidence.from_dict(d)


def _policy_rows(policies: dict[int, SchedPolicy]) -> list[dict]:
    return [{"tid": tid, **p.to_dict()} for tid, p in policies.items()]


def _policies(rows: list[dict]) -> dict[int, SchedPolicy]:
    return {r["tid"]: SchedPolicy.from_dict({k: v for k, v in r.items() if k != "tid"}) for r in rows}


@dataclass(frozen=True)
class ContentionRecord:
    """``metadata.contention`` of a run record: the contention ``requested``, the ``host`` and ``method``
    that applied it, the host's ``kernel_limits``, every thread's policy before (``previous``) and as read back
    after applying it (``applied``, by thread id), and the ``evidence`` that it held."""

    requested: Contention
    host: str
    method: str
    kernel_limits: KernelLimits | None
    previous: dict[int, SchedPolicy]
    applied: dict[int, SchedPolicy]
    evidence: ContentionEvidence | EvidenceMissing | None
    #: What a model other than deadline set up, as read back (cfs-quota: its cgroup, quota and period;
    #: competing-load: its threads); None for deadline, and absent from the JSON then.
    applied_model: dict | None = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Where nested in a typed record, read and written by :meth:`from_dict` and :meth:`to_dict`
        (:func:`bbrlab.core.recordjson.own_layout`)."""
        from bbrlab.core.recordjson import own_layout

        return own_layout(cls)

    def to_dict(self) -> dict:
        """The record's JSON (the policies as lists of rows with their thread id)."""
        d = {
            "requested": self.requested.to_dict(),
            "host": self.host,
            "method": self.method,
            "kernel_limits": self.kernel_limits.to_dict() if self.kernel_limits else None,
            "previous": _policy_rows(self.previous),
            "applied": _policy_rows(self.applied),
            "evidence": self.evidence.to_dict() if self.evidence is not None else None,
        }
        if self.applied_model is not None:
            d["applied_model"] = self.applied_model
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ContentionRecord:
        """A contention record read from a run record's ``metadata.contention`` (without ``after_failure``,
        which the run adds: :class:`bbrlab.run.runmeta.RunMetadata`)."""
        limits = d.get("kernel_limits")
        return cls(Contention.from_dict(d["requested"]), d["host"], d["method"],
                   KernelLimits.from_dict(limits) if limits is not None else None,
                   _policies(d["previous"]), _policies(d["applied"]), evidence_from_dict(d.get("evidence")),
                   d.get("applied_model"))
