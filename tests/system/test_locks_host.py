"""Issue 24 on this machine, for real: lock holders found by device and inode (two tmpfs mounts), and recovery
that stops only bbrlab's iperf3 (a foreign server in a network namespace)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bbrlab.core.hosts import NetnsHost
from bbrlab.run import iperf
from tests.polling import wait_for

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]


HOLD_AND_ASK = """
import fcntl, json, os, sys
from bbrlab.testbed import lock
a, b = sys.argv[1:3]
fd = os.open(a, os.O_RDWR | os.O_CREAT)
os.close(os.open(b, os.O_RDWR | os.O_CREAT))
fcntl.flock(fd, fcntl.LOCK_EX)
print(json.dumps({"inodes": [os.stat(a).st_ino, os.stat(b).st_ino], "pid": os.getpid(),
                  "holders_a": sorted(lock.lock_holders(a)), "holders_b": sorted(lock.lock_holders(b))}))
"""


def test_a_lock_on_another_file_system_with_the_same_inode_is_not_ours(tmp_path):
    """Two fresh tmpfs mounts number their first files alike: a holder of one must not be taken for the other's."""
    a, b = tmp_path / "a", tmp_path / "b"
    script = (f"set -e; mkdir -p {a} {b}; mount -t tmpfs bbrlab-a {a}; mount -t tmpfs bbrlab-b {b}; "
              f'exec {sys.executable} -c "$0" {a}/x.lock {b}/x.lock')
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, HOLD_AND_ASK],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         timeout=60)  # a mount namespace of its own: the mounts go with it
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert seen["inodes"][0] == seen["inodes"][1]  # the case at hand: same inode, two file systems
    assert seen["holders_a"] == [seen["pid"]]
    assert seen["holders_b"] == []  # main: [pid], the other file system's lock taken for this one's


@pytest.fixture
def netns_host():
    name = f"bbrlab-ht-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield NetnsHost(name="receiver-netns", netns=name)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_recovery_stops_bbrlabs_iperf3_and_leaves_anyone_elses(netns_host, tmp_path):
    ns = netns_host.netns
    foreign = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s", "-p", str(iperf.DEFAULT_PORT)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: iperf.listening(netns_host, iperf.DEFAULT_PORT), "the foreign iperf3 server to listen", 10)
        assert iperf.port_users(netns_host, iperf.DEFAULT_PORT, listening=True)  # it is seen on the port
        assert iperf.kill_port_users(netns_host, iperf.DEFAULT_PORT, listening=True) == []
        assert foreign.poll() is None, "recovery killed an iperf3 server bbrlab did not start"  # main: killed
    finally:
        foreign.kill()
        foreign.wait()
    iperf.start_server(netns_host, str(tmp_path / "server.json"))  # bbrlab's own, as a run starts it
    assert len(iperf.kill_port_users(netns_host, iperf.DEFAULT_PORT, listening=True)) == 1
    wait_for(lambda: not iperf.listening(netns_host, iperf.DEFAULT_PORT), "bbrlab's iperf3 server to go", 10)
