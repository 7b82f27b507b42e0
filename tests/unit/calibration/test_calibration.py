"""The calibration's pure parts: the unshaped link, the plan, the summary of run records into ceilings, the
file's schema, the staleness check and the pointer a run record keeps."""

import json

import pytest

from bbrlab.calibration import calibrate, ceilings
from bbrlab.calibration.plan import CalibrationSpec
from bbrlab.core.errors import ValidationError
from bbrlab.link.qdisc import build_tree
from bbrlab.run import ceiling
from bbrlab.run import record as rec
from bbrlab.run.ceiling import Calibration, CalibrationMismatch, PointKey
from bbrlab.scenario.linksizing import NETEM_LIMIT_HEADROOM, UNSHAPED_SIZING_RATE_MBIT
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

TESTBED = {"name": "tb", "kind": "local", "accelerator": "tcg", "sender_kernel": "6.1.0-56-amd64",
           "sender_vcpus": 1, "hypervisor": "QEMU 7.2"}


# -- the unshaped link ---------------------------------------------------------------------------

def test_unshaped_link_is_netem_delay_only_sized_never_to_drop():
    link = Link.unshaped(20)
    assert not link.shaped and link.bdp_bytes is None and link.queue_limit_bytes is None
    tree = build_tree(link, ("eth1", "eth2"))
    assert [n.kind for n in tree.data.nodes] == ["netem"] and [n.kind for n in tree.ack.nodes] == ["netem"]
    netem = tree.data.nodes[0].qdisc
    assert netem.delay_us == 10_000
    assert netem.limit_packets == pytest.approx(NETEM_LIMIT_HEADROOM * UNSHAPED_SIZING_RATE_MBIT * 1e6 / 8 * 0.02
                                                / 1500, abs=1)
    assert build_tree(Link.unshaped(0), ("eth1", "eth2")).kinds == set()  # a bare bridge


def test_unshaped_link_refuses_a_buffer_and_names_it():
    with pytest.raises(ValidationError, match="link.buffer") as e:
        Link(rtt_ms=20, rate_mbit=None)
    assert "unshaped" in str(e.value)
    with pytest.raises(ValidationError, match="link.rate_mbit"):
        Link(rtt_ms=20, rate_mbit=0)


def test_unshaped_scenario_round_trips_and_says_so_in_its_id():
    s = Scenario(Link.unshaped(20), Contention(10, 25), Flow("cubic", IperfParams(5, streams=4)))
    assert Scenario.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert "-unshaped-" in s.run_id


# -- the plan ------------------------------------------------------------------------------------

def test_points_run_full_share_once_per_rtt_plus_the_bridge_reference():
    spec = CalibrationSpec("c", (1, 10), (10, 25, 100), (10, 20), streams=(1, 4), repetitions=3)
    texts = [k.text for k in spec.points()]
    assert texts.count("sh100-rtt10ms") == 1 and "ts1ms-sh100-rtt10ms" not in texts
    assert len(texts) == 2 * 2 * 2 + 2  # contended ts x share x rtt, full share per rtt
    plan = spec.plan()
    assert len(plan) == (len(texts) + 1) * 2 * 3  # + the reference, x streams x repetitions
    assert len({s.run_id for s in plan}) == len(plan)
    assert all(s.link.rate_mbit is None and s.flow.cca == "cubic" for s in plan)
    ref = [s for s in plan if s.link.rtt_ms == 0]
    assert len(ref) == 6 and all(s.contention.unlimited for s in ref)
    assert [s.repetition for s in plan[:12]] == [0] * 12  # repetition blocks, each in a seeded order
    assert plan == CalibrationSpec("c", (1, 10), (10, 25, 100), (10, 20), streams=(1, 4)).plan()


def test_for_campaign_takes_the_grid_and_bad_values_name_their_field():
    from bbrlab.campaign.spec import CampaignSpec

    camp = CampaignSpec.from_dict({"name": "x", "ccas": ["bbr"], "timeslices_ms": [1], "cpu_shares_pct": [25, 100],
                                   "rtts_ms": [40], "rates_mbit": [100], "delay_split": "forward"})
    spec = CalibrationSpec.for_campaign(camp, repetitions=2)
    assert (spec.timeslices_ms, spec.cpu_shares_pct, spec.rtts_ms, spec.delay_split) == ((1,), (25, 100), (40,),
                                                                                        "forward")
    for bad, field_name in (({"streams": (1, 0)}, "streams[1]"), ({"repetitions": 0}, "repetitions"),
                            ({"duration_s": 2.5}, "duration_s"), ({"cpu_shares_pct": (0.01,)}, "cpu_shares_pct[0]"),
                            ({"rtts_ms": (-1,)}, "rtts_ms[0]")):
        with pytest.raises(ValidationError) as e:
            CalibrationSpec.for_campaign(camp, **bad)
        assert e.value.field.startswith(field_name)


# -- summarising run records -----------------------------------------------------------------------

def _record(scenario: Scenario, mbit: float, *, cpu_s=0.5, wait_s=4.0, emu=40.0, host=60.0, testbed=None) -> dict:
    meta = {"testbed": dict(testbed or TESTBED), "iperf": {"receiver_mbit": mbit},
            "contention": {"evidence": {"threads": [{"tid": 1, "cpu_s": cpu_s, "wait_s": wait_s, "wall_s": 5.0}]}},
            "cpu_load": {"emulator": {"busy_pct": emu, "busiest_cpu_pct": emu},
                         "sender_hypervisor": {"busy_pct": host}}}
    return rec.build_record(run_id=scenario.run_id, campaign="c", status="ok", reason=None, attempt=1,
                            started_at="2026-11-22T06:00:00.000Z", ended_at="2026-11-22T06:00:09.000Z",
                            scenario=scenario, metadata={}).to_dict() | {"metadata": meta}  # partial metadata: the calibration reads JSON


def _write_runs(tmp_path, spec, throughput, **kw):
    """One ok record per planned run, the throughput from ``throughput(scenario)``."""
    for s in spec.plan():
        d = tmp_path / "runs" / s.run_id
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(_record(s, throughput(s), **kw)))


def _mbit(s: Scenario) -> float:
    base = 40.0 if s.contention.cpu_share_pct == 25 else 200.0 if s.link.rtt_ms else 300.0
    return base + (5.0 if s.flow.params.streams == 4 else 0.0) + s.repetition  # 4 streams carry a little more


def test_ceiling_is_the_highest_run_of_the_better_stream_count(tmp_path):
    """The ceiling bounds what the sender carried: the highest run (issue #26), the median kept per stream count."""
    spec = CalibrationSpec("c", (10,), (25, 100), (20,), streams=(1, 4), repetitions=3)
    _write_runs(tmp_path, spec, _mbit)
    cal = ceilings.summarise(spec, tmp_path, TESTBED)
    point = cal.find(PointKey.of(10, 25, 20))
    assert point.ceiling_mbit == 47.0 and point.streams == 4  # the highest of 45, 46, 47
    assert point.by_streams["1"]["repetitions_mbit"] == [40.0, 41.0, 42.0]
    assert point.by_streams["1"]["median_mbit"] == 41.0 and point.by_streams["1"]["max_mbit"] == 42.0
    assert point.by_streams["4"]["median_mbit"] == 46.0 and len(point.by_streams["4"]["run_ids"]) == 3
    assert point.limit == "sender-cpu" and "ceiling 23% of the full-share ceiling" in point.evidence
    full = cal.find(PointKey.of(1, 100, 20))  # any timeslice at full share
    assert full.ceiling_mbit == 207.0 and full.timeslice_ms is None
    assert full.sender_demand_pct == 90.0 and full.limit == "sender-cpu"  # (0.5 + 4.0) / 5.0
    assert cal.reference["bridge_only_mbit"] == 307.0
    assert cal.configuration["ceiling"].startswith("highest receiver throughput of any repetition")
    assert "not the sender alone" in cal.reference["reading"]
    assert point.testbed == {k: TESTBED[k] for k in ceiling.IDENTITY}


def test_limit_follows_the_evidence():
    assert ceilings.classify_limit(95, 20)[0] == "sender-cpu"
    assert ceilings.classify_limit(50, 95)[0] == "emulator"
    assert ceilings.classify_limit(95, 95)[0] == "sender-cpu and emulator"
    assert ceilings.classify_limit(50, 50, 97)[0] == "host-cpu"
    assert ceilings.classify_limit(50, 50, 60)[0] == "undetermined"
    limit, evidence = ceilings.classify_limit(50, 50, 60, of_full_share=0.5)
    assert limit == "sender-cpu" and evidence[0] == "ceiling 50% of the full-share ceiling"
    assert ceilings.classify_limit(None, None)[0] == "undetermined"


def test_runs_from_another_kernel_are_refused(tmp_path):
    spec = CalibrationSpec("c", (10,), (25,), (20,), streams=(1,), repetitions=1, bridge_reference=False)
    _write_runs(tmp_path, spec, _mbit, testbed={**TESTBED, "sender_kernel": "6.13.0-bbr3"})
    with pytest.raises(CalibrationMismatch, match="another testbed or sender kernel"):
        ceilings.summarise(spec, tmp_path, TESTBED)


def test_a_point_whose_runs_all_failed_has_no_ceiling(tmp_path):
    spec = CalibrationSpec("c", (10,), (25, 100), (20,), streams=(1,), repetitions=1, bridge_reference=False)
    cal = ceilings.summarise(spec, tmp_path, TESTBED)  # no runs at all
    assert [p.ceiling_mbit for p in cal.points] == [None, None]
    assert cal.missing(spec.plan()) == ["sh100-rtt20ms", "ts10ms-sh25-rtt20ms"]


# -- the file, staleness and the pointer -------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    spec = CalibrationSpec("c", (10,), (25, 100), (20,), streams=(1, 4), repetitions=3)
    runs = tmp_path / "camp" / "calibration" / "x"
    runs.mkdir(parents=True)
    _write_runs(runs, spec, _mbit)
    cal = ceilings.summarise(spec, runs, TESTBED, runs_dir_text="calibration/x")
    cal.save(tmp_path / "camp" / ceiling.FILE_NAME)
    return cal


def test_file_round_trips_with_its_schema(saved):
    data = json.loads(saved.path.read_text())
    assert data["schema"] == "bbrlab.calibration/1" and list(data)[0] == "schema"
    assert {"created_at", "testbed", "configuration", "points", "runs_dir", "host_load", "reference"} <= set(data)
    assert data["configuration"]["cca"] == "cubic" and data["configuration"]["streams"] == [1, 4]
    again = ceiling.load(saved.path.parent)  # a directory holding calibration.json
    assert again.to_dict() == saved.to_dict() and again.digest() == saved.digest()


def test_a_bad_file_is_refused_naming_what_is_wrong(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"schema": "bbrlab.calibration/0"}))
    with pytest.raises(ValidationError, match="schema"):
        ceiling.load(path)
    path.write_text(json.dumps({"schema": ceiling.SCHEMA, "created_at": "x", "testbed": {}, "configuration": {},
                                "points": [{"key": "k"}]}))
    with pytest.raises(ValidationError, match=r"points\[0\]"):
        ceiling.load(path)


@pytest.mark.parametrize("field", ["name", "accelerator", "sender_kernel", "sender_vcpus", "kind"])
def test_a_calibration_of_another_testbed_is_not_used(saved, field):
    other = {**TESTBED, field: "something else"}
    assert saved.mismatches(other) and field in saved.mismatches(other)[0]
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(10, 25), Flow("bbr", IperfParams(10)))
    with pytest.raises(CalibrationMismatch, match=field):
        saved.pointer(scenario, other)
    assert saved.mismatches({**TESTBED, "hypervisor": "QEMU 8"}) == []  # not part of the identity


def test_pointer_names_value_source_and_key(saved):
    run = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(10, 25), Flow("bbr", IperfParams(10)))
    p = saved.pointer(run, TESTBED, "calibration.json")
    assert p.value_mbit == 47.0 and p.key == "ts10ms-sh25-rtt20ms" and p.source == "calibration.json"
    assert p.file_sha256 == saved.digest() and p.limit == "sender-cpu"
    full = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(1, 100), Flow("bbr", IperfParams(10)))
    assert saved.pointer(full, TESTBED).key == "sh100-rtt20ms"
    elsewhere = Scenario(Link(rtt_ms=40, rate_mbit=50), Contention(10, 25), Flow("bbr", IperfParams(10)))
    with pytest.raises(CalibrationMismatch, match="ts10ms-sh25-rtt40ms"):
        saved.pointer(elsewhere, TESTBED)
    assert saved.missing([run, full, elsewhere]) == ["ts10ms-sh25-rtt40ms"]


def test_source_is_relative_to_the_campaign_directory(saved, tmp_path):
    assert ceiling.source_for(saved, tmp_path / "camp") == "calibration.json"
    assert ceiling.source_for(saved, tmp_path / "other") == "../camp/calibration.json"


def test_grid_text_names_every_point_and_the_reference(saved):
    text = calibrate.format_grid(saved)
    assert "47.0" in text and "207.0" in text and "bridge reference" in text and "sender kernel 6.1.0-56" in text
    assert isinstance(Calibration.from_dict(saved.to_dict()).points[0].evidence, list)


# -- a ceiling per contention model (#28) ----------------------------------------------------------

def test_each_model_has_points_of_its_own_and_a_run_finds_its_models_ceiling(tmp_path):
    """A cfs-quota run at 25 % of 100 ms has timeslice_ms 25 (its quota), as a deadline run at 25 ms would: the
    key holds the model, so neither takes the other's ceiling; competing-load (timeslice 1) is not deadline at 1 ms."""
    from bbrlab.campaign.spec import CampaignSpec

    camp = CampaignSpec.from_dict({"name": "m", "ccas": ["cubic"], "timeslices_ms": [1, 25], "cpu_shares_pct": [25, 100],
                                   "rtts_ms": [20], "rates_mbit": [10], "repetitions": 1,
                                   "contention_models": ["deadline", "cfs-quota", "credit", "competing-load"],
                                   "credits_s": [4]})
    spec = CalibrationSpec.for_campaign(camp, repetitions=1, streams=(1,))
    texts = [k.text for k in spec.points()]
    assert texts == ["sh100-rtt20ms", "ts1ms-sh25-rtt20ms", "ts25ms-sh25-rtt20ms", "cfs100ms-sh25-rtt20ms",
                     "credit4s-cfs100ms-sh25-rtt20ms", "load-sh25-rtt20ms"]
    assert CalibrationSpec.from_dict(spec.to_dict()) == spec
    mbit = {"ts25ms": 30.0, "cfs100ms": 12.0, "credit4s-cfs100ms": 50.0, "load": 20.0, "ts1ms": 8.0}

    def throughput(s: Scenario) -> float:
        return 200.0 if s.contention.unlimited else mbit[PointKey.of_scenario(s).model_tag or
                                                         f"ts{s.contention.timeslice_ms:g}ms"]
    _write_runs(tmp_path, spec, throughput)
    cal = ceilings.summarise(spec, tmp_path, TESTBED)
    for s in camp.plan():
        point = cal.find(PointKey.of_scenario(s))
        assert point is not None and point.ceiling_mbit == throughput(s), s.run_id
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.find(PointKey.of_scenario(camp.plan()[0])) is not None
    assert "model_tag" not in cal.to_dict()["points"][0] and cal.to_dict()["points"][3]["model_tag"] == "cfs100ms"
    assert "cfs100ms" in calibrate.format_grid(cal)


def test_a_deadline_calibration_keeps_its_digest_and_needs_timeslices():
    spec = CalibrationSpec("c", (10,), (25,), (20,))
    assert "model_contentions" not in spec.to_dict()
    with pytest.raises(ValidationError) as e:
        CalibrationSpec("c", (), (25,), (20,))
    assert e.value.field == "timeslices_ms"
    with pytest.raises(ValidationError) as e:
        CalibrationSpec("c", (), (25,), (20,), model_contentions=({"timeslice_ms": 1, "cpu_share_pct": 25},))
    assert e.value.field == "model_contentions[0]" and "another model than deadline" in e.value.allowed
