"""Restoring never forgets a thread, and a failed run leaves no deadline policy to its next attempt.

Real threads of this machine under real SCHED_DEADLINE. What makes a restore fail is real too where the
kernel can do it (a thread that exited; a previous policy the kernel refuses with EINVAL); only the
previous policy the session holds is altered to provoke that, since a thread's real previous policy is one
the kernel accepted a moment ago.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.contention.deadline import ContentionRestoreError, ContentionSession, contended
from bbrlab.contention.sched import SchedPolicy, sched_getattr
from bbrlab.core.errors import RunFailed
from bbrlab.core.hosts import LocalHost
from bbrlab.run.runner import Runner
from bbrlab.scenario.scenario import Contention
from bbrlab.testbed import file as tbfile
from bbrlab.testbed.roles import from_spec

pytestmark = pytest.mark.system

OTHER = SchedPolicy("SCHED_OTHER")
#: A previous policy the kernel refuses (SCHED_FIFO priorities end at 99): its restore fails with EINVAL.
REFUSED = SchedPolicy("SCHED_FIFO", priority=100)


def _policy_in_proc(tid: int) -> int:
    """The policy number the kernel shows in /proc/<tid>/sched (independent of sched_getattr)."""
    for line in Path(f"/proc/{tid}/sched").read_text().splitlines():
        if line.startswith("policy"):
            return int(line.split(":")[1])
    raise AssertionError(f"no policy line for {tid}")


@pytest.fixture
def busy():
    """Start busy loops (each one thread); every one is killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(n: int) -> list[subprocess.Popen]:
        new = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
        procs.extend(new)
        return new
    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_thread_that_fails_to_restore_stays_listed_and_the_others_are_restored(busy):
    a, b, c = busy(3)
    session = ContentionSession(LocalHost(), [a.pid, b.pid, c.pid], Contention(10, 20))
    session.apply()
    assert all(_policy_in_proc(p.pid) == 6 for p in (a, b, c))
    session.previous[b.pid] = REFUSED  # the kernel will refuse to give b this back
    c.kill()
    c.wait()  # c exited: nothing left to restore there
    with pytest.raises(ContentionRestoreError, match=rf"1 thread\(s\).*thread {b.pid}: .*EINVAL"):
        session.restore()
    assert _policy_in_proc(a.pid) == 0 and sched_getattr(a.pid).same_policy_as(OTHER)
    assert _policy_in_proc(b.pid) == 6  # still under the run's policy ...
    assert session.unrestored == [b.pid]  # ... and still listed, so a later restore gets it
    session.previous[b.pid] = OTHER
    session.restore()
    assert _policy_in_proc(b.pid) == 0 and session.unrestored == []


def test_a_failure_that_is_not_the_kernels_does_not_stop_the_others(busy):
    """An error of any kind on one thread (here bbrlab's own refusal of an unknown policy) is collected;
    the threads after it are still restored."""
    a, b = busy(2)
    session = ContentionSession(LocalHost(), [a.pid, b.pid], Contention(10, 20))
    session.apply()
    session.previous[b.pid] = SchedPolicy("SCHED_BOGUS")  # restored first: the last one changed
    with pytest.raises(ContentionRestoreError, match=rf"thread {b.pid}: unknown scheduling policy"):
        session.restore()
    assert _policy_in_proc(a.pid) == 0 and _policy_in_proc(b.pid) == 6
    assert session.unrestored == [b.pid]
    session.previous[b.pid] = OTHER
    session.restore()
    assert _policy_in_proc(b.pid) == 0


class RunWhoseRestoreFails(Runner):
    """The run recipe replaced by its contention step alone (no VMs: the vCPU is a local busy loop), whose
    first attempt cannot restore the vCPU's policy. ``Runner.__call__`` (its failure path) is the real one."""

    found: list[int]

    def run(self, scenario, out, meta, *, ports):
        tb = self.testbed
        (tid,) = vcpus = tb.sender.vcpu_threads()
        self.found.append(_policy_in_proc(tid))  # the policy this attempt finds
        with contended(tb.sender.hypervisor, vcpus, scenario.contention, expected=tb.sender.vcpu_pins()) as held:
            if len(self.found) == 1:
                held.previous[tid] = REFUSED
                raise RunFailed("the transfer failed")
        meta.contention = held.record()


def test_a_failed_run_leaves_no_deadline_policy_for_the_next_attempt(busy, tmp_path, monkeypatch):
    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path / "state"))
    # The lab's hosts are placeholders (TEST-NET addresses nothing answers): only the vCPU thread, on this
    # machine, is real. A run checks it holds the lab hosts' locks (test_hostlock_ssh.py tests that for real);
    # here there is no host to hold one on, so the check stands aside.
    monkeypatch.setattr("bbrlab.run.runner.hostlock.check_held", lambda tb, directory=None: False)
    (vcpu,) = busy(1)
    lab = tmp_path / "lab.yaml"
    lab.write_text(yaml.safe_dump({"name": "lab", "roles": {
        "sender": {"address": "192.0.2.10", "experiment_ip": "10.0.0.1", "vcpu": {"thread_ids": [vcpu.pid]}},
        "emulator": {"address": "192.0.2.11"}, "receiver": {"address": "192.0.2.12", "experiment_ip": "10.0.0.2"}}}))
    runner = RunWhoseRestoreFails(from_spec(tbfile.load_file(lab)))
    runner.found = []
    spec = CampaignSpec.from_dict({"name": "restore", "ccas": ["cubic"], "timeslices_ms": [10], "cpu_shares_pct": [50],
                                   "rtts_ms": [20], "rates_mbit": [50], "repetitions": 1, "duration_s": 5,
                                   "max_attempts": 2})  # one run; its recipe is the contention step alone
    (scenario,) = spec.plan()
    out = tmp_path / "campaign"
    made = []
    campaign.run_campaign(spec, out, runner, options=CampaignOptions(progress=False), on_run=made.append)
    (record,) = made

    first = yaml.safe_load((out / "failed" / f"{scenario.run_id}.a1" / "record.json").read_text())
    assert first["status"] == "failed" and "could not restore" in first["reason"]
    assert "after the run failed: RunFailed: the transfer failed" in first["reason"]  # its cause is kept
    assert first["metadata"]["contention"]["after_failure"] == {"deadline_cleared_tids": [vcpu.pid]}
    assert runner.found == [0, 0]  # the second attempt found the vCPU under SCHED_OTHER (policy 0)
    assert record["status"] == "ok" and record["attempt"] == 2
    assert _policy_in_proc(vcpu.pid) == 0
