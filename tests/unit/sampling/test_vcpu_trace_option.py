"""The flow option ``vcpu_trace`` (auto, on, off): validated before anything runs, absent from the run id's
form when auto (the run ids made before it stay the same), in campaign specs as ``vcpu_trace``."""

from __future__ import annotations

import pytest

from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.run.runner import traces_vcpu
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario


def test_auto_leaves_the_flow_and_its_run_id_as_before():
    flow = Flow("bbr", sample_ms=10)
    assert "vcpu_trace" not in flow.to_dict()
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=100), Contention(1, 25), flow)
    on = Scenario(Link(rtt_ms=20, rate_mbit=100), Contention(1, 25), Flow("bbr", sample_ms=10, vcpu_trace="on"))
    assert scenario.run_id != on.run_id and Flow.from_dict(on.flow.to_dict()) == on.flow


@pytest.mark.parametrize("value", ["yes", "", None, 1, "ON"])
def test_a_bad_value_names_the_field(value):
    with pytest.raises(ValidationError, match="flow.vcpu_trace"):
        Flow("bbr", vcpu_trace=value)


def test_auto_traces_sampled_runs_only():
    assert traces_vcpu(Flow("bbr", sample_ms=10)) and not traces_vcpu(Flow("bbr"))
    assert traces_vcpu(Flow("bbr", vcpu_trace="on")) and not traces_vcpu(Flow("bbr", sample_ms=10, vcpu_trace="off"))


def _spec(**extra) -> dict:
    return {"name": "t", "ccas": ["bbr"], "timeslices_ms": [1], "cpu_shares_pct": [25], "rtts_ms": [20],
            "rates_mbit": [100], **extra}


def test_a_spec_passes_it_to_every_flow_and_names_its_key_when_bad():
    spec = CampaignSpec.from_dict(_spec(vcpu_trace="off", sample_ms=10))
    assert {s.flow.vcpu_trace for s in spec.plan()} == {"off"}
    with pytest.raises(ValidationError, match="^vcpu_trace"):
        CampaignSpec.from_dict(_spec(vcpu_trace="always"))
