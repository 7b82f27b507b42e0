"""The host trace of vCPU threads, for real on this machine: a QEMU whose vCPU spins (a boot sector that
loops forever), under SCHED_DEADLINE 1 ms / 25 %, traced through a tracefs instance; and the instance's
removal when its owner is ended by SIGTERM or SIGKILL (then by recovery's sweep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bbrlab.contention.deadline import contended
from bbrlab.contention.vcpu import qmp_vcpu_threads
from bbrlab.core.hosts import LocalHost
from bbrlab.run import recovery
from bbrlab.sampling import vcputrace
from bbrlab.scenario.scenario import Contention
from tests.polling import wait_for

pytestmark = pytest.mark.system


class SpinningQemu:
    """A one-vCPU QEMU booting a sector of ``cli; jmp $``: its vCPU thread is always busy."""

    def __init__(self, tmp_path: Path):
        sector = bytearray(512)
        sector[0:3], sector[510:512] = b"\xfa\xeb\xfe", b"\x55\xaa"  # cli; jmp $; boot signature
        image = tmp_path / "spin.img"
        image.write_bytes(bytes(sector))
        self.qmp = str(tmp_path / "qmp.sock")
        self.proc = subprocess.Popen(
            ["qemu-system-x86_64", "-name", "bbrlab-spin,debug-threads=on", "-display", "none", "-nodefaults",
             "-qmp", f"unix:{self.qmp},server=on,wait=off", "-m", "64", "-smp", "1",
             "-drive", f"file={image},format=raw,if=ide"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:  # a start that fails must not leave the QEMU running (one was found an hour after such a start)
            [self.tid] = wait_for(lambda: os.path.exists(self.qmp) and qmp_vcpu_threads(self.qmp), "QEMU's QMP", 30.0)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def deadline_trace(tmp_path_factory):
    """A 2 s trace of a spinning vCPU under SCHED_DEADLINE 1 ms / 25 %, and the instances before it."""
    vm = SpinningQemu(tmp_path_factory.mktemp("spin"))
    try:
        before = _instances()
        host = LocalHost()
        with contended(host, [vm.tid], Contention(1, 25)), vcputrace.traced(host, [vm.tid]) as trace:
            time.sleep(2.0)
        s = trace.result.summary()
        print({k: s[k] for k in ("on_cpu_share", "gaps", "schedstat", "reader_cpu_s", "events",
                                 "inferred_switch_ins", "host_steal_s")})
        return before, trace.result
    finally:
        vm.stop()


def _instances() -> set[str]:
    return set(os.listdir(vcputrace.INSTANCES)) if os.path.isdir(vcputrace.INSTANCES) else set()


def test_deadline_1ms_25pct_trace_shows_the_gaps_and_leaves_nothing(deadline_trace):
    before, result = deadline_trace
    s = result.summary()
    assert _instances() == before  # its instance is gone
    assert not s["capped"] and s["lost_events"] == 0 and s["reader_cpu_s"] is not None
    # Throttled after its 1 ms: off-CPU for the rest of the 4 ms period at least (the host enforces at its
    # 4 ms tick, so some gaps are longer), the thread still runnable (R), not asleep.
    gaps = [iv for iv in result.intervals if not iv.on and not iv.clipped]
    # How many gaps the trace shows depends on the host: 2 s hold 500 periods of 4 ms; this machine showed
    # 100 to 200 gaps with a median of 3 ms, a CI machine 86 with a median of 8.8 ms (switch-ins the trace lost
    # merge gaps). Either way the thread is off-CPU for a large part of the 2 s, in gaps of more than 2.5 ms.
    assert s["gaps"]["count"] >= 40 and s["gaps"]["p50_ms"] >= 2.5
    off_s = sum(iv.end_ns - iv.start_ns for iv in gaps) / 1e9
    assert off_s >= 0.25 * 2.0, off_s
    assert sum(iv.left_state.startswith("R") for iv in gaps) >= 0.9 * len(gaps)


def test_deadline_1ms_25pct_trace_matches_schedstat_within_2_percent(deadline_trace):
    # This host's kernel records no switch-in from CPU 1's idle task; the deadline timer moves the vCPU thread
    # between the CPUs, so about half its switch-ins are missing and are dated by the first runtime the scheduler
    # accounted to the thread after them (docs/vcpu-trace.md). Without that, the trace overstated by 32-154 %.
    _, result = deadline_trace
    [cmp] = result.schedstat
    assert abs(cmp["relative_diff"]) <= 0.02, cmp  # the criterion
    assert result.summary()["inferred_switch_ins"]["bound"] <= 2
    # From switch to switch the trace also holds the scheduler's own work at each of the ~500 switches (a few to
    # ~30 us each), so it is above schedstat, never below what the accounting boundaries give. Measured here
    # (20 fixtures each): +0.6 to +2.5 % on an idle host, +0.3 to +1.5 % beside three busy loops; a CI run
    # +2.9 %. The bound leaves room above that spread; past it the switch dating would be wrong, not noisy.
    assert cmp["relative_diff"] - 1e-4 <= cmp["relative_diff_switch"] <= 0.05, cmp
    assert 0.10 < result.summary()["on_cpu_share"] <= 0.27  # at most the 25 % asked


_CHILD = """
import sys, time
from bbrlab.core.hosts import LocalHost
from bbrlab.sampling import vcputrace
with vcputrace.traced(LocalHost(), [int(sys.argv[1])]) as t:
    print(t.name, flush=True)
    time.sleep(60)
"""


def _traced_child(tid: int) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tid)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    name = child.stdout.readline().strip()
    assert name in _instances()
    return child, name


def test_sigterm_removes_the_instance():
    child, name = _traced_child(os.getpid())
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    assert name not in _instances()


def _private_dirs() -> set[str]:
    return {str(p) for p in Path(tempfile.gettempdir()).glob("bbrlab-vcputrace.*")}


def test_recovery_removes_a_killed_owners_instance_and_its_reader():
    before = _private_dirs()
    child, name = _traced_child(os.getpid())
    child.kill()
    child.wait(timeout=30)
    assert name in _instances()  # SIGKILL leaves it, reader and all
    assert vcputrace.clear_leftovers(LocalHost()) == [name]
    assert name not in _instances()
    # and its private directory, which on this machine also holds the trace's text
    left = _private_dirs() - before
    assert len(left) == 1 and (Path(next(iter(left))) / "trace.txt").exists(), left
    assert left <= set(recovery.sweep_private_dirs(_LocalTestbed()).hypervisor)
    assert not left & _private_dirs()


class _LocalTestbed:
    """Just enough of a testbed for the recovery's sweep: every role on this machine."""

    class _Node:
        host = hypervisor = LocalHost()

    sender = receiver = emulator = _Node()
