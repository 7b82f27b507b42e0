"""The sender boots Debian's 6.12 and 5.10 on the running testbed, then goes back to 6.1 (both in make test-slow:
two sender boots each, 83 s for 6.12 in make test on 2026-12-01; make test builds bbr2b for both kernels in
tests/system/test_sender_kernels.py and reboots the sender for a campaign's block in the README's demo campaign).

Each test changes the kernel of the session's testbed, so each extra kernel costs one sender
reboot (about 20-30 s under TCG) and no second testbed. For each kernel: the sender's ``uname -r``
is the package's release, the testbed records it, only the sender was rebooted (the emulator's
QEMU is the same process), the running kernel identifies its congestion controls (stock bbr is
BBRv1 from tcp_bbr, bbr2b the patched v1), which needs inet_diag/tcp_diag, and a bbr flow
crosses the emulator. The testbed is put back on debian-6.1 whatever happens.
"""

from __future__ import annotations

import contextlib

import pytest

import bbrlab.testbed as tbmod
from bbrlab.cli.main import main
from bbrlab.kernel import debian
from bbrlab.kernel.ccaprobe import probe_ccas
from bbrlab.testbed.local.state import State
from tests.testbed_flows import bbr_flow, received_mbit

pytestmark = [pytest.mark.system, pytest.mark.testbed]

IPERF_PORT = 5291


def _check_sender(tb, kernel_name: str, emulator_pid: int, log_dir) -> str:
    release = tb.sender.host.output(["uname", "-r"])
    assert release == debian.pinned_release(kernel_name)
    recorded = tbmod.sender_kernel(tb)
    assert (recorded.name, recorded.release, recorded.origin) == (kernel_name, release, "debian")
    assert State.load(tb.name).vms["emulator"]["pid"] == emulator_pid, "the emulator must not be rebooted"
    ccas = probe_ccas(tb.sender.host)
    assert (ccas["bbr"].bbr_version, ccas["bbr"].patched, ccas["bbr"].module) == (1, False, "tcp_bbr")
    assert ccas["bbr2b"].bbr_version == 1 and ccas["bbr2b"].patched and ccas["bbr2b"].module == "bbr2b"
    assert ccas["cubic"].bbr_version is None and not ccas["cubic"].patched
    report = bbr_flow(tb, IPERF_PORT, log_dir, duration_s=3)
    assert report["end"]["sum_received"]["bytes"] > 0
    assert received_mbit(report) > 0
    return release


@contextlib.contextmanager
def _back_to_debian_61(testbed):
    """The session's testbed on debian-6.1 again afterwards, whatever happens."""
    name, vcpus = testbed.name, testbed.local.sender_vcpus
    try:
        yield name, vcpus
    finally:
        tb = tbmod.up(name, sender_vcpus=vcpus, progress=False)
        testbed.sender.host.close()  # its SSH session went with the old sender; reconnect on next use
        assert tb.sender.host.output(["uname", "-r"]).startswith("6.1.")
        assert tbmod.sender_kernel(tb).name == "debian-6.1"
        tb.close()


@pytest.mark.slow
def test_sender_boots_debian_612_through_the_command_rebooting_only_the_sender(testbed, tmp_path):
    emulator_pid = State.load(testbed.name).vms["emulator"]["pid"]
    with _back_to_debian_61(testbed) as (name, vcpus):
        assert main(["testbed", "up", "--name", name, "--sender-vcpus", str(vcpus), "--kernel", "debian-6.12",
                     "--quiet"]) == 0
        tb = tbmod.load(name)
        try:
            assert _check_sender(tb, "debian-6.12", emulator_pid, tmp_path).startswith("6.12.")
            sender_pid = State.load(name).vms["sender"]["pid"]
            tbmod.up(name, sender_vcpus=vcpus, progress=False, kernel="debian-6.12", load_bbr2b=False)
            assert State.load(name).vms["sender"]["pid"] == sender_pid, "same kernel: the sender is reused"
        finally:
            tb.close()


# make test-slow: one more kernel download and two more sender reboots (about 50 s) for a path the 6.12 test
# above already takes (a Debian kernel fetched, checked and booted, then 6.1 again).
@pytest.mark.slow
def test_sender_boots_debian_510_rebooting_only_the_sender(testbed, tmp_path):
    emulator_pid = State.load(testbed.name).vms["emulator"]["pid"]
    with _back_to_debian_61(testbed) as (name, vcpus):
        tb = tbmod.up(name, sender_vcpus=vcpus, progress=False, kernel="debian-5.10")
        try:
            assert _check_sender(tb, "debian-5.10", emulator_pid, tmp_path).startswith("5.10.")
        finally:
            tb.close()
