"""The local testbed for real: QEMU guests, namespaces, taps, SSH through fabric, iperf3 traffic.

Most tests share the session's ``testbed`` fixture. Two bring up testbeds of their own names to
check the lifecycle end to end: a fresh ``up`` + ``down`` that must leave nothing behind, and an
``up`` killed halfway whose recorded state lets ``down`` remove everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import bbrlab.testbed as tbmod
from bbrlab.core.errors import ValidationError
from bbrlab.testbed.local import lifecycle, plumbing, qemu
from bbrlab.testbed.local.state import State, state_dir
from tests.testbed_flows import client_report, received_mbit, serve_once

pytestmark = [pytest.mark.system, pytest.mark.testbed]

IPERF_PORT = 5290


def _root_ns_ifnames() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _our_qemu_pids(name: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and any(
        qemu.is_our_qemu(int(p), lifecycle.vm_name(name, role)) for role in ("sender", "emulator"))]


def _assert_nothing_left(name: str) -> None:
    assert _our_qemu_pids(name) == []
    assert not plumbing.netns_exists(plumbing.link_netns(name))
    assert not plumbing.netns_exists(plumbing.receiver_netns(name))
    assert not {"tap-s", "tap-ea", "rx0", "br-a"} & _root_ns_ifnames()
    state = State.load(name)
    assert state is None or (state.phase == "down" and state.vms == {} and state.netns == [])


def _counters(tb, ifname: str) -> dict[str, int]:
    out = {}
    for what in ("rx_bytes", "tx_bytes"):
        out[what] = int(tb.emulator.host.output(["cat", f"/sys/class/net/{ifname}/statistics/{what}"]))
    return out


def test_roles_answer_through_fabric_with_the_papers_kernel(testbed):
    guest = testbed.sender.host.output(["uname", "-r"])
    assert guest.startswith("6.1.")
    assert testbed.emulator.host.output(["uname", "-r"]) == guest
    assert testbed.receiver.host.output(["uname", "-r"]) == os.uname().release  # a namespace of this host
    assert testbed.sender.host.output(["hostname"]) == "sender"
    assert testbed.emulator.host.output(["hostname"]) == "emulator"


def _iperf3_through_emulator(tb, log_dir, duration_s: int = 5) -> float:
    """Send ``duration_s`` of iperf3 from the sender VM to the receiver; check the bytes crossed the
    emulator (in on its sender side, out on its receiver side); return the received Mbit/s."""
    serve_once(tb, IPERF_PORT, log_dir)
    a, b = tb.emulator.ports
    before = {a: _counters(tb, a), b: _counters(tb, b)}
    report = client_report(tb, IPERF_PORT, duration_s)
    received_bytes = report["end"]["sum_received"]["bytes"]  # sent bytes may still sit in the socket
    rate_mbit = received_mbit(report)
    assert received_bytes > 0 and rate_mbit > 0
    assert report["end"]["sender_tcp_congestion"] in ("cubic", "bbr")
    assert _counters(tb, a)["rx_bytes"] - before[a]["rx_bytes"] >= received_bytes
    assert _counters(tb, b)["tx_bytes"] - before[b]["tx_bytes"] >= received_bytes
    return rate_mbit


def test_iperf3_sender_to_receiver_goes_through_the_emulator(testbed, tmp_path):
    rate_mbit = _iperf3_through_emulator(testbed, tmp_path)
    print(f"\niperf3 sender -> receiver through the emulator, unshaped, {testbed.accelerator}: "
          f"{rate_mbit:.0f} Mbit/s")


def test_guests_have_the_papers_sysctls_and_tso(testbed):
    h = testbed.sender.host
    for key in ("net.core.rmem_max", "net.core.wmem_max"):
        assert h.sysctl(key) == "2147483647"
    assert h.sysctl("net.ipv4.tcp_wmem").split()[-1] == "2147483647"
    assert h.sysctl("net.ipv4.tcp_rmem").split()[-1] == "2147483647"
    assert h.sysctl("net.ipv4.tcp_no_metrics_save") == "1"
    offloads = h.output(["ethtool", "-k", "eth1"])
    assert "tcp-segmentation-offload: on" in offloads


def test_status_reports_each_role_and_the_senders_vcpu_threads(testbed):
    st = tbmod.status(testbed)
    assert st["accelerator"] in ("kvm", "tcg")
    roles = st["roles"]
    assert all(r["reachable"] for r in roles.values())
    assert {"cubic", "bbr"} <= set(roles["sender"]["congestion_controls"])
    assert roles["emulator"]["qdiscs"]["netem"] in ("loaded", "module", "builtin")
    assert roles["emulator"]["qdiscs"]["tbf"] in ("loaded", "module", "builtin")
    threads = roles["sender"]["vcpu_threads"]
    pid = roles["sender"]["qemu_pid"]
    assert len(threads) == testbed.local.sender_vcpus
    assert qemu.is_our_qemu(pid, lifecycle.vm_name(testbed.name, "sender"))
    for i, tid in enumerate(threads):
        assert os.path.isdir(f"/proc/{pid}/task/{tid}")
        assert open(f"/proc/{pid}/task/{tid}/comm").read().strip() == f"CPU {i}/{st['accelerator'].upper()}"
    described = testbed.describe()
    assert described["sender_kernel"].startswith("6.1.") and described["hypervisor"].startswith("QEMU ")


def test_experiment_plumbing_stays_out_of_the_root_namespace(testbed):
    assert not {"tap-s", "tap-ea", "rx0", "br-a"} & _root_ns_ifnames()
    assert {"tap-s", "tap-ea", "br-a"} <= set(plumbing.interface_names(plumbing.link_netns(testbed.name)))
    assert "rx0" in plumbing.interface_names(plumbing.receiver_netns(testbed.name))


def test_second_up_reuses_the_running_testbed(testbed):
    before = State.load(testbed.name).vms
    again = tbmod.up(testbed.name, sender_vcpus=testbed.local.sender_vcpus, progress=False)
    assert State.load(testbed.name).vms == before
    assert again.sender.vcpu_threads() == testbed.sender.vcpu_threads()


def test_cli_shell_runs_a_command_and_status_prints_json(testbed, capfd):
    from bbrlab.cli.main import main

    assert main(["testbed", "shell", "--testbed", testbed.name, "emulator", "--", "ip", "-br", "link",
                 "show", "br0"]) == 0
    assert "br0" in capfd.readouterr().out
    assert main(["testbed", "status", "--testbed", testbed.name, "--json"]) == 0
    st = json.loads(capfd.readouterr().out)
    assert st["accelerator"] == testbed.accelerator
    assert st["roles"]["sender"]["vcpu_threads"] == testbed.sender.vcpu_threads()


def test_bad_input_changes_nothing():
    for kwargs, field in (({"name": "Bad_Name"}, "testbed.name"), ({"name": "zz-bad", "sender_vcpus": 0},
                                                                     "sender_vcpus")):
        with pytest.raises(ValidationError, match=field):
            tbmod.up(progress=False, **kwargs)
    assert not state_dir("zz-bad").exists()
    assert not plumbing.netns_exists(plumbing.link_netns("zz-bad"))


def test_fresh_up_uname_iperf3_then_down_leaves_nothing(tmp_path):
    name = "tbcheck"
    with tbmod.testbed_lock(name):
        tbmod.down(name, progress=False)
        tb = tbmod.up(name, progress=False)
        try:
            assert len(_our_qemu_pids(name)) == 2
            assert tb.sender.host.output(["uname", "-r"]).startswith("6.1.")
            assert tb.emulator.host.output(["uname", "-r"]).startswith("6.1.")
            assert tb.receiver.host.output(["uname", "-r"]) == os.uname().release
            assert _iperf3_through_emulator(tb, tmp_path) > 0
        finally:
            tb.close()
            removed = tbmod.down(name, progress=False)
        assert len(removed["qemu_pids"]) == 2
        _assert_nothing_left(name)
        assert tbmod.down(name, progress=False) == {"qemu_pids": [], "netns": [], "files": []}


def test_down_cleans_up_after_up_was_killed_halfway():
    name = "tbcrash"
    with tbmod.testbed_lock(name):
        tbmod.down(name, progress=False)
        proc = subprocess.Popen([sys.executable, "-m", "bbrlab.cli.main", "testbed", "up", "--name", name,
                                 "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 600
            while not (State.load(name) and State.load(name).vms.get("emulator", {}).get("pid")):
                assert proc.poll() is None, "up ended before it started the VMs"
                assert time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert len(_our_qemu_pids(name)) == 2  # QEMU outlives the killed up
        assert plumbing.netns_exists(plumbing.link_netns(name))
        tbmod.down(name, progress=False)
        _assert_nothing_left(name)
