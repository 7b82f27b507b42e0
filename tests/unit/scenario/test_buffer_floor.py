"""No table claims a buffer that was not set (issue 24, item 7).

A bottleneck queue below two full-size frames (2 x (MTU + 14) bytes: tbf's bfifo counts each frame with its
Ethernet header) used to be enlarged silently to 3000 bytes while the record and the tables said the buffer
asked for (0.1 BDP at 10 Mbit/s x 10 ms is 1250 bytes; the kernel held 3000 = 0.24 BDP). Now it is refused,
naming the field and the range its rate x RTT allows, and the queue the kernel holds is recorded and is what
the tables show.
"""

from __future__ import annotations

import pytest

from bbrlab.analysis import tables
from bbrlab.analysis.records_reader import RunView
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.cli import link as cli_link
from bbrlab.cli.main import main
from bbrlab.core.errors import ValidationError
from bbrlab.link.counters import LinkCounters, LinkRecord, QueueHeld, QueueInForce, effective_queue
from bbrlab.link.qdisc import build_tree
from bbrlab.scenario.linksizing import BufferBelowMinimum
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario

PORTS = ("eth1", "eth2")


def test_a_tenth_of_a_bdp_at_10_mbit_and_10_ms_is_refused_with_the_allowed_range():
    with pytest.raises(ValidationError) as e:
        Link(rtt_ms=10, rate_mbit=10, buffer_bdp=0.1)
    assert e.value.field == "link.buffer_bdp" and e.value.value == 0.1
    assert "0.2422 <= buffer_bdp <= 12112 BDP at 10 Mbit/s x 10 ms (BDP 12500 bytes)" in e.value.allowed
    assert "3028 bytes" in e.value.allowed
    assert Link(rtt_ms=10, rate_mbit=10, buffer_bdp=0.2422).queue_limit_bytes == 3028  # the lowest it names
    with pytest.raises(BufferBelowMinimum):
        Link(rtt_ms=10, rate_mbit=10, buffer_bdp=0.2421)


def test_a_buffer_in_bytes_below_two_frames_is_refused_and_the_floor_follows_the_mtu():
    with pytest.raises(ValidationError) as e:
        Link(rtt_ms=10, rate_mbit=10, buffer_bdp=None, buffer_bytes=3027)
    assert e.value.field == "link.buffer_bytes" and e.value.allowed.startswith("3028 <= buffer_bytes")
    assert Link(rtt_ms=10, rate_mbit=10, buffer_bdp=None, buffer_bytes=3028).queue_limit_bytes == 3028
    with pytest.raises(BufferBelowMinimum, match="18028 bytes"):
        Link(rtt_ms=10, rate_mbit=10, buffer_bdp=None, buffer_bytes=10_000, mtu_bytes=9000)


def test_a_bdp_buffer_at_rtt_zero_is_refused_with_the_way_out():
    with pytest.raises(BufferBelowMinimum) as e:
        Link(rtt_ms=0, rate_mbit=50)
    assert "give the buffer in bytes instead (buffer_bytes >= 3028)" in e.value.allowed


def test_the_queue_asked_for_is_the_queue_set_never_enlarged():
    link = Link(rtt_ms=10, rate_mbit=10, buffer_bdp=0.5)
    assert build_tree(link, PORTS).data.find("tbf").qdisc.limit_bytes == 6250 == link.queue_limit_bytes


def _spec(**over) -> dict:
    base = {"name": "t", "ccas": ["cubic"], "timeslices_ms": [10], "cpu_shares_pct": [100], "rtts_ms": [10, 40],
            "rates_mbit": [100, 10], "buffers_bdp": [1, 0.1], "repetitions": 1}
    return {**base, **over}


def test_a_spec_names_buffers_bdp_and_the_point_that_makes_it_too_small():
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict(_spec())
    assert e.value.field == "buffers_bdp[1] with rates_mbit[1] and rtts_ms[0]"
    assert "0.2422 <= buffer_bdp <= 12112 BDP at 10 Mbit/s x 10 ms" in str(e.value)
    assert CampaignSpec.from_dict(_spec(buffers_bdp=[1, 0.25])).runs == 8


def test_each_list_value_alone_is_not_judged_by_a_probe_rate():
    """A small RTT or rate is fine with a buffer that is large enough; only the combination decides."""
    spec = CampaignSpec.from_dict(_spec(rtts_ms=[0.5], rates_mbit=[100], buffers_bdp=[1]))  # 6250 bytes
    assert spec.grid()[0].link.queue_limit_bytes == 6250
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict(_spec(rtts_ms=[0.1], rates_mbit=[100], buffers_bdp=[1]))
    assert e.value.field == "buffers_bdp[0] with rates_mbit[0] and rtts_ms[0]"


@pytest.mark.parametrize("verb", ["set", "validate"])
def test_link_set_names_the_buffer_flag_before_the_testbed_is_touched(monkeypatch, capsys, verb):
    def no_testbed(args):
        raise AssertionError("the testbed was looked up before the values were checked")

    monkeypatch.setattr(cli_link, "load_testbed", no_testbed)
    assert main(["link", verb, "--rtt", "10ms", "--rate", "10mbit", "--buffer", "0.1bdp"]) == 1
    err = capsys.readouterr().err
    assert "--buffer = '0.1bdp' is not allowed: 0.2422 <= buffer_bdp <= 12112 BDP at 10 Mbit/s x 10 ms" in err


def _tbf_readback(limit: int) -> dict:
    return {"eth1": [], "eth2": [{"kind": "tbf", "handle": "bb:", "root": True,
                                  "options": {"rate": 1_250_000, "burst": 15140, "limit": limit}}]}


def test_the_effective_queue_is_read_from_the_kernels_tbf():
    link = Link(rtt_ms=10, rate_mbit=10, buffer_bdp=0.5)
    held = effective_queue(_tbf_readback(6250), PORTS, link)
    assert held == QueueHeld(queue_bytes=6250, queue_bdp=0.5,
                             in_force=QueueInForce("bbrlab", "tbf", None, "tbf's byte limit", 6250))
    assert held.to_dict() == {
        "queue_mode": "bbrlab", "limit_in_force": "tbf", "queue_bytes": 6250, "queue_packets": None,
        "queue_bytes_basis": "tbf's byte limit", "tbf_limit_bytes": 6250, "queue_bdp": 0.5}
    none = effective_queue({"eth2": []}, PORTS, link)
    assert none.queue_bytes is None and none.queue_bdp is None and none.in_force.limit_in_force is None


def _view(link: dict, meta: dict) -> RunView:
    return RunView({"run_id": "r", "scenario": _scenario(**link), "metadata": meta}, {}, "runs/r")


def _scenario(**link) -> dict:
    """A record's scenario whose link has these fields (the others a 20 ms x 100 Mbit/s link's; bbr, uncontended)."""
    base = Scenario(Link(20, 100), Contention(1, 100), Flow("bbr")).to_dict()
    return {**base, "link": {**base["link"], **link}}


def _link_json(queue_bytes: int, queue_bdp: float | None = None, in_force: QueueInForce | None = None) -> dict:
    """``metadata.link`` as a run writes it, holding ``queue_bytes`` (its counters left empty)."""
    return LinkRecord(LinkCounters({}, {}), QueueHeld(queue_bytes, queue_bdp, in_force)).to_dict()


def _buffer_columns(view: RunView) -> tuple:
    cols = {c.name: c for c in tables.RUN_SCHEMA}
    return cols["buffer_bytes"].of_record(view), cols["buffer_bdp"].of_record(view)


ASKED_TENTH = {"rtt_ms": 10, "rate_mbit": 10, "buffer_bdp": 0.1, "buffer_bytes": None}


def test_an_old_record_whose_buffer_was_enlarged_shows_what_the_kernel_held():
    """Before the floor, 0.1 BDP at 10 Mbit/s x 10 ms was set as 3000 bytes; the record's read-back says so."""
    view = _view(ASKED_TENTH, {"qdiscs": _tbf_readback(3000)})
    assert _buffer_columns(view) == (3000, 0.24)


def test_a_record_with_the_effective_queue_shows_it_and_keeps_the_asked_value_when_it_held():
    held = _view({**ASKED_TENTH, "buffer_bdp": 1 / 3},
                 {"link": _link_json(4167, 0.33336), "qdiscs": _tbf_readback(4167)})
    assert _buffer_columns(held) == (4167, 1 / 3)  # the kernel held the asked value, to the byte
    differs = _view({**ASKED_TENTH, "buffer_bdp": 0.5}, {"link": _link_json(3000)})
    assert _buffer_columns(differs) == (3000, 0.24)


def test_a_record_without_any_read_back_shows_what_was_asked():
    assert _buffer_columns(_view({**ASKED_TENTH, "buffer_bdp": 1}, {})) == (12500, 1)


def test_a_record_made_before_the_floor_reads_as_recorded_and_a_new_link_below_it_is_still_refused():
    with pytest.raises(BufferBelowMinimum):
        Link(**ASKED_TENTH)
    old = Link.recorded(**ASKED_TENTH)
    assert (old.buffer_bdp, old.queue_limit_bytes, old.queue) == (0.1, 1250, "bbrlab")
    assert Link.recorded(rtt_ms=10, rate_mbit=10) == Link(10, 10)
    with pytest.raises(ValidationError, match="link.rtt_ms"):  # every other check still holds
        Link.recorded(**{**ASKED_TENTH, "rtt_ms": -1})
    scenario = _scenario(**ASKED_TENTH)
    assert Scenario.from_record(scenario).link == old and Scenario.from_record(scenario).to_dict() == scenario
    with pytest.raises(BufferBelowMinimum):  # a plan's run is one to run: the floor holds there
        Scenario.from_dict(scenario)
