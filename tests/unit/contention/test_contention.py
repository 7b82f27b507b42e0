"""Pure parts of contention: parsing chrt, building argv, limits arithmetic, errors, signal handling."""

import errno
import os
import signal

import pytest

from bbrlab.cli.contention import parse_thread_list
from bbrlab.cli.main import build_parser
from bbrlab.contention.deadline import ContentionSession
from bbrlab.contention.limits import KernelLimits, check_fits, count_cpu_list
from bbrlab.contention.sched import (
    DeadlineAdmissionError,
    SchedParamsError,
    SchedPermissionError,
    SchedPolicy,
    ThreadGoneError,
    explain_refusal,
)
from bbrlab.contention.schedulers import chrt_set_argv, parse_chrt_show, scheduler_for
from bbrlab.contention.threadstat import ThreadSample, _parse_stat, usage_between
from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import Host
from bbrlab.core.signals import restore_on_signals
from bbrlab.scenario.scenario import Contention

LIMITS_2CPU = KernelLimits(period_min_us=100, period_max_us=4_194_304, rt_runtime_us=950_000,
                           rt_period_us=1_000_000, online_cpus=2, kernel_release="6.18")


class NoCommandsHost(Host):
    """A remote-looking host that fails the test if any command reaches it (for checks-before-change)."""

    def _execute(self, argv, *, timeout, stdin):
        raise AssertionError(f"a command ran although the input was invalid: {argv}")

    def _is_root(self):
        return True


def test_chrt_show_parsing_deadline_other_and_flags():
    dl = parse_chrt_show(
        "pid 9000's current scheduling policy: SCHED_DEADLINE\n"
        "pid 9000's current scheduling priority: 0\n"
        "pid 9000's current runtime/deadline/period parameters: 1000000/1000000/4000000\n", nice=0)
    assert dl == SchedPolicy.deadline(1_000_000, 1_000_000, 4_000_000)
    assert dl.bandwidth == pytest.approx(0.25)
    other = parse_chrt_show("pid 1's current scheduling policy: SCHED_OTHER|SCHED_RESET_ON_FORK\n"
                            "pid 1's current scheduling priority: 0\n", nice=5)
    assert other == SchedPolicy("SCHED_OTHER", nice=5, reset_on_fork=True)
    fifo = parse_chrt_show("pid 2's current scheduling policy: SCHED_FIFO\npid 2's current scheduling priority: 50\n", 0)
    assert fifo.priority == 50 and fifo.policy == "SCHED_FIFO"


def test_chrt_argv_is_a_list_per_policy():
    assert chrt_set_argv(42, SchedPolicy.deadline(1_000_000, 1_000_000, 4_000_000)) == [
        "chrt", "-d", "-T", "1000000", "-D", "1000000", "-P", "4000000", "-p", "0", "42"]
    assert chrt_set_argv(42, SchedPolicy("SCHED_OTHER", nice=3)) == ["chrt", "-o", "-p", "0", "42"]
    assert chrt_set_argv(7, SchedPolicy("SCHED_RR", priority=10, reset_on_fork=True)) == [
        "chrt", "-r", "-R", "-p", "10", "7"]


def test_same_policy_compares_what_the_class_uses():
    a = SchedPolicy("SCHED_OTHER", nice=0, runtime_ns=1_400_000)
    assert a.same_policy_as(SchedPolicy("SCHED_OTHER"))  # the fair slice is not part of the policy
    assert not a.same_policy_as(SchedPolicy("SCHED_OTHER", nice=4))
    assert not SchedPolicy.deadline(1, 2, 3).same_policy_as(SchedPolicy.deadline(1, 2, 4))
    assert "25.0 % CPU" in SchedPolicy.deadline(1_000_000, 1_000_000, 4_000_000).describe()


@pytest.mark.parametrize("cpus,n", [("0", 1), ("0-1", 2), ("0-3,6,8-9", 7)])
def test_cpu_list(cpus, n):
    assert count_cpu_list(cpus + "\n") == n


def test_check_fits_uses_the_hosts_live_limits():
    check_fits(Contention(1, 25), LIMITS_2CPU, 2)
    check_fits(Contention(10, 95), LIMITS_2CPU, 2)  # 190 % is exactly the limit
    with pytest.raises(ValidationError) as e:
        check_fits(Contention(10, 70), LIMITS_2CPU, 3)
    assert e.value.field == "contention.cpu_share_pct" and "63.3 % per thread for 3 thread(s)" in str(e.value)
    narrow = KernelLimits(1000, 10_000, 950_000, 1_000_000, 2, "6.1")
    with pytest.raises(ValidationError) as e:
        check_fits(Contention(1, 5), narrow, 1)  # period 20 ms > this host's 10 ms maximum
    assert "1000..10000 us" in str(e.value) and "20000 us" in str(e.value)
    check_fits(Contention(1, 100), narrow, 50)  # 100 % = no policy: nothing to admit
    unlimited = KernelLimits(100, 4_194_304, -1, 1_000_000, 2, "6.1")
    assert unlimited.capacity_cpus is None
    check_fits(Contention(10, 90), unlimited, 8)


@pytest.mark.parametrize("err,cls,words", [
    (errno.EBUSY, DeadlineAdmissionError, "admission control"),
    (errno.EPERM, SchedPermissionError, "every CPU of its root domain"),
    (errno.ESRCH, ThreadGoneError, "exited"),
    (errno.EINVAL, SchedParamsError, "1024 ns <= runtime <= deadline <= period"),
])
def test_refusals_are_explained(err, cls, words):
    e = explain_refusal(err, 123, SchedPolicy.deadline(1_000_000, 1_000_000, 4_000_000), "context here")
    assert isinstance(e, cls) and e.tid == 123 and e.errno == err
    assert words in str(e) and "thread 123" in str(e) and str(e).endswith("context here")


def test_usage_between_samples():
    a = ThreadSample(5, "CPU 0/TCG", 100, cpu_ns=1_000_000_000, wait_ns=0, timeslices=10, uptime_s=50.0)
    b = ThreadSample(5, "CPU 0/TCG", 100, cpu_ns=1_750_000_000, wait_ns=2_000_000_000, timeslices=210, uptime_s=53.0)
    u = usage_between(a, b)
    assert u.cpu_share_pct == pytest.approx(25.0) and u.timeslices == 200 and u.same_thread
    reused = ThreadSample(5, "sh", 999, 0, 0, 0, 53.0)
    assert not usage_between(a, reused).same_thread


def test_stat_parsing_survives_odd_thread_names():
    fields = " ".join(str(i) for i in range(3, 53))  # field n holds the number n
    assert _parse_stat(f"77 (CPU 0/TCG) ) x) {fields}\n") == ("CPU 0/TCG) ) x", 22)


def test_bad_input_is_refused_before_any_command_runs():
    host = NoCommandsHost(name="lab-hypervisor")
    with pytest.raises(ValidationError, match="thread_ids"):
        ContentionSession(host, [], Contention(1, 25))
    with pytest.raises(ValidationError, match=r"thread_ids\[1\]"):
        ContentionSession(host, [123, -4], Contention(1, 25))
    with pytest.raises(ValidationError, match="distinct"):
        ContentionSession(host, [123, 123], Contention(1, 25))
    with pytest.raises(ValidationError, match="contention"):
        ContentionSession(host, [123], {"timeslice_ms": 1, "cpu_share_pct": 25})
    with pytest.raises(ValidationError, match="chrt"):
        scheduler_for(host, "syscall")  # syscalls only reach this machine's threads
    with pytest.raises(ValidationError, match="contention.method"):
        scheduler_for(host, "schedtool")
    assert scheduler_for(host).name == "chrt"


@pytest.mark.parametrize("sig,exc", [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)])
def test_signals_restore_first_then_stop(sig, exc):
    calls = []
    before = signal.getsignal(sig)
    with pytest.raises(exc) as e:
        with restore_on_signals(lambda: calls.append("restored")):
            os.kill(os.getpid(), sig)
            signal.sigtimedwait([], 0)  # give the interpreter a point to run the handler
    assert calls == ["restored"]
    if exc is SystemExit:
        assert e.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(sig) is before  # the previous handler is back


def test_ignored_signal_stays_ignored():
    calls = []
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with restore_on_signals(lambda: calls.append("restored")):
            os.kill(os.getpid(), signal.SIGTERM)
        assert calls == []
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_cli_says_set_persists_and_parses_threads(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["contention", "set", "--help"])
    assert "stays until `bbrlab contention clear`" in capsys.readouterr().out
    assert parse_thread_list("12,13") == [12, 13]
    with pytest.raises(ValidationError, match="--threads"):
        parse_thread_list("12;13")


def test_vcpu_threads_of_a_process_without_qemu_thread_names_are_refused_naming_the_field():
    import os

    from bbrlab.contention.vcpu import named_vcpu_threads, owning_testbed

    with pytest.raises(ValidationError) as e:
        named_vcpu_threads(os.getpid(), "--pid")
    assert e.value.field == "--pid"
    assert owning_testbed(os.getpid()) is None  # pytest is no testbed's sender QEMU
