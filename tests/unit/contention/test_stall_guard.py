"""The policy watch's guard against a SCHED_DEADLINE reservation the host kernel lost.

The kernel bug itself (a throttled deadline thread whose replenishment never fires: runnable, no CPU for
minutes; seen on this project's 6.18 host) cannot be triggered on demand, so these tests stand in for the
thread's /proc files and the scheduler: they are ``mock_only`` and say so in their names.
"""

from types import SimpleNamespace

import pytest

from bbrlab.contention import watch
from bbrlab.contention.evidence import ContentionEvidence, ContentionRecord, Stall, WatchReport
from bbrlab.contention.sched import SchedPolicy
from bbrlab.core.errors import RunFailed
from bbrlab.run import checks
from bbrlab.scenario.scenario import Contention

pytestmark = pytest.mark.mock_only

DEADLINE = SchedPolicy("SCHED_DEADLINE", runtime_ns=1_000_000, deadline_ns=1_000_000, period_ns=4_000_000)


class SimulatedProc:
    """A remote host whose /proc/<tid>/stat and schedstat say what the test sets (grep -H output)."""

    is_local = False
    name = "simulated-hypervisor"

    def __init__(self, tid: int):
        self.tid, self.state, self.cpu_ns = tid, "R", 5_000_000

    def run(self, argv, check=False):
        stat = f"/proc/{self.tid}/stat:{self.tid} (CPU 0/TCG) {self.state} 1 " + " ".join(["0"] * 40)
        sched = f"/proc/{self.tid}/schedstat:{self.cpu_ns} 10 3"
        return SimpleNamespace(stdout=f"{stat}\n{sched}\n", returncode=0)


class RecordingScheduler:
    name = "simulated"

    def __init__(self):
        self.calls = []

    def get(self, tid):
        return DEADLINE

    def set(self, tid, policy, identity=None):
        self.calls.append((tid, policy.policy))


def _watch(host, scheduler, monkeypatch, clock):
    monkeypatch.setattr(watch.time, "monotonic", lambda: clock[0])
    return watch.PolicyWatch(scheduler, {host.tid: DEADLINE}, 1.0, host)


def test_simulated_runnable_thread_without_cpu_gets_its_reservation_restarted(monkeypatch):
    host, scheduler, clock = SimulatedProc(77), RecordingScheduler(), [100.0]
    watch = _watch(host, scheduler, monkeypatch, clock)
    for t in (100.0, 101.0):
        clock[0] = t
        watch.check_once()
    assert watch.stalls == [] and scheduler.calls == []  # one second without CPU is not yet a stall
    clock[0] = 102.5
    watch.check_once()
    assert scheduler.calls == [(77, "SCHED_OTHER"), (77, "SCHED_DEADLINE")]
    assert watch.stalls == [Stall(tid=77, at_monotonic_s=102.5, stalled_s=2.5, restarted=True)]


@pytest.mark.parametrize("change", ["sleeps", "runs"])
def test_simulated_idle_or_progressing_thread_is_left_alone(monkeypatch, change):
    host, scheduler, clock = SimulatedProc(78), RecordingScheduler(), [0.0]
    watch = _watch(host, scheduler, monkeypatch, clock)
    for t in range(8):
        clock[0] = float(t)
        if change == "sleeps":
            host.state = "S"  # a halted guest: its vCPU thread sleeps, its CPU time stands still
        else:
            host.cpu_ns += 250_000  # runnable and served once per period
        watch.check_once()
    assert watch.stalls == [] and scheduler.calls == []


def test_simulated_stall_fails_the_run_naming_the_thread():
    contention = Contention(timeslice_ms=1, cpu_share_pct=25)
    evidence = ContentionEvidence("simulated", policy_held=False, configured_share_pct=25, threads=[],
                                  watch=WatchReport(1.0, 140, stalls=[Stall(77, 1.0, 140.2, restarted=True)]))
    record = ContentionRecord(contention, "simulated-hypervisor", "simulated", None, {77: DEADLINE}, {77: DEADLINE},
                              evidence)
    scenario = SimpleNamespace(contention=contention)
    with pytest.raises(RunFailed, match=r"vCPU thread 77 stayed runnable without CPU for 140.2 s"):
        checks.contention_held(record, scenario)
