"""Hand-given vCPU thread ids (the VirtualBox / Xen lab path), on real threads of this machine.

The "vCPU" is a real thread: a Python process whose thread renames itself (``prctl(PR_SET_NAME)``) as a
hypervisor's vCPU thread would be named, and burns CPU. A recycled thread id is made for real: the thread
exits and ``/proc/sys/kernel/ns_last_pid`` is set so that the next process this test starts gets the same
id. The hypervisor is this machine (``hypervisor: local``) and SCHED_DEADLINE is the kernel's own; only the
sender, emulator and receiver addresses of the testbed file are never contacted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bbrlab.contention.deadline import ContentionSession, contended
from bbrlab.contention.sched import SchedPolicy, ThreadReplacedError, sched_getattr
from bbrlab.contention.vcpu import VcpuIdentityError
from bbrlab.core.errors import RunFailed, ValidationError
from bbrlab.core.hosts import LocalHost
from bbrlab.run import checks
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario
from bbrlab.testbed import file as tbfile
from bbrlab.testbed.roles import from_spec
from tests.polling import wait_for

pytestmark = pytest.mark.system

OTHER = SchedPolicy("SCHED_OTHER")
VCPU_NAME = "CPU 0/KVM"  # QEMU's name for a vCPU thread (debug-threads=on): a space and a slash

#: A process whose thread ``argv[1]`` names itself ``argv[2]``, prints its tid and burns CPU ("main": the
#: main thread itself, so the thread id is the process id).
FAKE_VCPU = r"""
import ctypes, sys, threading, time
libc = ctypes.CDLL(None)
def vcpu():
    libc.prctl(15, sys.argv[2].encode(), 0, 0, 0)
    print(threading.get_native_id(), flush=True)
    while True:
        pass
if sys.argv[1] == "main":
    vcpu()
threading.Thread(target=vcpu, daemon=True).start()
time.sleep(3600)
"""


class FakeVcpu:
    """A real thread standing in for a hypervisor's vCPU thread."""

    def __init__(self, name: str = VCPU_NAME, where: str = "thread"):
        self.proc = subprocess.Popen([sys.executable, "-c", FAKE_VCPU, where, name], stdout=subprocess.PIPE, text=True)
        self.tid = int(self.proc.stdout.readline())
        wait_for(lambda: Path(f"/proc/{self.tid}/comm").read_text().strip() == name, "the thread's name", 10.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def vcpu():
    v = FakeVcpu()
    yield v
    v.stop()


def recycle(tid: int, name: str) -> FakeVcpu:
    """A new process whose main thread gets the freed id ``tid`` (and names itself ``name``)."""
    for _ in range(50):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(tid - 1))
        new = FakeVcpu(name, where="main")
        if new.tid == tid:
            return new
        new.stop()  # another process on this machine took the id first: try again
    pytest.fail(f"could not get thread id {tid} handed out again")


def _policy_in_proc(tid: int) -> int:
    """The policy number the kernel shows in /proc/<tid>/sched (independent of sched_getattr)."""
    for line in Path(f"/proc/{tid}/sched").read_text().splitlines():
        if line.startswith("policy"):
            return int(line.split(":")[1])
    raise AssertionError(f"no policy line for {tid}")


@pytest.fixture
def lab_file(tmp_path, monkeypatch):
    """Write a lab testbed file whose sender's vCPU threads are ``thread_ids`` on this machine."""
    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path / "state"))

    def write(thread_ids: list) -> Path:
        doc = {"name": "vbox-lab", "roles": {
            "sender": {"address": "192.0.2.10", "experiment_ip": "10.0.0.1", "hypervisor": "local",
                       "vcpu": {"thread_ids": thread_ids}},
            "emulator": {"address": "192.0.2.11", "ports": {"sender_side": "eth1", "receiver_side": "eth2"}},
            "receiver": {"address": "192.0.2.12", "experiment_ip": "10.0.0.2"}}}
        path = tmp_path / "lab.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path
    return write


def _sender(path: Path):
    return from_spec(tbfile.load_file(path)).sender


def test_given_threads_are_pinned_at_first_load_and_checked_at_every_later_one(vcpu, lab_file):
    path = lab_file([{"tid": vcpu.tid, "comm": VCPU_NAME}])
    sender = _sender(path)
    assert sender.vcpu_threads() == [vcpu.tid]
    pins = json.loads(sender.pin_path.read_text())
    assert str(sender.pin_path).startswith(os.environ["BBRLAB_STATE_DIR"])
    (pin,) = pins["threads"]
    assert pin["tid"] == vcpu.tid and pin["pid"] == vcpu.proc.pid and pin["comm"] == VCPU_NAME
    assert pin["start_ticks"] == int(Path(f"/proc/{vcpu.tid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert oct(sender.pin_path.stat().st_mode & 0o777) == "0o600"
    # a later load (another process, a resumed campaign) reads the same pins and finds the same thread
    again = _sender(path)
    assert again.pin_path == sender.pin_path and again.vcpu_pins() == sender.vcpu_pins()

    # what the file says is checked too, also at the first load
    wrong = lab_file([{"tid": vcpu.tid, "comm": "EMT-0"}])
    sender.pin_path.unlink()
    with pytest.raises(VcpuIdentityError, match=r"roles.sender.vcpu.thread_ids: thread \d+ is not the vCPU thread .*"
                       r"comm 'CPU 0/KVM' \(the file says 'EMT-0'\)"):
        _sender(wrong).vcpu_threads()
    assert not sender.pin_path.exists()  # nothing pinned from a refused load


def test_a_wrong_entry_is_a_validation_error_naming_the_field(lab_file):
    for entry, where in (({"tid": 0}, r"thread_ids\[0\].tid"), ({"tid": 5, "comm": "x" * 16}, r"thread_ids\[0\].comm"),
                         ({"tid": 5, "cpu": 1}, r"thread_ids\[0\].cpu"), ({"comm": "EMT-0"}, r"thread_ids\[0\].tid"),
                         ({"tid": 5, "pid": True}, r"thread_ids\[0\].pid")):
        with pytest.raises(ValidationError, match=f"roles.sender.vcpu.{where}"):
            tbfile.load_file(lab_file([entry]))


def test_a_recycled_thread_id_never_gets_a_policy(lab_file):
    """The pinned vCPU thread exits and a new thread gets its id, with the same name and process id: only
    its start time tells them apart. The pins refuse it, and so does the check at the syscall."""
    first = FakeVcpu(VCPU_NAME, where="main")  # a leader thread, so that a recycled one has the same pid
    try:
        sender = _sender(lab_file([first.tid]))
        pins = sender.vcpu_pins()
        tid = first.tid
        first.stop()
        time.sleep(0.05)  # start times count in clock ticks (10 ms)
        second = recycle(tid, VCPU_NAME)
    finally:
        first.stop()
    try:
        assert Path(f"/proc/{tid}/comm").read_text().strip() == VCPU_NAME
        # the only difference is the start time (same pid, same name)
        with pytest.raises(VcpuIdentityError, match=r"given as: start_ticks \d+ \(pinned \d+\)\. No policy"):
            sender.vcpu_threads()
        # the pins reach the contention session too: refused before anything changes
        with pytest.raises(ThreadReplacedError, match=f"thread id {tid} no longer names the pinned"):
            with contended(LocalHost(), [tid], Contention(10, 50), expected=pins):
                pytest.fail("the body must not run")
        assert sched_getattr(tid).same_policy_as(OTHER) and _policy_in_proc(tid) == 0
    finally:
        second.stop()


@pytest.mark.parametrize("method", ["syscall", "chrt"])
def test_the_pin_is_checked_again_at_the_moment_of_the_change(vcpu, method):
    """The id is recycled between the checks before the run and the change itself (a VM stopped in
    between): the change is refused, the newcomer keeps its policy."""
    session = ContentionSession(LocalHost(), [vcpu.tid], Contention(10, 50), method=method)
    session.prepare()  # pins the thread holding the id now
    tid = vcpu.tid
    vcpu.stop()
    newcomer = recycle(tid, "bystander")
    try:
        with pytest.raises(ThreadReplacedError, match=f"thread {tid}: setting SCHED_DEADLINE .* refused"):
            session.apply()
        assert sched_getattr(tid).same_policy_as(OTHER) and _policy_in_proc(tid) == 0
        assert session.unrestored == []  # restoring found nothing of its own to restore either
    finally:
        newcomer.stop()


def _scenario(share_pct: float) -> Scenario:
    return Scenario(Link.unshaped(20), Contention(10, share_pct), Flow("cubic", IperfParams(5)))


@pytest.mark.parametrize("share_pct", [50, 100])
def test_a_vcpu_thread_without_cpu_time_fails_the_run(vcpu, lab_file, share_pct):
    sender = _sender(lab_file([vcpu.tid]))
    scenario = _scenario(share_pct)
    with contended(LocalHost(), sender.vcpu_threads(), scenario.contention, expected=sender.vcpu_pins()) as held:
        time.sleep(0.5)
    running = held.record()
    assert running.evidence.threads[0].got_cpu is True
    checks.contention_held(running, scenario)  # a thread that ran passes

    os.kill(vcpu.proc.pid, signal.SIGSTOP)  # the VM is paused: its vCPU threads get no CPU at all
    try:
        wait_for(lambda: Path(f"/proc/{vcpu.tid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T",
                 "the stopped state", 10.0)
        with contended(LocalHost(), sender.vcpu_threads(), scenario.contention, expected=sender.vcpu_pins()) as held:
            time.sleep(1.0)
    finally:
        os.kill(vcpu.proc.pid, signal.SIGCONT)
    stopped = held.record()
    (thread,) = stopped.evidence.threads
    assert thread.usage.cpu_s == 0 and thread.got_cpu is False
    with pytest.raises(RunFailed, match=rf"vCPU thread\(s\) \[{vcpu.tid}\] got no CPU time during the run"):
        checks.contention_held(stopped, scenario)
