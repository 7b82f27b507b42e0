"""SCHED_DEADLINE on real QEMU vCPU threads of this machine: apply, read back, evidence, restore.

Each test starts its own tiny QEMU (no disk, TCG, QMP socket) and finds the vCPU threads with
``query-cpus-fast``; the end-to-end test at the bottom uses the shared local testbed instead.
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

from bbrlab.contention.accounting import kernel_total, recount
from bbrlab.contention.deadline import ContentionSession, contended, show_policies
from bbrlab.contention.limits import read_kernel_limits
from bbrlab.contention.sched import (
    DeadlineAdmissionError,
    SchedPolicy,
    ThreadGoneError,
    sched_getattr,
    sched_setattr,
)
from bbrlab.contention.vcpu import qmp_vcpu_threads
from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.scenario import Contention
from tests.polling import wait_for

pytestmark = pytest.mark.system

OTHER = SchedPolicy("SCHED_OTHER")


class TinyQemu:
    """A QEMU with ``vcpus`` vCPU threads and nothing else; killed by :meth:`stop`."""

    def __init__(self, tmp_path: Path, vcpus: int = 1):
        self.qmp = str(tmp_path / "qmp.sock")
        self.proc = subprocess.Popen(
            ["qemu-system-x86_64", "-name", "bbrlab-test,debug-threads=on", "-display", "none", "-nodefaults",
             "-qmp", f"unix:{self.qmp},server=on,wait=off", "-m", "64", "-smp", str(vcpus)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:  # a start that fails (no QMP in time, a thread missing) must not leave the QEMU running
            self.threads = wait_for(self._threads, "QEMU's QMP socket", 30.0)
            assert len(self.threads) == vcpus
        except BaseException:
            self.stop()
            raise

    def _threads(self):
        if self.proc.poll() is not None:
            pytest.fail(f"QEMU exited: {self.proc.stderr.read().decode()}")
        if not os.path.exists(self.qmp):
            return None
        return qmp_vcpu_threads(self.qmp)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def qemu(tmp_path):
    vm = TinyQemu(tmp_path)
    yield vm
    vm.stop()


@pytest.fixture
def qemu2(tmp_path):
    vm = TinyQemu(tmp_path, vcpus=2)
    yield vm
    vm.stop()


def _policy_in_proc(tid: int) -> int:
    """The policy number the kernel shows in /proc/<tid>/sched (independent of sched_getattr)."""
    for line in Path(f"/proc/{tid}/sched").read_text().splitlines():
        if line.startswith("policy"):
            return int(line.split(":")[1])
    raise AssertionError(f"no policy line for {tid}")


@pytest.mark.parametrize("method", ["syscall", "chrt"])
@pytest.mark.parametrize("timeslice_ms,share_pct,period_ns", [(1, 25, 4_000_000), (10, 50, 20_000_000)])
def test_applied_read_back_and_restored(qemu, method, timeslice_ms, share_pct, period_ns):
    # method=chrt is the remote path (argv through Host.run); run through LocalHost it is real chrt here.
    tid = qemu.threads[0]
    with contended(LocalHost(), [tid], Contention(timeslice_ms, share_pct), method=method) as c:
        want = SchedPolicy.deadline(timeslice_ms * 1_000_000, timeslice_ms * 1_000_000, period_ns)
        assert c.applied[tid] == want
        assert sched_getattr(tid) == want
        assert _policy_in_proc(tid) == 6
    assert sched_getattr(tid).same_policy_as(OTHER) and _policy_in_proc(tid) == 0
    record = c.record()
    assert record.applied[tid].period_ns == period_ns and record.method == method
    assert record.evidence.policy_held is True
    assert record.evidence.threads[0].usage.comm == "CPU 0/TCG"
    assert json.loads(json.dumps(record.to_dict()))["applied"][0]["period_ns"] == period_ns  # record.json's form


def test_restored_after_an_exception_including_nice(qemu):
    tid = qemu.threads[0]
    os.setpriority(os.PRIO_PROCESS, tid, 7)  # a previous policy that is not the default
    with pytest.raises(RuntimeError, match="boom"):
        with contended(LocalHost(), [tid], Contention(1, 25), method="chrt"):
            assert sched_getattr(tid).is_deadline
            raise RuntimeError("boom")
    assert sched_getattr(tid).same_policy_as(SchedPolicy("SCHED_OTHER", nice=7))


_CONTROLLER = """
import signal, sys
from bbrlab.contention.deadline import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.scenario import Contention
with contended(LocalHost(), [int(sys.argv[1])], Contention(10, 50)):
    print("applied", flush=True)
    while True:
        signal.pause()
"""


@pytest.mark.parametrize("sig,returncode", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_restored_when_the_controlling_process_is_signalled(qemu, sig, returncode):
    tid = qemu.threads[0]
    ctl = subprocess.Popen([sys.executable, "-c", _CONTROLLER, str(tid)], stdout=subprocess.PIPE, text=True)
    try:
        assert ctl.stdout.readline().strip() == "applied"
        assert sched_getattr(tid) == SchedPolicy.deadline(10_000_000, 10_000_000, 20_000_000)
        ctl.send_signal(sig)
        assert ctl.wait(timeout=30) == returncode
    finally:
        if ctl.poll() is None:
            ctl.kill()
    assert sched_getattr(tid).same_policy_as(OTHER)


def test_bad_values_are_refused_before_anything_changes(qemu):
    tid = qemu.threads[0]
    for kwargs, field in [({"timeslice_ms": 0, "cpu_share_pct": 25}, "contention.timeslice_ms"),
                          ({"timeslice_ms": 1, "cpu_share_pct": 0}, "contention.cpu_share_pct"),
                          ({"timeslice_ms": 1, "cpu_share_pct": 150}, "contention.cpu_share_pct"),
                          ({"timeslice_ms": 1000, "cpu_share_pct": 10}, "contention.cpu_share_pct")]:
        with pytest.raises(ValidationError) as e:
            Contention.from_dict(kwargs)
        assert e.value.field == field
        assert "<=" in e.value.allowed or "period" in e.value.allowed
    with pytest.raises(ValidationError, match="thread_ids"):
        with contended(LocalHost(), [tid, tid], Contention(1, 25)):
            pass
    assert sched_getattr(tid).same_policy_as(OTHER)


def test_more_bandwidth_than_the_host_allows_is_refused_before_applying(tmp_path):
    # Three vCPUs at a share that together exceed sched_rt_runtime_us x CPUs of this host.
    limits = read_kernel_limits(LocalHost())
    share_pct = round(100 * limits.capacity_cpus / 3 + 1, 1)
    assert share_pct < 100, "this test needs a host with fewer than ~3 CPUs of deadline capacity"
    vm = TinyQemu(tmp_path, vcpus=3)
    try:
        with pytest.raises(ValidationError) as e:
            with contended(LocalHost(), vm.threads, Contention(10, share_pct)):
                pass
        assert "per thread for 3 thread(s)" in str(e.value) and "sched_rt_runtime_us" in str(e.value)
        assert all(sched_getattr(t).same_policy_as(OTHER) for t in vm.threads)
    finally:
        vm.stop()


HOG_PERIOD_NS = 10_000_000
HOG_PERIOD_S = HOG_PERIOD_NS / 1e9


class DeadlineHogs:
    """Sleeping processes that hold deadline bandwidth, 10 % each, until admission control says no."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def fill(self, max_count: int = 64) -> None:
        for _ in range(max_count):
            p = subprocess.Popen(["sleep", "600"])
            self.procs.append(p)
            try:
                sched_setattr(p.pid, SchedPolicy.deadline(1_000_000, HOG_PERIOD_NS, HOG_PERIOD_NS))
            except DeadlineAdmissionError:
                assert len(self.procs) > 4, f"only {len(self.procs) - 1} x 10 % admitted: {kernel_total(LocalHost())}"
                return
        pytest.fail(f"admission control admitted {max_count} x 10 %: is sched_rt_runtime_us -1?")

    def release(self, count: int) -> None:
        """Kill ``count`` hogs (freeing 10 % each); the last, refused one is always the first to go."""
        for _ in range(count):
            p = self.procs.pop()
            p.kill()
            p.wait()

    def settle(self) -> None:
        """Have the kernel count again once the killed hogs' bandwidth has surely been handed back.

        A killed hog wakes, runs under SCHED_DEADLINE and dies; the kernel returns its bandwidth at the hog's
        0-lag time (its "inactive timer"), which is at most one period (10 ms) after that wakeup. Measured on
        this host's 6.18 kernel, with the vCPUs admitted straight after the kills, the count sometimes came out
        20-30 % below what the threads that exist hold (3 of 10 tries): room for both 25 % vCPUs. Recounting
        after the timers have fired makes the free bandwidth what the test arranges."""
        time.sleep(2 * HOG_PERIOD_S)  # past every killed hog's 0-lag time (<= one period): a kernel bound, not a guess
        recount(LocalHost())

    def release_all(self):
        self.release(len(self.procs))


@pytest.fixture
def hogs():
    # The kernel's running count of admitted bandwidth drifts on this host (bbrlab.contention.accounting):
    # filling measures what is free by that count, so it is recounted first.
    recount(LocalHost())
    h = DeadlineHogs()
    yield h
    h.release_all()


def test_admission_refusal_is_explained_and_nothing_is_left_changed(qemu2, hogs):
    hogs.fill()  # less than 10 % of deadline bandwidth is now free on this host
    hogs.release(1 + 3)  # the refused one, then 3 x 10 %: room for one 25 % vCPU, not for two
    hogs.settle()
    with pytest.raises(DeadlineAdmissionError) as e:
        with contended(LocalHost(), qemu2.threads, Contention(1, 25)):
            pytest.fail("the body must not run when admission fails")
    message = str(e.value)
    assert e.value.errno == 16 and e.value.tid == qemu2.threads[1]
    assert "Asked 25.0 % per thread for 2 thread(s)" in message
    assert "1 already admitted" in message and "Other SCHED_DEADLINE threads hold" in message
    assert f"sched_rt_runtime_us {read_kernel_limits(LocalHost()).rt_runtime_us}" in message
    # the first vCPU had been admitted; it must be back to what it was
    assert all(sched_getattr(t).same_policy_as(OTHER) for t in qemu2.threads)


def test_a_vanished_thread_is_reported_before_and_tolerated_during(tmp_path):
    vm = TinyQemu(tmp_path)
    tid = vm.threads[0]
    with contended(LocalHost(), [tid], Contention(10, 50)) as c:
        vm.stop()  # the VM goes away during the run
    assert c.evidence.policy_held is False and c.evidence.threads[0].gone is True
    with pytest.raises(ThreadGoneError, match="no such thread"):
        with contended(LocalHost(), [tid], Contention(10, 50)):
            pass


@pytest.fixture
def busy_loop():
    p = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    yield p.pid
    p.kill()
    p.wait()


def test_evidence_shows_the_cap_and_notices_a_policy_change(busy_loop):
    with contended(LocalHost(), [busy_loop], Contention(10, 50), watch_interval_s=0.2) as c:
        wait_for(lambda: c._watch.checks >= 2, "two policy checks", 30.0)
    t = c.evidence.threads[0]
    assert c.evidence.policy_held is True and t.held is True and t.usage.same_thread is True
    assert 0 < t.usage.cpu_s <= t.usage.wall_s * 0.5 * 1.1 + 0.01  # a busy loop is held to about half a CPU
    assert c.evidence.watch.checks >= 3 and c.evidence.watch.deviations == []

    with contended(LocalHost(), [busy_loop], Contention(10, 50), watch_interval_s=0.2) as c:
        sched_setattr(busy_loop, OTHER)  # someone else changes the policy mid-run
    assert c.evidence.policy_held is False and c.evidence.threads[0].held is False
    assert "SCHED_OTHER" in c.evidence.watch.deviations[0].seen


def test_a_leftover_policy_makes_every_run_refuse(qemu):
    tid = qemu.threads[0]
    session = ContentionSession(LocalHost(), [tid], Contention(1, 25))
    session.apply()  # as `bbrlab contention set` does: stays after this
    try:
        with pytest.raises(Exception, match="still under SCHED_DEADLINE.*would not be uncontended"):
            with contended(LocalHost(), [tid], Contention(1, 100)):
                pass
        # a contended run would restore the leftover afterwards and so keep it for every later run
        with pytest.raises(Exception, match="still under SCHED_DEADLINE.*hand it back"):
            with contended(LocalHost(), [tid], Contention(10, 50)):
                pass
        assert sched_getattr(tid).same_policy_as(session.applied[tid])  # refused before changing anything
    finally:
        session.restore()
    with contended(LocalHost(), [tid], Contention(1, 100)) as c:
        assert c.applied[tid].same_policy_as(OTHER)
    assert c.evidence.configured_share_pct == 100.0


def _bbrlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bbrlab.cli.main", "contention", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_set_show_clear(qemu):
    tid = qemu.threads[0]
    p = _bbrlab("set", "--timeslice", "1ms", "--share", "25%", "--qmp", qemu.qmp)
    assert p.returncode == 0, p.stderr
    assert "stays until" in p.stdout
    assert sched_getattr(tid) == SchedPolicy.deadline(1_000_000, 1_000_000, 4_000_000)  # still set
    shown = json.loads(_bbrlab("show", "--pid", str(qemu.proc.pid), "--json").stdout)
    assert shown["threads"][0]["tid"] == tid and shown["threads"][0]["period_ns"] == 4_000_000
    p = _bbrlab("clear", "--threads", str(tid), "--method", "chrt")
    assert p.returncode == 0 and str(tid) in p.stdout
    assert sched_getattr(tid).same_policy_as(OTHER)
    bad = _bbrlab("set", "--timeslice", "1ms", "--share", "0%", "--qmp", qemu.qmp)
    assert bad.returncode == 1 and "cpu_share_pct" in bad.stderr and "0 < cpu_share_pct <= 100" in bad.stderr
    assert sched_getattr(tid).same_policy_as(OTHER)


# -- end to end on the shared local testbed ------------------------------------------------------------

def _iperf_mbit(testbed, seconds: int) -> float:
    """Receiver-side throughput of one iperf3 run from the sender VM to the receiver."""
    rx, tx = testbed.receiver.host, testbed.sender.host
    rx.run(["iperf3", "-s", "-1", "-D"], timeout=30)
    ip = testbed.receiver.experiment_ip

    def client():
        res = tx.run(["iperf3", "-c", ip, "-t", str(seconds), "-J"], check=False, timeout=seconds + 60)
        return res if res.ok else None  # the daemon may not listen yet: poll for it

    res = wait_for(client, "iperf3 to connect to the receiver", deadline_s=seconds + 90)
    return json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6


@pytest.mark.testbed
def test_ten_percent_share_sends_less_than_no_contention(testbed):
    hypervisor, threads = testbed.sender.hypervisor, testbed.sender.vcpu_threads()
    free_mbit = _iperf_mbit(testbed, 10)
    with contended(hypervisor, threads, Contention(timeslice_ms=10, cpu_share_pct=10)) as c:
        contended_mbit = _iperf_mbit(testbed, 10)
    print(f"iperf3 10 s: {free_mbit:.1f} Mbit/s at 100 %, {contended_mbit:.1f} Mbit/s at 10 % "
          f"(vCPU used {[t.usage.cpu_share_pct if t.usage else None for t in c.evidence.threads]} %)")
    assert c.evidence.policy_held is True
    assert contended_mbit < free_mbit
    after = show_policies(hypervisor, threads)
    assert all(p.same_policy_as(c.previous[t]) for t, p in after.items())


@pytest.mark.testbed
def test_remote_chrt_path_over_ssh_inside_the_sender_vm(testbed):
    # The sender VM is a real SSH host: its own threads take SCHED_DEADLINE through chrt over fabric,
    # exactly as a lab's hypervisor host would.
    # A 5 % reservation: after the suite's contended runs the sender guest's kernel has refused 50 % with EBUSY
    # although no deadline task was left in it (its deadline bandwidth accounting, not bbrlab's; the note of
    # issue 28 has it). What this test is about is the chrt path over SSH, which any admitted share exercises.
    guest = testbed.sender.host
    pid = guest.spawn(["sleep", "600"], "/tmp/bbrlab-contention-test.log")
    try:
        with contended(guest, [pid], Contention(1, 5)) as c:
            assert c.scheduler.name == "chrt"
            assert "runtime/deadline/period parameters: 1000000/1000000/20000000" in guest.output(
                ["chrt", "-p", str(pid)])
        assert "SCHED_OTHER" in guest.output(["chrt", "-p", str(pid)])
        assert c.evidence.policy_held is True and c.record().kernel_limits.online_cpus >= 1
        with pytest.raises(ThreadGoneError):
            show_policies(guest, [999_999])
    finally:
        guest.run(["kill", str(pid)], check=False)
