"""Issue 24 over real SSH, on the suite's testbed: the emulator VM stands for a lab's emulator.

- Item 4: two drivers (two processes) take the lock on the emulator host itself; the second is told who
  holds it, and gets it as soon as the first dies (SIGKILL). A live campaign's qdiscs on the emulator are
  refused to another, a dead one's replaced.
- Item 11: each VM serves an SSH host key of its own, and the sender answering where the emulator is
  expected is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from bbrlab.core import errors
from bbrlab.core.hosts import SSHHost
from bbrlab.link import emulator as link
from bbrlab.scenario.scenario import Link
from bbrlab.testbed import hostlock
from bbrlab.testbed.local.state import state_dir

pytestmark = [pytest.mark.system, pytest.mark.testbed]

ROOT = Path(__file__).resolve().parents[2]

#: A second driver: attaches to the testbed on its own, takes the emulator host's lock, optionally sets the link.
DRIVER = """
import sys
from bbrlab import testbed
from bbrlab.link import emulator as link
from bbrlab.scenario.scenario import Link
from bbrlab.testbed import hostlock
tb = testbed.load(sys.argv[1])
with hostlock.hold(tb.emulator.host, testbed="driver-a", activity="campaign run"):
    if sys.argv[2] == "set":
        link.set(tb.emulator.host, tb.emulator.ports, Link(rtt_ms=10, rate_mbit=10, buffer_bdp=1))
    print("held", flush=True)
    sys.stdin.read()
"""


def _driver(testbed, what: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, testbed.name, what], cwd=ROOT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = proc.stdout.readline().strip()
    assert line == "held", f"the first driver did not get the lock: {line!r}"
    return proc


def test_two_drivers_on_one_emulator_the_second_is_told_who_and_waits(testbed):
    emulator = testbed.emulator.host
    first = _driver(testbed, "hold")
    try:
        held = hostlock.holder(emulator)
        assert held["pid"] == first.pid and held["testbed"] == "driver-a"  # read on the emulator itself
        with pytest.raises(hostlock.HostBusy) as e:
            with hostlock.hold(emulator, testbed="driver-b", timeout_s=0):
                pass
        assert f"pid {first.pid} on " in str(e.value) and "driver-a: campaign run" in str(e.value)
        assert e.value.holder["token"] != hostlock.SESSION_TOKEN
    finally:
        first.kill()  # SIGKILL: the SSH connection goes with the process, and the lock on the host with it
        first.wait()
    t0 = time.monotonic()
    with hostlock.hold(emulator, testbed="driver-b", timeout_s=60):
        took = time.monotonic() - t0
        assert hostlock.holder(emulator)["token"] == hostlock.SESSION_TOKEN
    print(f"lock taken {took:.2f} s after the first driver was SIGKILLed")
    assert took < 15
    assert hostlock.holder(emulator) is None  # released on leaving the block


def test_a_live_campaigns_qdiscs_are_refused_to_another_and_a_dead_ones_are_replaced(testbed):
    emulator, ports = testbed.emulator.host, testbed.emulator.ports
    first = _driver(testbed, "set")
    try:
        before = link.show(emulator, ports)
        with pytest.raises(errors.TestbedError, match=f"another campaign that still holds that host: pid {first.pid}"):
            link.set(emulator, ports, Link(rtt_ms=40, rate_mbit=20, buffer_bdp=1))  # main: replaced them
        with pytest.raises(errors.TestbedError, match="another campaign"):
            link.clear(emulator, ports)
        after = link.show(emulator, ports)
        assert [[(q["kind"], q.get("options")) for q in after[p]] for p in ports] == \
               [[(q["kind"], q.get("options")) for q in before[p]] for p in ports]  # untouched
    finally:
        first.kill()  # dies with its qdiscs on: a leftover now, no one's
        first.wait()
    deadline = time.monotonic() + 15
    while hostlock.holder(emulator) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    readback = link.set(emulator, ports, Link(rtt_ms=40, rate_mbit=20, buffer_bdp=1))
    assert link.configured_from_readback(readback, ports)["rtt_ms"] == pytest.approx(40, abs=0.01)
    link.clear(emulator, ports)


def _served_key(host: SSHHost) -> str:
    """The host key the SSH server on ``host``'s address and port presents (no authentication)."""
    transport = paramiko.Transport((host.address, host.port))
    try:
        transport.start_client(timeout=30)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        transport.close()


def test_each_vm_serves_its_own_host_key_and_a_sender_is_not_taken_for_the_emulator(testbed, tmp_path):
    if testbed.kind != "local":
        pytest.skip("the local testbed's VMs only")
    sender, emulator = testbed.sender.host, testbed.emulator.host
    keys = {role: _served_key(h) for role, h in (("sender", sender), ("emulator", emulator))}
    assert keys["sender"] != keys["emulator"]  # main: both serve the image's key
    pinned = (state_dir(testbed.name) / "known_hosts").read_text()
    assert f"[127.0.0.1]:{sender.port} {keys['sender']}" in pinned
    assert f"[127.0.0.1]:{emulator.port} {keys['emulator']}" in pinned
    # The sender where the emulator is expected: known_hosts pins the emulator's key at the sender's port.
    swapped = tmp_path / "known_hosts"
    swapped.write_text(f"[127.0.0.1]:{sender.port} {keys['emulator']}\n")
    impostor = SSHHost(name="emulator?", address="127.0.0.1", port=sender.port, key_path=sender.key_path,
                       known_hosts=str(swapped))
    try:
        with pytest.raises(paramiko.SSHException):
            impostor.run(["true"], timeout=30)  # main: accepted, the sender passes for the emulator
    finally:
        impostor.close()


def test_a_command_on_a_lab_file_waits_for_the_emulators_holder_and_then_drives_it(testbed):
    """The testbed's own testbed.yaml read as a lab's file: ``bbrlab link set`` holds the emulator host's lock
    (the local lock is our pytest session's, which the command inherits), so it waits while another driver
    holds the emulator, saying who, and sets the link once that driver is gone."""
    from bbrlab.testbed.local.lifecycle import testbed_file

    if testbed.kind != "local":
        pytest.skip("the local testbed's VMs only")
    lab_file = str(testbed_file(testbed.name))
    link.clear(testbed.emulator.host, testbed.emulator.ports)
    first = _driver(testbed, "hold")
    cmd = subprocess.Popen([sys.executable, "-c", "import sys; from bbrlab.cli.main import main; sys.exit(main())",
                            "link", "set", "--rtt", "30ms", "--rate", "20mbit", "--testbed", lab_file], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    try:
        try:
            out, err = cmd.communicate(timeout=8)
            pytest.fail(f"link set did not wait for the emulator's holder: {out} {err}")
        except subprocess.TimeoutExpired:
            pass
        now = link.show(testbed.emulator.host, testbed.emulator.ports)
        assert all(link.is_default(link.root_qdisc(q)) for q in now.values())  # main: set at once
    finally:
        first.kill()
        first.wait()
    out, err = cmd.communicate(timeout=120)
    assert cmd.returncode == 0, err
    assert f"is in use by another bbrlab: pid {first.pid} on " in err and "waiting for it" in err
    now = link.show(testbed.emulator.host, testbed.emulator.ports)
    assert link.configured_from_readback(now, testbed.emulator.ports)["rtt_ms"] == pytest.approx(30, abs=0.01)
    link.clear(testbed.emulator.host, testbed.emulator.ports)
