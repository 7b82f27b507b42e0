"""The queue tree as a campaign dimension, and the tables' queue columns (issue #26): what was in force,
never the buffer asked where it was not, for bbrlab's records and for the authors' dataset."""

from __future__ import annotations

import math

import pytest

from bbrlab.analysis import authors, tables
from bbrlab.analysis.records_reader import RunView
from bbrlab.campaign.spec import CampaignSpec, spec_from_yaml
from bbrlab.core.errors import ValidationError
from bbrlab.link.counters import LinkCounters, LinkRecord, QueueHeld, QueueInForce
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario

SPEC = {"name": "q", "ccas": ["cubic", "bbr"], "timeslices_ms": [10], "cpu_shares_pct": [25, 100], "rtts_ms": [20],
        "rates_mbit": [10, 100], "buffers_bdp": [1, 4], "repetitions": 2}


# -- the spec ----------------------------------------------------------------------------------------------
def test_queues_is_a_dimension_crossed_with_the_others():
    spec = CampaignSpec.from_dict({**SPEC, "queues": ["bbrlab", "authors"], "emulator_offloads": "on"})
    grid = spec.grid()
    assert spec.runs == 2 * 2 * 2 * 2 * 2 * 2 == len(spec.plan())
    assert {(s.link.queue, s.link.buffer_bdp) for s in grid} == {(q, b) for q in ("bbrlab", "authors") for b in (1, 4)}
    assert all(s.link.emulator_offloads == "on" for s in grid)
    assert len({s.run_id for s in spec.plan()}) == spec.runs
    assert spec.to_dict()["queues"] == ["bbrlab", "authors"] and spec.to_dict()["emulator_offloads"] == "on"
    assert CampaignSpec.from_dict(spec.to_dict()) == spec


def test_a_spec_without_the_new_keys_plans_the_same_runs_as_before():
    spec = CampaignSpec.from_dict(SPEC)
    assert "queues" not in spec.to_dict() and "emulator_offloads" not in spec.to_dict()  # spec.yaml unchanged
    assert all(s.link.queue == "bbrlab" and "-qauthors" not in s.run_id for s in spec.plan())
    assert spec.plan()[0].run_id == CampaignSpec.from_dict({**SPEC, "queues": ["bbrlab"]}).plan()[0].run_id


def test_yaml_reads_unquoted_on_and_off_as_the_offload_setting():
    text = "name: y\nccas: [cubic]\ntimeslices_ms: [1]\ncpu_shares_pct: [100]\nrtts_ms: [20]\nrates_mbit: [100]\n"
    assert spec_from_yaml(text + "emulator_offloads: on\n").emulator_offloads == "on"
    assert spec_from_yaml(text + "emulator_offloads: off\n").emulator_offloads == "off"
    assert spec_from_yaml(text + "queues: [authors]\n").grid()[0].link.queue == "authors"


@pytest.mark.parametrize("over, field", [
    ({"queues": ["bbrlab", "fifo"]}, "queues[1]"),
    ({"queues": ["authors", "authors"]}, "queues"),
    ({"queues": ["authors"], "rates_mbit": [1, 100]}, "rates_mbit[0] with rtts_ms[0] and buffers_bdp[0] and queues[0]"),
    ({"emulator_offloads": "auto"}, "emulator_offloads"),
    ({"buffers_bdp": [0]}, "buffers_bdp[0]"),
])
def test_bad_queue_keys_name_the_key(over, field):
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**SPEC, **over})
    assert e.value.field == field


def test_buffers_up_to_the_authors_queue_pass_where_the_rate_x_rtt_allows_them():
    deep = CampaignSpec.from_dict({**SPEC, "rates_mbit": [10], "rtts_ms": [10], "buffers_bdp": [1, 12_112]})
    assert max(s.link.queue_limit_bytes for s in deep.grid()) == 151_400_000
    with pytest.raises(ValidationError) as e:  # 100 Mbit/s x 20 ms: 605.6 BDP is the authors' queue, 1000 allowed
        CampaignSpec.from_dict({**SPEC, "rates_mbit": [100], "buffers_bdp": [1, 12_112]})
    assert e.value.field == "buffers_bdp[1] with rates_mbit[0] and rtts_ms[0]"
    assert "0 < buffer_bdp <= 1000 BDP at 100 Mbit/s x 20 ms" in e.value.allowed


# -- the tables: bbrlab's records ------------------------------------------------------------------------------
def _row(link: dict, meta: dict, summary: dict | None = None) -> dict:
    view = RunView({"run_id": "r", "scenario": _scenario(**link), "metadata": meta}, summary or {}, "runs/r")
    return {c.name: c.of_record(view) for c in tables.RUN_SCHEMA}


def _scenario(**link) -> dict:
    """A record's scenario whose link has these fields (the others a 20 ms x 100 Mbit/s link's; bbr, uncontended)."""
    base = Scenario(Link(20, 100), Contention(1, 100), Flow("bbr")).to_dict()
    return {**base, "link": {**base["link"], **link}}


def _link_json(queue_bytes: int, queue_bdp: float | None = None, in_force: QueueInForce | None = None) -> dict:
    """``metadata.link`` as a run writes it, holding ``queue_bytes`` (its counters left empty)."""
    return LinkRecord(LinkCounters({}, {}), QueueHeld(queue_bytes, queue_bdp, in_force)).to_dict()


AUTHORS_META = {"link": _link_json(151_400_000, 605.6, QueueInForce("authors", "netem", 100_000,
                                                                 "netem's packet limit x full-size frames", 250_000))}
AUTHORS_LINK = {"rtt_ms": 20, "rate_mbit": 100, "buffer_bdp": 1, "buffer_bytes": None, "queue": "authors",
                "emulator_offloads": "on"}


def test_an_authors_tree_run_shows_netems_queue_and_keeps_the_asked_buffer_apart():
    row = _row(AUTHORS_LINK, AUTHORS_META)
    assert (row["queue_mode"], row["queue_limit_qdisc"], row["queue_limit_packets"]) == ("authors", "netem", 100_000)
    assert row["buffer_bytes"] == 151_400_000 and row["buffer_bdp"] == pytest.approx(605.6)
    assert row["buffer_asked_bdp"] == 1 and row["emulator_offloads"] == "on"


def test_an_authors_tree_run_without_a_read_back_still_never_shows_the_asked_buffer():
    row = _row(AUTHORS_LINK, {})  # e.g. a run that failed before its read-back
    assert row["buffer_bytes"] == 151_400_000 and row["queue_limit_packets"] == 100_000
    assert row["buffer_bdp"] == pytest.approx(605.6)


def test_a_run_of_bbrlabs_tree_and_an_old_record_show_tbfs_limit():
    new = _row({"rtt_ms": 20, "rate_mbit": 100, "buffer_bdp": 2, "buffer_bytes": None},
               {"link": _link_json(500_000, None, QueueInForce("bbrlab", "tbf", None, "tbf's byte limit", 500_000))})
    old = _row({"rtt_ms": 20, "rate_mbit": 100, "buffer_bdp": 1, "buffer_bytes": None},
               {"link": _link_json(250_000, 1.0)})
    for row, bdp in ((new, 2), (old, 1)):
        assert (row["queue_mode"], row["queue_limit_qdisc"], row["buffer_bdp"], row["buffer_asked_bdp"]) == \
            ("bbrlab", "tbf", bdp, bdp)
        assert row["queue_limit_packets"] is None and row["emulator_offloads"] == "off"
    unshaped = _row({"rtt_ms": 20, "rate_mbit": None, "buffer_bdp": None, "buffer_bytes": None}, {})
    assert unshaped["queue_limit_qdisc"] is None and unshaped["buffer_bytes"] is None


def test_the_new_columns_are_part_of_a_point_and_of_the_docs():
    assert {"queue_mode", "emulator_offloads"} <= set(tables.POINT_COLUMNS)
    for name in ("queue_mode", "queue_limit_qdisc", "queue_limit_packets", "buffer_asked_bdp", "emulator_offloads",
                 "above_ceiling"):
        assert name in tables.RUN_COLUMNS
    frame = tables.build_tables([tables.RunRows(_row(AUTHORS_LINK, AUTHORS_META), [], [])]).runs
    assert str(frame["queue_limit_packets"].dtype) == "Int64" and frame.loc[0, "queue_limit_packets"] == 100_000


# -- the authors' dataset ---------------------------------------------------------------------------------------
def test_the_authors_dataset_records_netems_100000_packets_whatever_the_buffer_says():
    meta = {"rate": "100", "delay_rtt": "20", "buffer_size_bytes": "250000", "bdp": "1", "cca": "cubic",
            "kernel": "kernel6-1", "parallel": "1"}
    p = authors.point_params(meta)
    assert p["buffer_asked_bdp"] == 1.0  # what they asked: tbf's limit, not in force
    assert (p["queue_mode"], p["queue_limit_qdisc"], p["queue_limit_packets"]) == ("authors", "netem", 100_000)
    assert p["buffer_bytes"] == 100_000 * 1514 and p["buffer_bdp"] == pytest.approx(151_400_000 / 250_000)
    assert p["emulator_offloads"] == "on"
    ten = authors.point_params({**meta, "rate": "10", "delay_rtt": "10", "buffer_size_bytes": "12500"})
    assert ten["buffer_bdp"] == pytest.approx(12_112) and ten["buffer_asked_bdp"] == 1.0  # bdp key given: as said
    no_bdp = authors.point_params({k: v for k, v in meta.items() if k != "bdp"} | {"buffer_size_bytes": "500000"})
    assert no_bdp["buffer_asked_bdp"] == 2.0
    assert math.isnan(authors.authors_queue(0.0)["buffer_bdp"])  # a socket log: no rate x RTT, no BDP
