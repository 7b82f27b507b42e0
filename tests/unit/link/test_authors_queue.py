"""The paper authors' queue as a link option (issue #26): the tree both renderers build, its validation,
the read-back saying which limit is in force, the offloads, the drop check, and run ids.

The host kernel here has tbf but no netem, so no test on this machine can build the authors' tree (netem is
its child); tests/system/test_authors_queue_testbed.py builds it on the emulator VM.
"""

from __future__ import annotations

import copy
import glob
import json
from pathlib import Path

import pytest

from bbrlab.core import errors
from bbrlab.core.commands import Result
from bbrlab.core.errors import RunFailed, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.link import bottleneck, offloads
from bbrlab.link import counters as linkcount
from bbrlab.link import emulator as linkmod
from bbrlab.link.qdisc import Netem, Tbf, build_tree, pyroute2_kwargs, to_tc_argv
from bbrlab.run import checks
from bbrlab.scenario.linksizing import AUTHORS_NETEM_LIMIT_PACKETS, authors_burst_bytes
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

PORTS = ("eth1", "eth2")  # sender side (ACKs leave here), receiver side (data leaves here)
DATA = Path(__file__).parents[3] / "data"
AUTHORS = Link(rtt_ms=20, rate_mbit=100, queue="authors")  # 1 BDP asked = 250000 bytes


# -- the tree --------------------------------------------------------------------------------------------
def test_the_authors_tree_is_tbf_at_the_root_with_netem_below_on_both_ports():
    tree = build_tree(AUTHORS, PORTS)
    for port, delay_us in ((tree.ack, 10_000), (tree.data, 10_000)):
        tbf, netem = port.nodes
        assert (tbf.kind, tbf.handle, tbf.parent) == ("tbf", "bb:", "root")
        assert (netem.kind, netem.handle, netem.parent) == ("netem", "bb1:", "bb:1")
        assert tbf.qdisc == Tbf(rate_bit=100_000_000, burst_bytes=100_000, limit_bytes=250_000)
        assert netem.qdisc == Netem(delay_us=delay_us, limit_packets=100_000)


def test_tc_renders_the_authors_tree_exactly():
    tree = build_tree(Link(rtt_ms=40, rate_mbit=50, queue="authors", loss_model="uniform", loss_pct=0.1), PORTS)
    assert to_tc_argv(tree.ack) == [
        ["tc", "qdisc", "add", "dev", "eth1", "root", "handle", "bb:", "tbf", "rate", "50000000bit", "burst",
         "50000b", "limit", "250000b"],
        ["tc", "qdisc", "add", "dev", "eth1", "parent", "bb:1", "handle", "bb1:", "netem", "limit", "100000",
         "delay", "20000us"],
    ]
    assert to_tc_argv(tree.data) == [
        ["tc", "qdisc", "add", "dev", "eth2", "root", "handle", "bb:", "tbf", "rate", "50000000bit", "burst",
         "50000b", "limit", "250000b"],
        ["tc", "qdisc", "add", "dev", "eth2", "parent", "bb:1", "handle", "bb1:", "netem", "limit", "100000",
         "delay", "20000us", "loss", "random", "0.1%"],
    ]


def test_pyroute2_renders_the_same_authors_tree():
    tree = build_tree(Link(rtt_ms=40, rate_mbit=50, queue="authors", loss_model="uniform", loss_pct=0.1), PORTS)
    (tbf, netem) = tree.data.nodes
    assert pyroute2_kwargs(tbf) == {"handle": 0xBB0000, "rate": 6_250_000, "burst": 50_000, "limit": 250_000}
    assert pyroute2_kwargs(netem) == {"handle": 0xBB10000, "parent": 0xBB0001, "delay": 20_000, "jitter": 0,
                                      "limit": 100_000, "loss": 0.1}
    ack_netem = pyroute2_kwargs(tree.ack.nodes[1])
    assert ack_netem["loss"] == 0 and ack_netem["limit"] == 100_000


def test_forward_split_keeps_the_authors_tree_on_the_ack_port_with_no_delay_and_jitter_stays_on_data():
    tree = build_tree(Link(rtt_ms=40, rate_mbit=100, queue="authors", delay_split="forward", jitter_ms=2), PORTS)
    assert [n.kind for n in tree.ack.nodes] == ["tbf", "netem"]
    assert tree.ack.nodes[1].qdisc == Netem(delay_us=0, limit_packets=100_000)
    assert tree.data.nodes[1].qdisc.delay_us == 40_000 and tree.data.nodes[1].qdisc.jitter_us == 2_000


@pytest.mark.parametrize("rate_mbit, burst", [(100, 100_000), (10, 10_000), (2.5, 2_500), (1.514, 1_514),
                                              (1000, 1_000_000)])
def test_the_authors_burst_is_the_rate_in_mbit_times_1000_bytes(rate_mbit, burst):
    assert authors_burst_bytes(rate_mbit) == burst
    link = Link(rtt_ms=20, rate_mbit=rate_mbit, buffer_bdp=None, buffer_bytes=100_000, queue="authors")
    assert build_tree(link, PORTS).data.nodes[0].qdisc.burst_bytes == burst


@pytest.mark.parametrize("kwargs", [dict(rtt_ms=20, rate_mbit=50), dict(rtt_ms=0, rate_mbit=10, buffer_bdp=None,
                                    buffer_bytes=30_000), dict(rtt_ms=40, rate_mbit=100, delay_split="forward",
                                    loss_model="uniform", loss_pct=1), dict(rtt_ms=20, rate_mbit=None, buffer_bdp=None)])
def test_bbrlabs_tree_is_unchanged_by_the_new_fields(kwargs):
    default = build_tree(Link(**kwargs), PORTS)
    explicit = build_tree(Link(**kwargs, queue="bbrlab", emulator_offloads="on"), PORTS)
    assert explicit == default
    if Link(**kwargs).shaped and Link(**kwargs).rtt_ms:
        netem, tbf = default.data.nodes
        assert (netem.kind, netem.parent, tbf.kind, tbf.parent) == ("netem", "root", "tbf", "bb:1")
        assert tbf.qdisc.limit_bytes == Link(**kwargs).queue_limit_bytes  # tbf's limit is the buffer asked


# -- validation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field, words", [
    (dict(rtt_ms=20, rate_mbit=100, queue="fifo"), "link.queue", "one of bbrlab"),
    (dict(rtt_ms=20, rate_mbit=None, buffer_bdp=None, queue="authors"), "link.queue", "bbrlab for an unshaped"),
    (dict(rtt_ms=20, rate_mbit=1.5, queue="authors"), "link.rate_mbit", "at least 1.514 Mbit/s with queue authors"),
    (dict(rtt_ms=20, rate_mbit=100, emulator_offloads="yes"), "link.emulator_offloads", "off (TSO, GSO and GRO"),
    (dict(rtt_ms=10, rate_mbit=10, buffer_bdp=12_112.1), "link.buffer_bdp", "0 < buffer_bdp <= 12112 BDP"),
    (dict(rtt_ms=20, rate_mbit=100, buffer_bdp=1000.5), "link.buffer_bdp", "0 < buffer_bdp <= 1000 BDP"),
])
def test_bad_values_and_combinations_name_the_field_and_what_is_allowed(kwargs, field, words):
    with pytest.raises(ValidationError) as e:
        Link(**kwargs)
    assert e.value.field == field and words in e.value.allowed


def test_buffers_up_to_the_authors_queue_are_accepted():
    """100000 full-size frames (151.4 MB) is 12112 BDP at 10 Mbit/s x 10 ms: far above the old 1000 BDP."""
    assert Link(rtt_ms=10, rate_mbit=10).max_buffer_bdp() == 12_112.0
    deep = Link(rtt_ms=10, rate_mbit=10, buffer_bdp=12_112)
    assert deep.queue_limit_bytes == 151_400_000 and build_tree(deep, PORTS).data.find("tbf").qdisc.limit_bytes \
        == 151_400_000
    assert Link(rtt_ms=20, rate_mbit=100).max_buffer_bdp() == 1000.0  # 605.6 BDP there: 1000 still allowed
    assert Link(rtt_ms=20, rate_mbit=100, buffer_bdp=605.6, queue="authors").queue_limit_bytes == 151_400_000
    assert Link(rtt_ms=10, rate_mbit=1.514, buffer_bdp=2, queue="authors").shaped  # the authors' lowest rate


# -- read-back: which limit is in force ------------------------------------------------------------------
def _netem_json(n: Netem, handle: str, parent: str | None) -> dict:
    where = {"root": True} if parent is None else {"parent": parent}
    return {"kind": "netem", "handle": handle, **where,
            "options": {"limit": n.limit_packets, "delay": {"delay": n.delay_us / 1e6, "jitter": 0.0},
                        **({"loss-random": {"loss": n.loss.pct / 100}} if n.loss else {})},
            "packets": 0, "bytes": 0, "drops": 0, "backlog": 0, "qlen": 0}


def _tbf_json(t: Tbf, handle: str, parent: str | None) -> dict:
    where = {"root": True} if parent is None else {"parent": parent}
    return {"kind": "tbf", "handle": handle, **where,
            "options": {"rate": t.rate_bytes_per_s, "burst": t.burst_bytes - 9, "limit": t.limit_bytes},
            "packets": 0, "bytes": 0, "drops": 0, "backlog": 0, "qlen": 0}


def readback_of(tree) -> dict:
    """A read-back shaped as ``tc -raw -j -s qdisc show`` reports the tree (iproute2 6.1's keys)."""
    out = {}
    for port in tree.ports:
        out[port.ifname] = [(_netem_json if isinstance(n.qdisc, Netem) else _tbf_json)(
            n.qdisc, n.handle, None if n.parent == "root" else n.parent) for n in port.nodes]
    return out


def test_the_authors_read_back_passes_the_check_and_says_netems_packets_are_the_queue():
    tree = build_tree(AUTHORS, PORTS)
    rb = readback_of(tree)
    linkmod.check_readback(tree, rb)
    assert bottleneck.queue_mode_of(rb["eth2"]) == "authors"
    assert linkcount.effective_queue(rb, PORTS, AUTHORS).to_dict() == {
        "queue_mode": "authors", "limit_in_force": "netem", "queue_packets": 100_000,
        "queue_bytes": 151_400_000, "queue_bdp": 605.6, "tbf_limit_bytes": 250_000,
        "queue_bytes_basis": "netem's packet limit x 1514-byte full-size frames (approximate: netem counts "
                             "packets of any size)"}


def test_bbrlabs_read_back_says_tbfs_bytes_are_the_queue():
    link = Link(rtt_ms=20, rate_mbit=100, buffer_bdp=2)
    rb = readback_of(build_tree(link, PORTS))
    got = linkcount.effective_queue(rb, PORTS, link)
    assert (got.in_force.queue_mode, got.in_force.limit_in_force, got.queue_bytes, got.queue_bdp,
            got.in_force.queue_packets) == ("bbrlab", "tbf", 500_000, 2.0, None)


def test_the_tree_is_read_from_the_kernel_not_from_the_request():
    """A read-back of the authors' tree says netem's packets even for a Link that asked for bbrlab's (the run
    then fails its read-back check; the record still says what was there)."""
    rb = readback_of(build_tree(AUTHORS, PORTS))
    assert linkcount.effective_queue(rb, PORTS, Link(rtt_ms=20, rate_mbit=100)).in_force.limit_in_force == "netem"
    with pytest.raises(linkmod.LinkMismatch, match="hangs at root|is a tbf"):
        linkmod.check_readback(build_tree(Link(rtt_ms=20, rate_mbit=100), PORTS), rb)


@pytest.mark.parametrize("kinds, mode", [
    ([("netem", None), ("tbf", "bb:1")], "bbrlab"), ([("tbf", None)], "bbrlab"), ([("netem", None)], None),
    ([("tbf", None), ("netem", "bb:1")], "authors"), ([], None)])
def test_queue_mode_of_each_shape(kinds, mode):
    qdiscs = [{"kind": k, **({"root": True} if p is None else {"parent": p})} for k, p in kinds]
    assert bottleneck.queue_mode_of(qdiscs) == mode


def test_configured_values_of_the_authors_tree_say_its_mode():
    got = linkmod.configured_from_readback(readback_of(build_tree(AUTHORS, PORTS)), PORTS)
    assert got == {"rtt_ms": 20.0, "rate_mbit": 100.0, "queue_bytes": 250_000, "loss_pct": 0.0, "queue": "authors"}


# -- drops in the authors' tree ----------------------------------------------------------------------------
def _counters(netem_packets, netem_drops, tbf_drops, tbf_packets=None) -> dict:
    """Counters of the authors' tree: tbf (root) counts netem's drops as its own too."""
    return {"eth1": [{"kind": "tbf", "handle": "bb:", "root": True, "packets": 5, "drops": 0},
                     {"kind": "netem", "handle": "bb1:", "parent": "bb:1", "packets": 5, "drops": 0}],
            "eth2": [{"kind": "tbf", "handle": "bb:", "root": True, "packets": tbf_packets or netem_packets,
                      "drops": tbf_drops},
                     {"kind": "netem", "handle": "bb1:", "parent": "bb:1", "packets": netem_packets,
                      "drops": netem_drops}]}


def test_in_the_authors_tree_netems_overflow_is_the_bottlenecks_drop():
    delta = linkcount.counters(_counters(10_000, 300, 302), PORTS).minus(linkcount.counters(_counters(0, 0, 0), PORTS))
    seen = linkcount.loss_observed(delta, "authors")
    assert seen.netem_dropped == 300 and seen.tbf_dropped == 2 and seen.includes_overflow is True
    assert seen.entered == 10_300
    assert checks.drops_as_configured(AUTHORS, delta).netem_dropped == 300  # no loss asked: overflow is fine
    assert list(seen.to_dict()) == ["entered", "netem_dropped", "includes_overflow", "tbf_dropped", "fraction"]
    with pytest.raises(RunFailed, match="no loss configured"):  # the same drops in bbrlab's tree: netem overflowed
        checks.drops_as_configured(Link(rtt_ms=20, rate_mbit=100), delta)


def test_in_the_authors_tree_only_a_loss_clearly_below_the_asked_one_fails():
    zero = linkcount.counters(_counters(0, 0, 0), PORTS)
    delta = linkcount.counters(_counters(10_000, 600, 600), PORTS).minus(zero)
    lossy = Link(rtt_ms=20, rate_mbit=100, queue="authors", loss_model="uniform", loss_pct=1)
    assert checks.drops_as_configured(lossy, delta).fraction == pytest.approx(600 / 10_600)  # loss + overflow
    little = linkcount.counters(_counters(10_000, 5, 5), PORTS).minus(zero)
    with pytest.raises(RunFailed, match="standard deviations below"):
        checks.drops_as_configured(lossy, little)


# -- the run record (typed, metadata.link) -------------------------------------------------------------------
OFFLOADS = offloads.Offloads("off", {p: {"tso": "off", "gso": "off", "gro": "off"} for p in PORTS})


@pytest.mark.parametrize("link", [AUTHORS, Link(rtt_ms=20, rate_mbit=100)], ids=["authors", "bbrlab"])
def test_a_new_runs_link_record_keeps_the_queue_in_force_and_the_offloads_and_reads_back(link):
    rb = readback_of(build_tree(link, PORTS))
    delta = linkcount.counters(rb, PORTS).minus(linkcount.counters(rb, PORTS))
    record = linkcount.LinkRecord(delta, linkcount.effective_queue(rb, PORTS, link), offloads=OFFLOADS)
    record.loss = checks.drops_as_configured(link, delta)
    d = record.to_dict()
    assert list(d) == ["counters", "queue_mode", "limit_in_force", "queue_bytes", "queue_packets", "queue_bytes_basis",
                       "tbf_limit_bytes", "queue_bdp", "emulator_offloads", "loss"]
    assert d["queue_mode"] == link.queue and d["emulator_offloads"] == OFFLOADS.to_dict()
    assert ("includes_overflow" in d["loss"]) == (link.queue == "authors")
    again = linkcount.LinkRecord.from_dict(json.loads(json.dumps(d)))
    assert again == record and again.to_dict() == d


def test_a_record_made_before_the_queue_trees_keeps_its_shape():
    """data/'s records have queue_bytes and queue_bdp alone, no offloads, no overflow flag: none are added."""
    old = {"counters": {"ack": {}, "data": {}}, "queue_bytes": 250_000, "queue_bdp": 1.0,
           "loss": {"entered": None, "netem_dropped": 0, "fraction": None, "configured_fraction": 0.0}}
    record = linkcount.LinkRecord.from_dict(old)
    assert record.queue.in_force is None and record.offloads is None and not record.loss.includes_overflow
    assert json.dumps(record.to_dict()) == json.dumps(old)


# -- offloads ----------------------------------------------------------------------------------------------
ETHTOOL = """== eth1
Features for eth1:
rx-checksumming: on [fixed]
tcp-segmentation-offload: {tso}
\ttx-tcp-segmentation: {tso}
generic-segmentation-offload: {gso}
generic-receive-offload: {gro}
large-receive-offload: off [fixed]
== eth2
Features for eth2:
tcp-segmentation-offload: {tso}
generic-segmentation-offload: {gso}
generic-receive-offload: {gro}
"""


class FakeHost(Host):
    """Answers every command with ``stdout`` (and ``code``), remembering the argv."""

    def __init__(self, stdout: str, code: int = 0):
        super().__init__(name="emu")
        self.stdout, self.code, self.argvs = stdout, code, []

    def _execute(self, argv, *, timeout, stdin):
        self.argvs.append(argv)
        return self.code, self.stdout, "" if self.code == 0 else "ethtool: not found", False


def test_offloads_are_set_in_one_command_and_read_back():
    host = FakeHost(ETHTOOL.format(tso="on", gso="on", gro="on"))
    got = offloads.apply(host, PORTS, "on")
    assert got.to_dict() == {"asked": "on", "ports": {p: {"tso": "on", "gso": "on", "gro": "on"} for p in PORTS}}
    assert offloads.Offloads.from_dict(got.to_dict()) == got
    (argv,) = host.argvs
    assert argv[:2] == ("sh", "-c") and argv[3:] == ("offloads", "on", "eth1", "eth2")  # values as arguments


def test_a_port_that_keeps_another_offload_is_refused_and_a_missing_ethtool_is_named():
    host = FakeHost(ETHTOOL.format(tso="on", gso="on", gro="off [fixed]"))
    with pytest.raises(offloads.OffloadMismatch, match="eth1 gro off, asked on; eth2 gro off, asked on"):
        offloads.apply(host, PORTS, "on")
    with pytest.raises(errors.TestbedError, match="ethtool: not found"):
        offloads.apply(FakeHost("", code=127), PORTS, "off")
    with pytest.raises(ValidationError, match="link.emulator_offloads"):
        offloads.set_argv(PORTS, "auto")


def test_the_runs_offloads_record_is_what_was_read_back():
    assert offloads.parse_features(ETHTOOL.format(tso="off", gso="off", gro="off"))["eth2"] == \
        {"tso": "off", "gso": "off", "gro": "off"}
    assert Result("emu", ("x",), 0, "", "", 0.0).ok  # the host API the fake stands in for


# -- run ids -------------------------------------------------------------------------------------------------
def test_every_recorded_run_keeps_its_id_and_scenario():
    """bbrlab's tree with offloads off, the defaults, leave the scenario dict and so every run id in data/ as
    they were (campaigns resume, figures keep their runs)."""
    paths = glob.glob(str(DATA / "*" / "runs" / "*" / "record.json")) + \
        glob.glob(str(DATA / "*" / "calibration" / "*" / "runs" / "*" / "record.json"))
    assert len(paths) > 100
    for path in paths:
        record = json.loads(Path(path).read_text())
        s = Scenario.from_dict(record["scenario"])
        assert s.to_dict() == record["scenario"] and s.run_id == record["run_id"], path


def test_the_authors_tree_and_offloads_are_part_of_the_run_identity():
    base = Scenario(Link(20, 100), Contention(10, 25), Flow("cubic", IperfParams(10)))
    assert "queue" not in base.to_dict()["link"] and "emulator_offloads" not in base.to_dict()["link"]
    authors = Scenario(Link(20, 100, queue="authors"), Contention(10, 25), Flow("cubic", IperfParams(10)))
    both = Scenario(Link(20, 100, queue="authors", emulator_offloads="on"), Contention(10, 25),
                    Flow("cubic", IperfParams(10)))
    assert authors.run_id.startswith("cubic-ts10ms-sh25-rtt20ms-100mbit-qauthors-r00-")
    assert both.run_id.startswith("cubic-ts10ms-sh25-rtt20ms-100mbit-qauthors-offloads-r00-")
    assert len({base.run_id, authors.run_id, both.run_id}) == 3
    again = Scenario.from_dict(copy.deepcopy(both.to_dict()))
    assert again == both and again.run_id == both.run_id and again.link.queue == "authors"
    assert AUTHORS_NETEM_LIMIT_PACKETS == 100_000


# -- the command -----------------------------------------------------------------------------------------------
def test_link_set_refuses_a_bad_queue_combination_before_the_testbed_is_touched(monkeypatch, capsys):
    from bbrlab.cli import link as cli_link
    from bbrlab.cli.main import main

    def no_testbed(args):
        raise AssertionError("the testbed was looked up before the values were checked")

    monkeypatch.setattr(cli_link, "load_testbed", no_testbed)
    assert main(["link", "set", "--rtt", "20ms", "--rate", "1mbit", "--queue", "authors"]) == 1
    assert "link.rate_mbit = 1.0 is not allowed: at least 1.514 Mbit/s with queue authors" in capsys.readouterr().err
    assert main(["link", "set", "--rtt", "20ms", "--rate", "100mbit", "--buffer", "2000bdp"]) == 1
    assert "--buffer = '2000bdp' is not allowed: 0 < buffer_bdp <= 1000 BDP" in capsys.readouterr().err


def test_link_set_says_which_limit_is_in_force():
    from bbrlab.cli.link import queue_line

    rb = readback_of(build_tree(AUTHORS, PORTS))
    text = queue_line(linkcount.effective_queue(rb, PORTS, AUTHORS), AUTHORS)
    assert text == ("queue in force: netem's 100000 packets = about 151400000 B at full-size frames = 605.6 BDP "
                    "(BDP 250000 B); tbf's limit 250000 B is NOT in force (authors' tree)")
    plain = Link(rtt_ms=20, rate_mbit=100)
    rb = readback_of(build_tree(plain, PORTS))
    assert queue_line(linkcount.effective_queue(rb, PORTS, plain), plain) == \
        "queue in force: tbf's limit 250000 B = 1.0 BDP (BDP 250000 B)"
