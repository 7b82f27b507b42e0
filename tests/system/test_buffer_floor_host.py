"""The bottleneck queue's floor and its read-back, for real on this machine's kernel (issue 24, item 7).

tbf (this host has it; netem it has not, so the links here have no delay) queues every frame in its bfifo
before sending it, counting the frame with its Ethernet header. A queue smaller than one full-size frame
therefore passes no full-size frame at all, which is why bbrlab refuses a buffer below two frames instead
of setting one; and the queue a run records is the one the kernel reports.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import NetnsHost
from bbrlab.link import emulator as linkmod
from bbrlab.link.counters import QueueHeld, QueueInForce, effective_queue
from bbrlab.scenario.scenario import Link

pytestmark = pytest.mark.system

PORTS = ("vsnd", "vrcv")
PEER_IP = "10.77.0.2"  # a neighbour entry only: frames leave vrcv, nothing answers


@pytest.fixture
def ns():
    name = f"bbrlab-bf-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        ip = ["ip", "-n", name]
        subprocess.run([*ip, "link", "add", "name", PORTS[0], "type", "veth", "peer", "name", PORTS[1]], check=True)
        for ifname in PORTS:
            subprocess.run([*ip, "link", "set", "dev", ifname, "up"], check=True)
        for ifname in PORTS:  # no IPv6 autoconfiguration frames in tbf's counters
            subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"],
                           check=True)
        subprocess.run([*ip, "addr", "add", "10.77.0.1/24", "dev", PORTS[1]], check=True)
        subprocess.run([*ip, "neigh", "add", PEER_IP, "lladdr", "02:00:00:00:00:02", "dev", PORTS[1]], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def _tc(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=True, capture_output=True, text=True)


def _tbf(ns: str) -> dict:
    """The data port's tbf as tc reports it, read independently of bbrlab."""
    shown = json.loads(_tc(ns, "-raw", "-j", "-s", "qdisc", "show", "dev", PORTS[1]).stdout)
    return next(q for q in shown if q["kind"] == "tbf")


def _send(ns: str, payload_bytes: int, count: int = 5) -> dict:
    """``count`` pings of ``payload_bytes`` out of the data port; what tbf's counters gained meanwhile."""
    before = _tbf(ns)
    subprocess.run(["ip", "netns", "exec", ns, "ping", "-n", "-q", "-c", str(count), "-i", "0.05", "-W", "0.2",
                    "-s", str(payload_bytes), PEER_IP], capture_output=True)
    after = _tbf(ns)
    return {k: after[k] - before[k] for k in ("packets", "bytes", "drops")}


def _raw_tbf(ns: str, limit_bytes: int) -> None:
    """A tbf with a queue validation would refuse (straight through tc)."""
    _tc(ns, "qdisc", "replace", "dev", PORTS[1], "root", "handle", "bb:", "tbf", "rate", "10mbit",
        "burst", "15140b", "limit", f"{limit_bytes}b")


def test_a_queue_smaller_than_one_frame_passes_no_full_size_frame(ns):
    _raw_tbf(ns, 1513)  # one byte short of a 1514-byte frame (1472 payload + 8 ICMP + 20 IP + 14 Ethernet)
    full = _send(ns, 1472)
    assert full["packets"] == 0 and full["drops"] >= 5  # every one dropped (ping may send some again)
    small = _send(ns, 56)
    assert small["packets"] == 5  # frames that fit pass: it is the queue, not the rate, that drops them
    _raw_tbf(ns, 1514)
    assert _send(ns, 1472)["packets"] == 5  # one frame of room: full-size frames pass again


def test_the_floor_is_refused_before_the_kernel_and_the_recorded_queue_is_what_the_kernel_holds(ns):
    host = NetnsHost(name="emulator-netns", netns=ns)
    with pytest.raises(ValidationError, match="buffer_bytes"):
        Link(rtt_ms=0, rate_mbit=10, buffer_bdp=None, buffer_bytes=3000)  # what bbrlab once set instead of 1250
    for asked in (3028, 125_000):
        link = Link(rtt_ms=0, rate_mbit=10, buffer_bdp=None, buffer_bytes=asked)
        readback = linkmod.set(host, PORTS, link)
        recorded = effective_queue(readback, PORTS, link)
        assert recorded == QueueHeld(queue_bytes=asked, queue_bdp=None,  # RTT 0 here: no BDP to divide by
                                     in_force=QueueInForce("bbrlab", "tbf", None, "tbf's byte limit", asked))
        assert _tbf(ns)["options"]["limit"] == asked
        assert _send(ns, 1472)["drops"] == 0
        linkmod.clear(host, PORTS)
