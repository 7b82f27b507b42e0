"""The link's qdiscs for real on this machine's kernel, in a throw-away network namespace.

This host's kernel has tbf but no netem, so the token bucket is built and read back here with both
renderers, and asking for netem must fail loudly (naming netem and the emulator VM) with nothing left
behind. Where a kernel does have netem the same tests check that it was really built.
"""

import json
import subprocess
import uuid

import pytest

from bbrlab.core import errors
from bbrlab.core.commands import CommandError
from bbrlab.core.hosts import LocalHost, NetnsHost
from bbrlab.link import emulator as linkmod
from bbrlab.link.qdisc import (
    PortTree,
    QdiscApplyError,
    QdiscNode,
    Tbf,
    apply_pyroute2,
    build_tree,
    clear_pyroute2,
    to_tc_argv,
)
from bbrlab.scenario.scenario import Link

pytestmark = pytest.mark.system

PORTS = ("vsnd", "vrcv")  # sender side, receiver side of a veth pair


def tc_json(ns: str, ifname: str) -> list[dict]:
    """Read back independently of bbrlab: tc's JSON, straight from a subprocess."""
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-raw", "-j", "qdisc", "show", "dev", ifname],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def roots(ns: str) -> dict[str, tuple[str, str]]:
    out = {}
    for ifname in PORTS:
        root = next(q for q in tc_json(ns, ifname) if q.get("root"))
        out[ifname] = (root["kind"], root["handle"])
    return out


def kernel_has_netem() -> bool:
    """Independent of bbrlab: try netem on loopback in a fresh namespace."""
    p = subprocess.run(["unshare", "-n", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                       capture_output=True, text=True)
    return p.returncode == 0


@pytest.fixture
def ns():
    name = f"bbrlab-lt-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "add", "name", PORTS[0], "type", "veth", "peer", "name", PORTS[1]],
                       check=True)
        for ifname in PORTS:
            subprocess.run(["ip", "-n", name, "link", "set", "dev", ifname, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


@pytest.fixture
def host(ns):
    return NetnsHost(name="emulator-netns", netns=ns)


def test_pyroute2_builds_the_token_bucket_and_tc_reads_it_back(ns):
    link = Link(rtt_ms=0, rate_mbit=50, buffer_bdp=None, buffer_bytes=125_000)
    tree = build_tree(link, PORTS)
    apply_pyroute2(tree.data, netns=ns)
    (tbf,) = tc_json(ns, "vrcv")
    assert (tbf["kind"], tbf["handle"], tbf.get("root")) == ("tbf", "bb:", True)
    assert tbf["options"]["rate"] == 6_250_000  # bytes/s = 50 Mbit/s
    assert tbf["options"]["limit"] == 125_000
    assert abs(tbf["options"]["burst"] - tree.data.nodes[0].qdisc.burst_bytes) <= 16  # stored as a time
    clear_pyroute2("vrcv", netns=ns)
    assert [q["kind"] for q in tc_json(ns, "vrcv")] == ["noqueue"]


def test_both_renderers_give_the_kernel_the_same_qdisc(ns, host):
    tree = build_tree(Link(rtt_ms=0, rate_mbit=200, buffer_bdp=None, buffer_bytes=400_000), PORTS)
    apply_pyroute2(tree.data, netns=ns)
    by_netlink = tc_json(ns, "vrcv")
    clear_pyroute2("vrcv", netns=ns)
    for argv in to_tc_argv(tree.data):
        host.run(argv)
    by_tc = tc_json(ns, "vrcv")
    assert [q["options"] for q in by_netlink] == [q["options"] for q in by_tc]
    linkmod.check_readback(tree, {"vsnd": tc_json(ns, "vsnd"), "vrcv": by_tc})


def test_set_show_clear_leave_the_ports_as_they_were(ns, host):
    before = roots(ns)
    link = Link(rtt_ms=0, rate_mbit=100, buffer_bdp=None, buffer_bytes=250_000)
    readbacks = linkmod.set(host, PORTS, link)
    assert [q["kind"] for q in readbacks["vrcv"]] == ["tbf"] and readbacks["vrcv"][0]["options"]["limit"] == 250_000
    assert linkmod.show(host, PORTS)["vrcv"][0]["options"] == readbacks["vrcv"][0]["options"]
    # Setting again replaces bbrlab's own tree instead of refusing it.
    linkmod.set(host, PORTS, Link(rtt_ms=0, rate_mbit=20, buffer_bdp=None, buffer_bytes=50_000))
    assert tc_json(ns, "vrcv")[0]["options"]["rate"] == 2_500_000
    linkmod.clear(host, PORTS)
    assert roots(ns) == before


def test_asking_for_netem_where_the_kernel_has_none_fails_before_any_change(ns, host):
    before = {i: tc_json(ns, i) for i in PORTS}
    link = Link(rtt_ms=20, rate_mbit=50)
    if kernel_has_netem():  # a distribution kernel: netem is really built and read back
        readbacks = linkmod.set(host, PORTS, link)
        assert readbacks["vrcv"][0]["kind"] == "netem" and readbacks["vrcv"][1]["kind"] == "tbf"
        linkmod.clear(host, PORTS)
    else:
        with pytest.raises(errors.TestbedError) as e:
            linkmod.set(host, PORTS, link)
        assert "no netem" in str(e.value) and "emulator VM" in str(e.value)
    assert {i: tc_json(ns, i) for i in PORTS} == before


def test_pyroute2_renderer_removes_what_it_built_when_the_kernel_refuses_a_later_qdisc(ns):
    tbf = Tbf(rate_bit=10_000_000, burst_bytes=15_140, limit_bytes=30_000)
    # The second node hangs under a class that does not exist: the kernel refuses it after the first went in.
    broken = PortTree("vrcv", "data", (QdiscNode("bb:", "root", tbf), QdiscNode("bb1:", "cc:1", tbf)))
    with pytest.raises(QdiscApplyError, match="put back to its default"):
        apply_pyroute2(broken, netns=ns)
    assert [q["kind"] for q in tc_json(ns, "vrcv")] == ["noqueue"]


def test_pyroute2_names_netem_and_the_emulator_vm_when_the_kernel_lacks_it(ns):
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50), PORTS)
    # A tree that puts a token bucket in first and netem second: the bucket must not stay behind.
    tbf_first = PortTree("vrcv", "data", (QdiscNode("bb:", "root", tree.data.nodes[1].qdisc),
                                          QdiscNode("bb1:", "bb:1", tree.data.nodes[0].qdisc)))
    if kernel_has_netem():
        apply_pyroute2(tbf_first, netns=ns)
        assert [q["kind"] for q in tc_json(ns, "vrcv")] == ["tbf", "netem"]
        return
    with pytest.raises(QdiscApplyError) as e:
        apply_pyroute2(tbf_first, netns=ns)
    assert "sch_netem" in str(e.value) and "emulator VM" in str(e.value)
    assert [q["kind"] for q in tc_json(ns, "vrcv")] == ["noqueue"]


def test_a_root_qdisc_bbrlab_did_not_set_is_left_alone(ns, host):
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "vrcv", "root", "handle", "5:",
                    "tbf", "rate", "1mbit", "burst", "5000", "limit", "10000"], check=True)
    with pytest.raises(errors.TestbedError, match="did not set"):
        linkmod.set(host, PORTS, Link(rtt_ms=0, rate_mbit=50, buffer_bdp=None, buffer_bytes=125_000))
    assert tc_json(ns, "vrcv")[0]["handle"] == "5:"
    linkmod.clear(host, ["vsnd"])  # clear only removes bbrlab's own qdiscs
    with pytest.raises(errors.TestbedError, match="still carry"):
        linkmod.clear(host, PORTS)
    assert tc_json(ns, "vrcv")[0]["handle"] == "5:"


def test_a_missing_port_fails_before_any_change(ns, host):
    with pytest.raises(errors.TestbedError, match="vnone"):
        linkmod.set(host, ("vsnd", "vnone"), Link(rtt_ms=0, rate_mbit=50, buffer_bdp=None, buffer_bytes=125_000))
    assert roots(ns)["vsnd"] == ("noqueue", "0:")


def test_host_supports_tries_the_kernel_for_real():
    local = LocalHost()
    assert linkmod.host_supports(local, "tbf") is True
    assert linkmod.host_supports(local, "netem") is kernel_has_netem()
    if not kernel_has_netem():
        assert linkmod.host_supports(local, "netem-seed") is False


@pytest.fixture
def bridged():
    """sender ns -- [e1 bridge e2] emulator ns -- receiver ns: the testbed's shape, in namespaces only."""
    from types import SimpleNamespace

    tag = uuid.uuid4().hex[:4]
    snd, emu, rcv = f"bbrlab-ls-{tag}", f"bbrlab-le-{tag}", f"bbrlab-lr-{tag}"

    def ip(*args):
        subprocess.run(["ip", *args], check=True)

    try:
        for ns in (snd, emu, rcv):
            ip("netns", "add", ns)
        ip("-n", snd, "link", "add", "name", "s0", "type", "veth", "peer", "name", "e1", "netns", emu)
        ip("-n", rcv, "link", "add", "name", "r0", "type", "veth", "peer", "name", "e2", "netns", emu)
        ip("-n", emu, "link", "add", "name", "br0", "type", "bridge")
        for port in ("e1", "e2"):
            ip("-n", emu, "link", "set", "dev", port, "master", "br0", "up")
        ip("-n", emu, "link", "set", "dev", "br0", "up")
        for ns, dev, addr in ((snd, "s0", "10.98.0.1/24"), (rcv, "r0", "10.98.0.2/24")):
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", "dev", dev, "up")
            ip("-n", ns, "link", "set", "dev", "lo", "up")
        yield SimpleNamespace(
            sender=SimpleNamespace(host=NetnsHost(name="sender", netns=snd), experiment_ip="10.98.0.1"),
            receiver=SimpleNamespace(host=NetnsHost(name="receiver", netns=rcv), experiment_ip="10.98.0.2"),
            emulator=SimpleNamespace(host=NetnsHost(name="emulator", netns=emu), ports=("e1", "e2")))
    finally:
        for ns in (snd, emu, rcv):
            subprocess.run(["ip", "netns", "del", ns])


def test_udp_and_tcp_measurements_through_a_token_bucket_in_namespaces(bridged):
    """validate's UDP and TCP parts against tbf at 50 Mbit/s (the host has no netem, so no delay here)."""
    from bbrlab.run.linkcheck import measure_tcp, measure_udp

    link = Link(rtt_ms=0, rate_mbit=50, buffer_bdp=None, buffer_bytes=125_000)
    linkmod.set(bridged.emulator.host, bridged.emulator.ports, link)
    udp = measure_udp(bridged, link, duration_s=3)
    assert udp["ok"] and abs(udp["measured"] - 50) <= 1.0  # frames on the wire, what the bucket meters
    assert abs(udp["goodput_mbit"] - 50 * 1448 / 1490) <= 1.0  # iperf3's payload of those frames
    # Overdriven by 10 %, the bucket dropped the excess; the datagrams lost are all accounted for there.
    assert udp["dropped_at_bottleneck"] > 0.05 * udp["sent_datagrams"]
    assert abs(udp["lost_elsewhere"]) <= 0.01 * udp["sent_datagrams"], udp
    tcp = measure_tcp(bridged, link, duration_s=3)
    assert tcp["used_cca"] == "cubic" and 40 <= tcp["measured"] <= 50.5
    drops = linkmod.show(bridged.emulator.host, bridged.emulator.ports)["e2"][0]["drops"]
    assert drops > 0  # the bucket, not the path, limited the UDP run (it was sent at the full rate)


class CountingNetnsHost(NetnsHost):
    """The namespace reached as a remote emulator is (``is_local`` off: ``tc`` commands, not pyroute2), every
    command it runs kept in ``commands`` (each is one SSH round trip on a real emulator)."""

    def __post_init__(self):
        super().__post_init__()
        self.is_local, self.commands = False, []

    def _execute(self, argv, *, timeout, stdin):
        self.commands.append(list(argv))
        return super()._execute(argv, timeout=timeout, stdin=stdin)


def test_a_remote_emulators_ports_are_rebuilt_in_one_batch_and_probed_once(ns):
    host = CountingNetnsHost(name="emulator-netns", netns=ns)
    held = linkmod.EmulatorLink(host, PORTS)
    first, second = (Link(rtt_ms=0, rate_mbit=r, buffer_bdp=None, buffer_bytes=125_000) for r in (50, 20))
    with held.holding(first) as changed:
        assert changed and tc_json(ns, "vrcv")[0]["options"]["rate"] == 6_250_000
        assert held.counters_start()["vrcv"][0]["options"]["rate"] == 6_250_000  # the read-back of the set
    assert held.known_kinds == {"tbf"}
    host.commands.clear()
    with held.holding(second) as changed:  # bbrlab's tree on the port: cleared and rebuilt in the same batch
        assert changed and tc_json(ns, "vrcv")[0]["options"]["rate"] == 2_500_000
    batches = [c for c in host.commands if c[:2] == ["bash", "-c"]]
    assert len(batches) == 1 and ["tc", "qdisc", "del", "dev", "vrcv", "root", ";"] == batches[0][4:11]
    assert not [c for c in host.commands if c[0] == "unshare"]  # tbf was probed with the first link only
    assert not [c for c in host.commands if c[:2] == ["tc", "qdisc"]]  # nothing tc'd outside the batch
    host.commands.clear()
    with held.holding(second) as changed:  # unchanged: nothing set, the counters read once
        assert not changed
        held.counters_start()
    assert len(host.commands) == 1 and host.commands[0][:2] == ["tc", "-raw"]
    held.close()
    assert {i: root[0] for i, root in roots(ns).items()} == {"vsnd": "noqueue", "vrcv": "noqueue"}


def test_a_batch_stops_at_its_first_failing_command_and_names_it(tmp_path):
    host, after = LocalHost(), tmp_path / "after"
    with pytest.raises(CommandError) as e:
        linkmod.run_batch(host, [["true"], ["sh", "-c", "exit 3"], ["touch", str(after)]])
    assert "failed (exit 3): sh -c exit 3" in str(e.value) and not after.exists()
    linkmod.run_batch(host, [["touch", str(after)], ["test", "-e", str(after)]])
    with pytest.raises(errors.ValidationError, match="argv"):
        linkmod.run_batch(host, [["echo", ";"]])
