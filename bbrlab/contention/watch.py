"""The watches: background checks, while a run's body runs, that the contention asked still holds. The policy
watch checks that each thread keeps the deadline policy applied to it and guards against a reservation the host
kernel lost (a stalled thread); the state watch runs the check of another model's session."""

from __future__ import annotations

import threading
import time

from bbrlab.core.errors import BbrlabError
from bbrlab.core.hosts import Host

from .evidence import Deviation, Stall, WatchReport
from .sched import SchedPolicy
from .threadstat import ThreadIdentity, read_proc_files, thread_state

#: Seconds a deadline thread may stay runnable without getting any CPU before the watch takes its reservation
#: for lost. Under a working scheduler a runnable SCHED_DEADLINE thread runs once per period (at most
#: 1 s: bbrlab's periods are timeslice / share), so this can only mean a replenishment the kernel lost.
STALL_AFTER_S = 2.0
#: A watch notes at most this many deviations (a thread moved out for good would otherwise fill the record).
MAX_DEVIATIONS = 20


class PolicyWatch(threading.Thread):
    """Background check that each thread keeps its applied policy; notes every deviation seen.

    With ``host`` it also guards against a stalled reservation: a host kernel can leave a SCHED_DEADLINE
    thread throttled past its deadline for good (its replenishment timer lost; seen on this project's 6.18
    host, the vCPU runnable with no CPU for minutes). A thread runnable without CPU progress for
    :data:`STALL_AFTER_S` gets its reservation restarted (SCHED_OTHER, then the applied policy again) and
    the stall is noted in ``stalls``: the run's contention did not hold as configured.
    """

    def __init__(self, scheduler, expected: dict[int, SchedPolicy], interval_s: float, host: Host | None = None,
                 identities: dict[int, ThreadIdentity] | None = None):
        super().__init__(name="bbrlab-policy-watch", daemon=True)
        self.scheduler, self.expected, self.interval_s, self.host = scheduler, expected, interval_s, host
        self.identities = identities or {}
        self.checks = 0
        self.deviations: list[Deviation] = []
        self.stalls: list[Stall] = []
        self._unchanged: dict[int, tuple[float, int]] = {}  # tid -> (since monotonic s, CPU ns) while runnable
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Check every ``interval_s`` until :meth:`stop`."""
        while not self._stop_event.wait(self.interval_s):
            self.check_once()

    def check_once(self) -> None:
        """One round: every thread's policy against the applied one, then the stall guard."""
        self.checks += 1
        for tid, want in self.expected.items():
            try:
                got = self.scheduler.get(tid)
                seen = got.describe() if not got.same_policy_as(want) else None
            except BbrlabError as e:
                seen = f"error: {e}"
            if seen and len(self.deviations) < MAX_DEVIATIONS:
                self.deviations.append(Deviation(tid, round(time.monotonic(), 3), seen))
        if self.host is not None:
            self.guard_stalls()

    def guard_stalls(self) -> None:
        """Restart the reservation of every thread runnable without CPU progress for :data:`STALL_AFTER_S`."""
        paths = [f"/proc/{tid}/{name}" for tid in self.expected for name in ("stat", "schedstat")]
        try:
            files = read_proc_files(self.host, paths)
        except BbrlabError:
            return  # the policy check above notes an unreachable host
        now = time.monotonic()
        for tid, want in self.expected.items():
            stat, schedstat = files.get(f"/proc/{tid}/stat"), files.get(f"/proc/{tid}/schedstat")
            if not stat or not schedstat:
                continue
            cpu_ns = int(schedstat.split()[0])
            since, seen_ns = self._unchanged.get(tid, (now, -1))
            if thread_state(stat) != "R" or cpu_ns != seen_ns:
                self._unchanged[tid] = (now, cpu_ns)
            elif now - since >= STALL_AFTER_S:
                self.stalls.append(self._restart(tid, want, now - since))
                self._unchanged[tid] = (time.monotonic(), cpu_ns)

    def _restart(self, tid: int, want: SchedPolicy, stalled_s: float) -> Stall:
        at = round(time.monotonic(), 3)
        try:
            self.scheduler.set(tid, SchedPolicy("SCHED_OTHER"), self.identities.get(tid))
            self.scheduler.set(tid, want, self.identities.get(tid))
        except BbrlabError as e:
            return Stall(tid, at, round(stalled_s, 1), restarted=False, error=str(e))
        return Stall(tid, at, round(stalled_s, 1), restarted=True)

    def stop(self) -> WatchReport:
        """Stop watching, check once more, and report what was seen."""
        self._stop_event.set()
        self.join()
        self.check_once()
        return WatchReport(self.interval_s, self.checks, list(self.deviations), list(self.stalls))


class StateWatch(threading.Thread):
    """The watch of the models other than deadline (cfs-quota, cfs-burst, credit, competing-load): every
    ``interval_s`` it calls ``check`` (the session's own: the cgroup still holds the threads under the limit
    asked; the busy loops still run, pinned with the vCPU threads), which returns ``(tid, what was seen)`` for
    each deviation, and notes them (at most :data:`MAX_DEVIATIONS`). Its report has the deadline watch's shape."""

    def __init__(self, check, interval_s: float):
        super().__init__(name="bbrlab-state-watch", daemon=True)
        self.check, self.interval_s = check, interval_s
        self.checks = 0
        self.deviations: list[Deviation] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Check every ``interval_s`` until :meth:`stop`."""
        while not self._stop_event.wait(self.interval_s):
            self.check_once()

    def check_once(self) -> None:
        """One round of the session's check; what it saw noted with this machine's monotonic time."""
        self.checks += 1
        try:
            seen = self.check()
        except (BbrlabError, OSError) as e:
            seen = [(0, f"error: {e}")]
        at = round(time.monotonic(), 3)
        for tid, what in seen:
            if len(self.deviations) < MAX_DEVIATIONS:
                self.deviations.append(Deviation(tid, at, what))

    def stop(self) -> WatchReport:
        """Stop watching, check once more, and report what was seen."""
        self._stop_event.set()
        if self.is_alive():
            self.join()
        self.check_once()
        return WatchReport(self.interval_s, self.checks, list(self.deviations))
