"""The link's done-when checks on the local testbed: netem + tbf on the emulator VM's bridge ports.

The emulator VM is reached over SSH, so these tests drive the ``tc`` renderer against a kernel that
has netem (the host kernel has none). Traffic runs from the sender VM to the receiver namespace while
the testbed lock is held.
"""

import json
import subprocess
import sys

import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.link import emulator as linkmod
from bbrlab.run.linkcheck import measure_loss
from bbrlab.scenario.scenario import Link
from bbrlab.testbed import lock as tblock

pytestmark = [pytest.mark.system, pytest.mark.testbed]

PAPER_LINK = Link(rtt_ms=20, rate_mbit=50, buffer_bdp=1.0)


@pytest.fixture
def emulator(testbed):
    """The emulator role, with the lock held and bbrlab's qdiscs removed afterwards whatever happens."""
    emu = testbed.emulator
    with tblock.testbed_lock(testbed.name):
        try:
            yield emu
        finally:
            linkmod.clear(emu.host, emu.ports)


def roots(emu) -> dict:
    return {i: linkmod.root_qdisc(q) and (linkmod.root_qdisc(q)["kind"], linkmod.root_qdisc(q)["handle"])
            for i, q in linkmod.show(emu.host, emu.ports).items()}


def bbrlab_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bbrlab.cli.main", *args], capture_output=True, text=True,
                          timeout=600)


def test_emulator_vm_has_netem_and_the_tree_goes_in_through_tc(emulator):
    assert linkmod.host_supports(emulator.host, "netem") is True
    readbacks = linkmod.set(emulator.host, emulator.ports, PAPER_LINK)
    sender_side, receiver_side = emulator.ports
    (ack,) = readbacks[sender_side]
    assert ack["kind"] == "netem" and ack["options"]["delay"]["delay"] == pytest.approx(0.010, abs=2e-6)
    netem, tbf = readbacks[receiver_side]
    assert (netem["kind"], tbf["kind"], tbf["parent"]) == ("netem", "tbf", "bb:1")
    assert tbf["options"]["rate"] == 6_250_000 and tbf["options"]["limit"] == PAPER_LINK.queue_limit_bytes


def test_paper_link_validates_within_the_tolerances(testbed, emulator):
    """`link validate --json --rtt 20ms --rate 50mbit --buffer 1bdp`: ping within 10 %, UDP within 5 %."""
    p = bbrlab_cli("link", "validate", "--testbed", testbed.name, "--rtt", "20ms", "--rate", "50mbit",
                   "--buffer", "1bdp", "--json")
    report = json.loads(p.stdout)
    print(json.dumps(report, indent=2))  # the measured numbers, for the log
    assert report["rtt_ms"]["configured"] == 20 and report["rtt_ms"]["pings"] == 200
    assert abs(report["rtt_ms"]["measured"] - 20) <= 2.0
    assert report["udp_mbit"]["configured"] == 50
    assert abs(report["udp_mbit"]["measured"] - 50) <= 2.5
    assert report["tcp_mbit"]["measured"] > 0 and report["tcp_mbit"]["used_cca"] == "cubic"
    assert p.returncode == (0 if all(e["ok"] for e in report.values()) else 1)


def test_one_percent_loss_over_ten_thousand_packets(testbed, emulator):
    link = Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1.0)
    readbacks = linkmod.set(emulator.host, emulator.ports, link)
    netem = readbacks[emulator.ports[1]][0]
    assert netem["options"]["loss-random"]["loss"] == pytest.approx(0.01, abs=1e-6)
    loss = measure_loss(testbed, link, packets=10_000)
    print(loss)
    assert loss["packets"] == 10_000
    assert 0.7 <= loss["measured"] <= 1.3  # 1 % +- 3 binomial standard deviations over 10,000 packets


def test_clear_leaves_the_ports_as_they_were(testbed, emulator):
    linkmod.clear(emulator.host, emulator.ports)
    before = roots(emulator)
    linkmod.set(emulator.host, emulator.ports, Link(rtt_ms=30, rate_mbit=20, loss_model="uniform", loss_pct=0.5))
    assert all(r == ("netem", "bb:") for r in roots(emulator).values())
    p = bbrlab_cli("link", "clear", "--testbed", testbed.name)
    assert p.returncode == 0, p.stderr
    assert roots(emulator) == before
    assert not any(q.get("handle", "").startswith("bb") for qs in linkmod.show(emulator.host, emulator.ports).values()
                   for q in qs)


@pytest.mark.parametrize("flags, field", [
    (["--rtt=-5ms", "--rate", "50mbit"], "link.rtt_ms"),
    (["--rtt", "20ms", "--rate", "0mbit"], "link.rate_mbit"),
    (["--rtt", "20ms", "--rate", "50mbit", "--loss", "150%"], "link.loss_pct"),
])
def test_bad_values_are_rejected_before_the_emulator_is_touched(testbed, emulator, flags, field):
    linkmod.set(emulator.host, emulator.ports, PAPER_LINK)
    before = linkmod.show(emulator.host, emulator.ports)
    p = bbrlab_cli("link", "set", "--testbed", testbed.name, *flags)
    assert p.returncode == 1 and field in p.stderr and "not allowed" in p.stderr
    after = linkmod.show(emulator.host, emulator.ports)
    assert {i: [(q["kind"], q["handle"], q["options"]) for q in qs] for i, qs in after.items()} == \
        {i: [(q["kind"], q["handle"], q["options"]) for q in qs] for i, qs in before.items()}


def test_a_seed_the_emulator_cannot_take_is_refused_before_any_change(emulator):
    linkmod.clear(emulator.host, emulator.ports)
    before = roots(emulator)
    link = Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1.0, loss_seed=7)
    if linkmod.host_supports(emulator.host, "netem-seed"):
        readbacks = linkmod.set(emulator.host, emulator.ports, link)
        assert readbacks[emulator.ports[1]][0]["options"]["seed"] == 7
        return
    with pytest.raises(ValidationError, match="link.loss_seed"):
        linkmod.set(emulator.host, emulator.ports, link)
    assert roots(emulator) == before
