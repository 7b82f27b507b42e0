"""The sender's qdisc and extra flows as scenario fields and spec keys: validated, recorded, in the run id."""

import pytest

from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, RsyncParams, Scenario

BASE = dict(name="pair", ccas=["bbr", "bbr2b"], timeslices_ms=[10], cpu_shares_pct=[50, 100], rtts_ms=[20],
            rates_mbit=[20], repetitions=2, duration_s=30)
CUBIC = {"cca": "cubic", "origin": "competitor", "start_s": 3, "duration_s": 27}


def _scenario(**kw) -> Scenario:
    return Scenario(Link(rtt_ms=20, rate_mbit=20), Contention(10, 50), Flow("bbr", IperfParams(duration_s=30)), **kw)


def test_defaults_leave_the_record_and_run_id_as_before():
    plain = _scenario()
    assert "sender_qdisc" not in plain.to_dict() and "flows" not in plain.to_dict()
    assert plain.run_id == Scenario(plain.link, plain.contention, plain.flow).run_id
    assert "-fq" not in plain.run_id and "-and-" not in plain.run_id


def test_qdisc_and_flows_are_recorded_read_back_and_name_the_run():
    s = _scenario(sender_qdisc="fq", flows=[CUBIC])
    assert s.to_dict()["sender_qdisc"] == "fq" and s.to_dict()["flows"][0]["origin"] == "competitor"
    assert Scenario.from_dict(s.to_dict()) == s and Scenario.from_dict(s.to_dict()).run_id == s.run_id
    assert "-fq-and-cubic-comp3s-r00-" in s.run_id
    assert len({s.run_id, _scenario(flows=[CUBIC]).run_id, _scenario(sender_qdisc="fq").run_id,
                _scenario(flows=[{**CUBIC, "origin": "sender"}]).run_id}) == 4


@pytest.mark.parametrize(("kw", "field"), [
    ({"sender_qdisc": "fq_codel"}, "sender_qdisc"),
    ({"sender_qdisc": None}, "sender_qdisc"),
    ({"flows": [{**CUBIC, "origin": "receiver"}]}, "flows[1].origin"),
    ({"flows": [{**CUBIC, "start_s": 30}]}, "flows[1].start_s"),
    ({"flows": [{**CUBIC, "start_s": -1}]}, "flows[1].start_s"),
    ({"flows": [{**CUBIC, "duration_s": 2.5}]}, "flows[1].duration_s"),
    ({"flows": [CUBIC, {**CUBIC, "streams": 0}]}, "flows[2].streams"),
    ({"flows": [{**CUBIC, "cca": "Cubic!"}]}, "flows[1].cca"),
    ({"flows": [{"origin": "sender"}]}, "flows[1]"),
    ({"flows": [CUBIC] * 9}, "flows"),
])
def test_bad_values_name_their_field(kw, field):
    with pytest.raises(ValidationError) as e:
        _scenario(**kw)
    assert e.value.field == field


def test_extra_flows_go_beside_iperf3_only():
    with pytest.raises(ValidationError, match="rsync") as e:
        Scenario(Link(rtt_ms=20, rate_mbit=20), Contention(10, 50), Flow("bbr", RsyncParams()), flows=[CUBIC])
    assert e.value.field == "flows"


def test_spec_crosses_the_qdiscs_and_gives_every_run_its_flows():
    spec = CampaignSpec.from_dict({**BASE, "sender_qdiscs": ["default", "fq"], "flows": [CUBIC]})
    plan = spec.plan()
    assert len(plan) == spec.runs == 2 * 2 * 2 * 2
    assert {s.sender_qdisc for s in plan} == {"default", "fq"}
    assert all(s.flows[0].cca == "cubic" and s.flows[0].start_s == 3 for s in plan)
    assert len({s.run_id for s in plan}) == len(plan)
    assert CampaignSpec.from_dict(spec.to_dict()) == spec
    assert spec.expected_duration_s(overhead_s=0) == 16 * 30  # the cubic flow ends with flow 0, at 30 s
    plain = CampaignSpec.from_dict(BASE).to_dict()
    assert "sender_qdiscs" not in plain and "flows" not in plain


@pytest.mark.parametrize(("extra", "field"), [
    ({"sender_qdiscs": ["fq", "pfifo"]}, "sender_qdiscs[1]"),
    ({"sender_qdiscs": ["fq", "fq"]}, "sender_qdiscs"),
    ({"sender_qdiscs": []}, "sender_qdiscs"),
    ({"flows": [{**CUBIC, "start_s": 31}]}, "flows[1].start_s with duration_s"),
    ({"flows": [{**CUBIC, "colour": "red"}]}, "flows[1]"),
    ({"flows": "cubic"}, "flows"),
    ({"flows": [CUBIC], "workloads": ["iperf3", "rsync"], "streams": [1]}, "flows with workloads[1]"),
])
def test_spec_refuses_bad_qdiscs_and_flows_naming_the_key(extra, field):
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**BASE, **extra})
    assert e.value.field == field


def test_each_extra_flow_binds_a_block_of_ports_of_its_own():
    from bbrlab.run import flows

    base = list(range(31_392, 31_396))  # the last block of flow 0's range
    blocks = [flows.flow_ports(base, i, 128) for i in range(1, 9)]
    everything = [p for b in [base, *blocks] for p in b]
    assert len(set(everything)) == len(everything) and min(everything) >= 20_000 and max(everything) < 32_768


def test_a_competitor_flow_on_a_labs_testbed_is_refused_naming_the_flow():
    from types import SimpleNamespace

    from bbrlab.run import flows

    s = _scenario(flows=[{**CUBIC, "origin": "sender"}, CUBIC])
    flows.check_origins(SimpleNamespace(kind="local"), s.flows)
    with pytest.raises(ValidationError) as e:
        flows.check_origins(SimpleNamespace(kind="lab"), s.flows)
    assert e.value.field == "flows[2].origin"
