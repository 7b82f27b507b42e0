"""The qdisc tree built from a Link, its tc rendering, its pyroute2 arguments, and the read-back check."""

import copy

import pytest

from bbrlab.cli import link as cli_link
from bbrlab.cli.main import main
from bbrlab.core.errors import ValidationError
from bbrlab.link import emulator as linkmod
from bbrlab.link.qdisc import (
    Netem,
    Tbf,
    UnsupportedByRenderer,
    build_tree,
    clear_argv,
    handle_int,
    pyroute2_kwargs,
    to_tc_argv,
)
from bbrlab.scenario.linksizing import NETEM_MIN_LIMIT_PACKETS
from bbrlab.scenario.scenario import Link

PORTS = ("eth1", "eth2")  # sender side (ACKs leave here), receiver side (data leaves here)


def test_paper_link_symmetric_delay_netem_root_tbf_child():
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50, buffer_bdp=1.0), PORTS)
    assert tree.ack.ifname == "eth1" and tree.data.ifname == "eth2"
    (ack,) = tree.ack.nodes
    assert ack.kind == "netem" and ack.parent == "root" and ack.qdisc.delay_us == 10_000
    assert ack.qdisc.loss is None and ack.qdisc.jitter_us == 0
    netem, tbf = tree.data.nodes
    assert (netem.kind, netem.handle, netem.parent) == ("netem", "bb:", "root")
    assert (tbf.kind, tbf.handle, tbf.parent) == ("tbf", "bb1:", "bb:1")
    assert netem.qdisc.delay_us == 10_000
    assert tbf.qdisc.rate_bit == 50_000_000 and tbf.qdisc.rate_bytes_per_s == 6_250_000
    assert tbf.qdisc.limit_bytes == 125_000  # 1 BDP = 50 Mbit/s x 20 ms
    assert tbf.qdisc.burst_bytes == 25_000  # 4 ms at 50 Mbit/s
    assert tree.kinds == {"netem", "tbf"}


def test_tc_argv_for_the_paper_link():
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50), PORTS)
    assert to_tc_argv(tree.ack) == [
        ["tc", "qdisc", "add", "dev", "eth1", "root", "handle", "bb:", "netem", "limit", "1000", "delay", "10000us"],
    ]
    assert to_tc_argv(tree.data) == [
        ["tc", "qdisc", "add", "dev", "eth2", "root", "handle", "bb:", "netem", "limit", "1000", "delay", "10000us"],
        ["tc", "qdisc", "add", "dev", "eth2", "parent", "bb:1", "handle", "bb1:",
         "tbf", "rate", "50000000bit", "burst", "25000b", "limit", "125000b"],
    ]
    assert clear_argv("eth2") == ["tc", "qdisc", "del", "dev", "eth2", "root"]


def test_forward_split_puts_the_whole_rtt_on_data_and_leaves_the_ack_port_alone():
    tree = build_tree(Link(rtt_ms=40, rate_mbit=100, delay_split="forward"), PORTS)
    assert tree.ack.nodes == () and to_tc_argv(tree.ack) == []
    assert tree.data.nodes[0].qdisc.delay_us == 40_000


def test_no_delay_no_loss_is_a_plain_token_bucket():
    tree = build_tree(Link(rtt_ms=0, rate_mbit=10, buffer_bdp=None, buffer_bytes=30_000), PORTS)
    assert tree.ack.nodes == ()
    (tbf,) = tree.data.nodes
    assert tbf.kind == "tbf" and tbf.parent == "root" and tbf.handle == "bb:"
    assert tbf.qdisc.limit_bytes == 30_000
    assert tree.kinds == {"tbf"}


def test_uniform_loss_and_jitter_go_on_the_data_direction_only():
    tree = build_tree(Link(rtt_ms=30, rate_mbit=50, loss_model="uniform", loss_pct=1.0, jitter_ms=2), PORTS)
    data_argv = to_tc_argv(tree.data)[0]
    assert data_argv[data_argv.index("delay"):] == ["delay", "15000us", "2000us", "loss", "random", "1%"]
    ack_argv = to_tc_argv(tree.ack)[0]
    assert "loss" not in ack_argv and ack_argv[-2:] == ["delay", "15000us"]


def test_small_loss_is_written_without_exponent():
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=0.001), PORTS)
    assert to_tc_argv(tree.data)[0][-3:] == ["loss", "random", "0.001%"]


def test_gemodel_passes_one_minus_h_and_one_minus_k():
    link = Link(rtt_ms=20, rate_mbit=50, loss_model="gemodel", ge_p_pct=1, ge_r_pct=25, ge_h_pct=10, ge_k_pct=99.5)
    argv = to_tc_argv(build_tree(link, PORTS).data)[0]
    assert argv[argv.index("loss"):] == ["loss", "gemodel", "1%", "25%", "90%", "0.5%"]


def test_seed_is_rendered_when_asked():
    link = Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1, loss_seed=42)
    assert to_tc_argv(build_tree(link, PORTS).data)[0][-2:] == ["seed", "42"]


def test_burst_scales_with_rate_and_never_drops_below_a_few_packets():
    assert Link(rtt_ms=20, rate_mbit=1000).tbf_burst_bytes() == 500_000  # 4 ms at 1 Gbit/s
    assert Link(rtt_ms=20, rate_mbit=1, buffer_bdp=2).tbf_burst_bytes() == 10 * 1514  # a few packets at least
    assert Link(rtt_ms=20, rate_mbit=20).tbf_burst_bytes() == 15_140
    assert Link(rtt_ms=20, rate_mbit=1000, mtu_bytes=9000).tbf_burst_bytes() == 500_000
    assert Link(rtt_ms=20, rate_mbit=50, mtu_bytes=9000).tbf_burst_bytes() == 10 * 9014


def test_netem_limit_holds_a_slow_start_overshoot():
    assert Link(rtt_ms=20, rate_mbit=50).netem_limit_packets() == NETEM_MIN_LIMIT_PACKETS
    big = Link(rtt_ms=40, rate_mbit=1000, buffer_bdp=1.0)  # BDP 5 MB, buffer 5 MB
    assert big.netem_limit_packets() == 26_667  # 4 x 10 MB / 1500 B
    tree = build_tree(big, PORTS)
    assert tree.ack.nodes[0].qdisc.limit_packets == tree.data.nodes[0].qdisc.limit_packets == 26_667


@pytest.mark.parametrize("ports", [("eth1", "eth1"), ("", "eth2"), ("eth1", "x" * 16), ("a/b", "eth2")])
def test_bad_port_names_are_rejected(ports):
    with pytest.raises(ValidationError) as e:
        build_tree(Link(rtt_ms=20, rate_mbit=50), ports)
    assert "ports" in str(e.value)


def test_handles_in_kernel_form():
    assert handle_int("bb:") == 0xBB0000
    assert handle_int("bb:1") == 0xBB0001
    assert handle_int("bb1:") == 0xBB10000


def test_pyroute2_arguments_from_the_same_tree():
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1), PORTS)
    netem, tbf = tree.data.nodes
    assert pyroute2_kwargs(netem) == {"handle": 0xBB0000, "delay": 10_000, "jitter": 0, "limit": 1000, "loss": 1}
    assert pyroute2_kwargs(tbf) == {"handle": 0xBB10000, "parent": 0xBB0001, "rate": 6_250_000,
                                    "burst": 25_000, "limit": 125_000}


def test_pyroute2_refuses_what_it_cannot_encode_before_touching_anything():
    ge = build_tree(Link(rtt_ms=20, rate_mbit=50, loss_model="gemodel", ge_p_pct=1), PORTS)
    with pytest.raises(UnsupportedByRenderer, match="gemodel"):
        pyroute2_kwargs(ge.data.nodes[0])
    fast = build_tree(Link(rtt_ms=0, rate_mbit=40_000, buffer_bdp=None, buffer_bytes=10**6), PORTS)
    with pytest.raises(UnsupportedByRenderer, match="34 Gbit"):
        pyroute2_kwargs(fast.data.nodes[0])


# -- read-back check (the JSON shapes of `tc -raw -j -s qdisc show` from iproute2 6.1) ---------------------
def _netem_json(n: Netem, handle="bb:") -> dict:
    opts = {"limit": n.limit_packets, "ecn": False, "gap": 0}
    if n.delay_us:
        opts["delay"] = {"delay": n.delay_us / 1e6, "jitter": n.jitter_us / 1e6, "correlation": 0}
    if n.loss and n.loss.model == "uniform":
        opts["loss-random"] = {"loss": n.loss.pct / 100, "correlation": 0}
    return {"kind": "netem", "handle": handle, "root": True, "refcnt": 2, "options": opts,
            "bytes": 0, "packets": 0, "drops": 0, "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0}


def _tbf_json(t: Tbf, handle="bb1:", parent="bb:1") -> dict:
    # The kernel keeps the burst as a time: it comes back a few bytes off.
    return {"kind": "tbf", "handle": handle, "parent": parent,
            "options": {"rate": t.rate_bytes_per_s, "burst": t.burst_bytes - 9, "burst_raw": "93d3",
                        "lat": 18000, "limit": t.limit_bytes}}


def _readback(tree) -> dict:
    ack = [_netem_json(n.qdisc) for n in tree.ack.nodes]
    netem, tbf = tree.data.nodes
    return {tree.ack.ifname: ack, tree.data.ifname: [_netem_json(netem.qdisc), _tbf_json(tbf.qdisc)]}


def test_read_back_that_matches_passes():
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1), PORTS)
    linkmod.check_readback(tree, _readback(tree))


@pytest.mark.parametrize("mutate, expect", [
    (lambda rb: rb["eth2"][0]["options"]["delay"].update(delay=0.011), "delay 11000 us"),
    (lambda rb: rb["eth2"][0]["options"].pop("loss-random"), "loss 0.000000, asked 0.010000"),
    (lambda rb: rb["eth2"][1]["options"].update(rate=6_000_000), "rate 6000000"),
    (lambda rb: rb["eth2"][1]["options"].update(limit=1000), "limit 1000 B"),
    (lambda rb: rb["eth2"].pop(1), "tbf bb1: missing"),
    (lambda rb: rb["eth1"].clear(), "eth1 netem bb: missing"),
    (lambda rb: rb["eth1"][0]["options"].update(limit=10), "limit 10 packets"),
])
def test_read_back_that_differs_raises_naming_the_difference(mutate, expect):
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1), PORTS)
    rb = copy.deepcopy(_readback(tree))
    mutate(rb)
    with pytest.raises(linkmod.LinkMismatch) as e:
        linkmod.check_readback(tree, rb)
    assert expect in str(e.value)


def test_empty_port_must_carry_only_the_kernel_default():
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50, delay_split="forward"), PORTS)
    rb = _readback(tree)
    rb["eth1"] = [{"kind": "pfifo_fast", "handle": "0:", "root": True, "options": {}}]
    linkmod.check_readback(tree, rb)
    rb["eth1"] = [_netem_json(Netem(delay_us=5000))]
    with pytest.raises(linkmod.LinkMismatch, match="eth1 should carry no bbrlab qdisc"):
        linkmod.check_readback(tree, rb)


def test_configured_values_recovered_from_read_back():
    tree = build_tree(Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1), PORTS)
    got = linkmod.configured_from_readback(_readback(tree), PORTS)
    assert got == {"rtt_ms": 20.0, "rate_mbit": 50.0, "queue_bytes": 125_000, "loss_pct": 1.0, "queue": "bbrlab"}


# -- the CLI checks every value before it looks at the testbed ----------------------------------------------
@pytest.mark.parametrize("argv, field", [
    (["--rtt=-5ms", "--rate", "50mbit"], "link.rtt_ms"),
    (["--rtt", "20ms", "--rate", "0"], "link.rate_mbit"),
    (["--rtt", "20ms", "--rate", "50mbit", "--loss", "150%"], "link.loss_pct"),
    (["--rtt", "20ms", "--rate", "50furlongs"], "--rate"),
    (["--rtt", "20ms", "--rate", "50mbit", "--buffer=-1bdp"], "--buffer"),  # the flag typed, as for a buffer below two frames
])
@pytest.mark.parametrize("verb", ["set", "validate"])
def test_cli_rejects_bad_values_before_the_testbed_is_touched(monkeypatch, capsys, argv, field, verb):
    def no_testbed(args):
        raise AssertionError("the testbed was looked up before the values were checked")

    monkeypatch.setattr(cli_link, "load_testbed", no_testbed)
    assert main(["link", verb, *argv]) == 1
    err = capsys.readouterr().err
    assert field in err and "not allowed" in err
