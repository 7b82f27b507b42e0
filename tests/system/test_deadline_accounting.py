"""The kernel's running count of admitted SCHED_DEADLINE bandwidth, on this machine's real kernel.

This host's kernel keeps counting the bandwidth of a thread that slept often under SCHED_DEADLINE after
it goes back to SCHED_OTHER (bbrlab.contention.accounting). The test makes it drift that way, then checks
that what an admission refusal adds to its message says so and names the fix, and that ``bbrlab contention
recount`` brings the count back to what the threads that exist hold. (The kernel also recounts by itself
at moments of its own choosing, e.g. when a new deadline thread is admitted, so a refusal caused by the
drift is not made on purpose here.) On a kernel that does not drift
there is nothing to recount and the test says so (skip).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbrlab.contention.accounting import drift_note, kernel_total, recount
from bbrlab.contention.deadline import contended
from bbrlab.contention.limits import read_kernel_limits
from bbrlab.contention.sched import DeadlineAdmissionError, SchedPolicy, sched_setattr
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.scenario import Contention

from .test_contention import TinyQemu

pytestmark = pytest.mark.system

BBRLAB = str(Path(sys.executable).with_name("bbrlab"))
WAKEY = "import time\nwhile True: time.sleep(0.0003)"  # sleeps and wakes a few thousand times a second
HALF = SchedPolicy.deadline(5_000_000, 10_000_000, 10_000_000)


@pytest.fixture
def debugfs():
    """debugfs mounted (the kernel's count is read there); unmounted again if this test mounted it."""
    mounted = Path("/sys/kernel/debug/sched").is_dir()
    if not mounted:
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=True)
    yield
    recount(LocalHost())  # whatever the test left counted goes
    if not mounted:
        subprocess.run(["umount", "/sys/kernel/debug"], check=False)


def _leak_once() -> float:
    """Put a thread that sleeps often under 50 % SCHED_DEADLINE and back; the count it left (in CPUs)."""
    proc = subprocess.Popen([sys.executable, "-c", WAKEY])
    try:
        time.sleep(0.2)
        before = kernel_total(LocalHost()).total_cpus
        sched_setattr(proc.pid, HALF)
        time.sleep(0.1)
        sched_setattr(proc.pid, SchedPolicy("SCHED_OTHER"))
        time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.05)  # past the 0-lag time: what the kernel would give back, it has
    return kernel_total(LocalHost()).total_cpus - before


def test_a_drifted_count_is_named_in_the_refusal_and_recount_restores_it(debugfs, tmp_path):
    host = LocalHost()
    baseline = recount(host)
    limits = read_kernel_limits(host)
    assert abs(baseline.total_cpus - limits.fair_server_cpus) < 0.01, baseline  # only the fair server counted

    leaked = 0.0
    for _ in range(40):  # until the kernel's count has no room for 50 % more
        try:
            leaked += _leak_once()
        except DeadlineAdmissionError:
            break
    if leaked < 0.25:
        pytest.skip(f"this kernel ({limits.kernel_release}) did not keep counting the bandwidth of threads that left "
                    "SCHED_DEADLINE: nothing to recount")
    note = drift_note(host, limits.fair_server_cpus)  # what an admission refusal now adds to its message
    assert "its count has drifted" in note and "bbrlab contention recount" in note, note

    out = subprocess.run([BBRLAB, "contention", "recount"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"now {100 * limits.fair_server_cpus:.1f} %" in out.stdout, out.stdout
    assert abs(kernel_total(host).total_cpus - limits.fair_server_cpus) < 0.01
    assert "as the threads that exist hold" in drift_note(host, limits.fair_server_cpus)

    vm = TinyQemu(tmp_path)
    try:
        with contended(host, vm.threads, Contention(1, 50)) as held:  # the whole capacity is free again
            assert kernel_total(host).total_cpus == pytest.approx(limits.fair_server_cpus + 0.5, abs=0.01)
        assert held.evidence.policy_held
    finally:
        vm.stop()
