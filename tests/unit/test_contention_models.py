"""Contention models beside SCHED_DEADLINE (#28): their checks name the field and what is allowed, deadline
scenarios keep their JSON and run ids, and a spec crosses models with shares."""

from __future__ import annotations

import pytest

from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.contention_models import load_share_pct, load_threads
from bbrlab.core.errors import ValidationError
from bbrlab.core.scenario import Contention, Flow, Link, Scenario

SPEC = {"name": "m", "ccas": ["cubic"], "timeslices_ms": [1, 10], "cpu_shares_pct": [25, 50], "rtts_ms": [10],
        "rates_mbit": [100], "repetitions": 1}


def _scenario(c: Contention) -> Scenario:
    return Scenario(Link(rtt_ms=10, rate_mbit=100), c, Flow("cubic"))


def test_a_deadline_scenario_keeps_its_json_and_run_id():
    s = _scenario(Contention(1, 25))
    assert s.to_dict()["contention"] == {"timeslice_ms": 1, "cpu_share_pct": 25}
    assert s.run_id.startswith("cubic-ts1ms-sh25-rtt10ms-100mbit-r00-")
    assert Scenario.from_dict(s.to_dict()) == s
    assert Contention(1, 25, "deadline") == Contention(1, 25)


def test_cfs_quota_defaults_to_a_100_ms_period_and_says_so_in_its_id():
    c = Contention(25, 25, "cfs-quota")
    assert c.period_ms == 100 and c.to_dict() == {"timeslice_ms": 25, "cpu_share_pct": 25, "model": "cfs-quota",
                                                   "period_ms": 100}
    s = _scenario(c)
    assert "-cfs100ms-sh25-" in s.run_id and Scenario.from_dict(s.to_dict()) == s
    assert "-load-sh25-" in _scenario(Contention(1, 25, "competing-load")).run_id
    assert "-none-sh100-" in _scenario(Contention(1, 100, "none")).run_id


@pytest.mark.parametrize("kwargs, field, words", [
    ({"model": "credit"}, "contention.model", "one of deadline, cfs-quota, competing-load, none"),
    ({"model": "deadline", "period_ms": 10}, "contention.period_ms", "none except for model cfs-quota"),
    ({"model": "cfs-quota", "period_ms": 0.5}, "contention.period_ms", "1 <= period_ms <= 1000 ms"),
    ({"model": "cfs-quota", "period_ms": 2000}, "contention.period_ms", "1 <= period_ms <= 1000 ms"),
    ({"model": "cfs-quota", "period_ms": 2, "cpu_share_pct": 25}, "contention.cpu_share_pct", "at least 1 ms"),
    ({"model": "none"}, "contention.cpu_share_pct", "100 with model none"),
    ({"model": "competing-load", "cpu_share_pct": 1}, "contention.cpu_share_pct", "1 to 64 competing threads"),
])
def test_each_model_checks_its_parameters_and_names_the_field(kwargs, field, words):
    with pytest.raises(ValidationError) as e:
        Contention(**{"timeslice_ms": 1, "cpu_share_pct": 10, **kwargs})
    assert e.value.field == field and words in str(e.value)


def test_competing_load_rounds_half_up_and_records_what_it_gives():
    assert [load_threads(s) for s in (50, 25, 40, 10, 33.4, 100)] == [1, 3, 2, 9, 2, 0]
    assert load_share_pct(2) == pytest.approx(33.33, abs=0.01)
    assert Contention(1, 25, "competing-load").load_threads == 3 and Contention(1, 25).load_threads == 0


def test_a_spec_without_models_plans_what_it_always_did():
    spec = CampaignSpec.from_dict(SPEC)
    assert [s.contention for s in spec.grid()] == [Contention(1, 25), Contention(1, 50), Contention(10, 25),
                                                   Contention(10, 50)]
    assert "contention_models" not in spec.to_dict() and "cfs_periods_ms" not in spec.to_dict()


def test_a_spec_crosses_models_with_shares():
    spec = CampaignSpec.from_dict({**SPEC, "contention_models": ["deadline", "cfs-quota", "competing-load", "none"],
                                   "cfs_periods_ms": [10, 100]})
    got = [s.contention for s in spec.grid()]
    assert got[4:] == [Contention(2.5, 25, "cfs-quota", 10), Contention(5, 50, "cfs-quota", 10),
                       Contention(25, 25, "cfs-quota", 100), Contention(50, 50, "cfs-quota", 100),
                       Contention(1, 25, "competing-load"), Contention(1, 50, "competing-load"),
                       Contention(1, 100, "none")]
    assert len({s.run_id for s in spec.plan()}) == len(got)
    assert CampaignSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("extra, field", [
    ({"contention_models": ["deadline", "steal"]}, "contention_models[1]"),
    ({"cfs_periods_ms": [5000]}, "cfs_periods_ms[0]"),
    ({"contention_models": ["cfs-quota"], "cfs_periods_ms": [2]}, "cpu_shares_pct[0] with cfs_periods_ms[0]"),
])
def test_a_spec_names_the_bad_model_key(extra, field):
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**SPEC, **extra})
    assert e.value.field == field
