"""The hand-given vCPU thread ids of a testbed file (``roles.sender.vcpu.thread_ids``): each a bare thread id
or ``{tid, comm, pid, start_ticks}``, checked as the file is read. Pinning them to the threads that hold them
is :func:`bbrlab.contention.vcpu.pin_given_threads`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bbrlab.core.errors import ValidationError


class HeldBy(Protocol):
    """What a thread id's holder is compared on (:class:`bbrlab.contention.threadstat.ThreadIdentity` has it)."""

    comm: str
    pid: int
    start_ticks: int


@dataclass(frozen=True)
class GivenThread:
    """One hand-given vCPU thread: its id, and what the testbed file says it must be (None: pinned at the
    first load)."""

    tid: int
    comm: str | None = None
    pid: int | None = None
    start_ticks: int | None = None

    def to_file(self) -> int | dict:
        """The form the testbed file takes: a bare id when nothing else is given."""
        extra = {k: v for k, v in (("comm", self.comm), ("pid", self.pid), ("start_ticks", self.start_ticks))
                 if v is not None}
        return {"tid": self.tid, **extra} if extra else self.tid

    def differences(self, now: HeldBy) -> list[str]:
        """Where the thread holding the id ``now`` contradicts the file."""
        return [f"{name} {getattr(now, name)!r} (the file says {want!r})"
                for name, want in (("comm", self.comm), ("pid", self.pid), ("start_ticks", self.start_ticks))
                if want is not None and getattr(now, name) != want]


GIVEN_FIELDS = ("tid", "comm", "pid", "start_ticks")


def _positive(where: str, value: object, allowed: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(where, value, allowed)
    return value


def parse_given_threads(entries: object, field: str) -> list[GivenThread]:
    """Validate ``thread_ids`` of a testbed file: each entry a thread id or ``{tid, comm, pid, start_ticks}``."""
    if not isinstance(entries, list) or not entries:
        raise ValidationError(field, entries, "a non-empty list of thread ids (or {tid, comm, pid, start_ticks})")
    out = []
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, dict):
            out.append(GivenThread(_positive(where, entry, "a positive thread id (see /proc/<pid>/task)")))
            continue
        for key in entry:
            if key not in GIVEN_FIELDS:
                raise ValidationError(f"{where}.{key}", entry[key], f"a known field: {', '.join(GIVEN_FIELDS)}")
        if "tid" not in entry:
            raise ValidationError(f"{where}.tid", None, "required: the thread id")
        comm = entry.get("comm")
        if comm is not None and (not isinstance(comm, str) or not comm or len(comm) > 15 or "\n" in comm):
            raise ValidationError(f"{where}.comm", comm, "the thread's name as /proc/<tid>/comm shows it "
                                  "(1-15 characters)")
        out.append(GivenThread(
            tid=_positive(f"{where}.tid", entry["tid"], "a positive thread id"), comm=comm,
            pid=_positive(f"{where}.pid", entry["pid"], "a positive process id") if "pid" in entry else None,
            start_ticks=(_positive(f"{where}.start_ticks", entry["start_ticks"], "a positive start time in clock "
                                   "ticks (field 22 of /proc/<tid>/stat)") if "start_ticks" in entry else None)))
    tids = [g.tid for g in out]
    if len(set(tids)) != len(tids):
        raise ValidationError(field, tids, "distinct thread ids (each listed once)")
    return out
