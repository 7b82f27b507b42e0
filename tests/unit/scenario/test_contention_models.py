"""Contention models beside SCHED_DEADLINE (#28): their checks name the field and what is allowed, deadline
scenarios keep their JSON and run ids, and a spec crosses models with shares."""

from __future__ import annotations

import pytest

from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.scenario.contention_models import load_share_pct, load_threads
from bbrlab.scenario.cpumodels import BurstParams, CfsParams, CreditParams
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario

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
    assert c.params.period_ms == 100 and c.to_dict() == {"timeslice_ms": 25, "cpu_share_pct": 25, "model": "cfs-quota",
                                                   "period_ms": 100}
    s = _scenario(c)
    assert "-cfs100ms-sh25-" in s.run_id and Scenario.from_dict(s.to_dict()) == s
    assert "-load-sh25-" in _scenario(Contention(1, 25, "competing-load")).run_id
    assert "-none-sh100-" in _scenario(Contention(1, 100, "none")).run_id


@pytest.mark.parametrize("kwargs, field, words", [
    ({"model": "steal"}, "contention.model", "one of deadline, cfs-quota, cfs-burst, credit, competing-load, none"),
    ({"model": "deadline", "period_ms": 10}, "contention.period_ms", "none except for models cfs-quota, cfs-burst"),
    ({"model": "cfs-quota", "period_ms": 0.5}, "contention.period_ms", "1 <= period_ms <= 1000 ms"),
    ({"model": "cfs-quota", "period_ms": 2000}, "contention.period_ms", "1 <= period_ms <= 1000 ms"),
    ({"model": "cfs-quota", "period_ms": 2, "cpu_share_pct": 25}, "contention.cpu_share_pct", "at least 1 ms"),
    ({"model": "none"}, "contention.cpu_share_pct", "100 with model none"),
    ({"model": "competing-load", "cpu_share_pct": 1}, "contention.cpu_share_pct", "1 to 64 competing threads"),
])
def test_each_model_checks_its_parameters_and_names_the_field(kwargs, field, words):
    with pytest.raises(ValidationError) as e:
        Contention.from_dict({"timeslice_ms": 1, "cpu_share_pct": 10, **kwargs})
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
    assert got[4:] == [Contention(2.5, 25, "cfs-quota", CfsParams(10)), Contention(5, 50, "cfs-quota", CfsParams(10)),
                       Contention(25, 25, "cfs-quota", CfsParams(100)), Contention(50, 50, "cfs-quota", CfsParams(100)),
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


@pytest.mark.parametrize("kwargs, field, words", [
    ({"model": "cfs-burst", "cpu_share_pct": 25}, "contention.burst_ms", "a number with model cfs-burst"),
    ({"model": "cfs-quota", "burst_ms": 5}, "contention.burst_ms", "none with the others"),
    ({"model": "cfs-burst", "cpu_share_pct": 25, "burst_ms": 30}, "contention.burst_ms",
     "0 < burst_ms <= the quota (share x period_ms = 25 ms"),
    ({"model": "cfs-burst", "cpu_share_pct": 25, "burst_ms": 0}, "contention.burst_ms", "0 < burst_ms"),
    ({"model": "cfs-burst", "cpu_share_pct": 25, "burst_ms": "5"}, "contention.burst_ms", "a number"),
    ({"model": "credit", "cpu_share_pct": 25}, "contention.credit_s", "a number with model credit"),
    ({"model": "deadline", "credit_s": 5}, "contention.credit_s", "none with the others"),
    ({"model": "credit", "cpu_share_pct": 25, "credit_s": 0}, "contention.credit_s", "0 < credit_s <= 3600"),
    ({"model": "credit", "cpu_share_pct": 25, "credit_s": 4000}, "contention.credit_s", "CPU-seconds"),
    ({"model": "credit", "cpu_share_pct": 0.5, "credit_s": 5}, "contention.cpu_share_pct", "at least 1 ms"),
])
def test_burst_and_credit_check_their_parameters_and_name_the_field(kwargs, field, words):
    with pytest.raises(ValidationError) as e:
        Contention.from_dict({"timeslice_ms": 1, "cpu_share_pct": 10, **kwargs})
    assert e.value.field == field and words in str(e.value)


def test_burst_and_credit_say_their_parameters_in_json_and_run_id():
    b = Contention(25, 25, "cfs-burst", BurstParams(burst_ms=5))
    assert b.params.period_ms == 100 and b.to_dict() == {"timeslice_ms": 25, "cpu_share_pct": 25, "model": "cfs-burst",
                                                   "period_ms": 100, "burst_ms": 5}
    c = Contention(25, 25, "credit", CreditParams(credit_s=8))
    assert c.to_dict()["credit_s"] == 8 and "burst_ms" not in c.to_dict()
    for contention, tag in ((b, "-cfs100ms-burst5ms-sh25-"), (c, "-credit8s-cfs100ms-sh25-")):
        s = _scenario(contention)
        assert tag in s.run_id and Scenario.from_dict(s.to_dict()) == s


def test_a_spec_crosses_burst_and_credit_with_shares_and_counts_its_runs():
    spec = CampaignSpec.from_dict({**SPEC, "contention_models": ["cfs-burst", "credit", "none"], "cfs_periods_ms": [100],
                                   "cfs_bursts_ms": [5, 10], "credits_s": [4]})
    got = [s.contention for s in spec.grid()]
    burst, credit = (lambda ms: BurstParams(period_ms=100, burst_ms=ms)), (lambda s: CreditParams(credit_s=s))
    assert got == [Contention(25, 25, "cfs-burst", burst(5)), Contention(50, 50, "cfs-burst", burst(5)),
                   Contention(25, 25, "cfs-burst", burst(10)), Contention(50, 50, "cfs-burst", burst(10)),
                   Contention(25, 25, "credit", credit(4)), Contention(50, 50, "credit", credit(4)),
                   Contention(1, 100, "none")]
    assert spec.runs == len(spec.plan()) == 7
    assert CampaignSpec.from_dict(spec.to_dict()) == spec
    default = CampaignSpec.from_dict(SPEC)
    assert "cfs_bursts_ms" not in default.to_dict() and "credits_s" not in default.to_dict()


@pytest.mark.parametrize("extra, field", [
    ({"contention_models": ["cfs-burst"], "cfs_periods_ms": [10], "cfs_bursts_ms": [3]},
     "cpu_shares_pct[0] with cfs_periods_ms[0] and cfs_bursts_ms[0]"),
    ({"contention_models": ["credit"], "credits_s": [0]}, "credits_s[0]"),
    ({"cfs_bursts_ms": [-1]}, "cfs_bursts_ms[0]"),
])
def test_a_spec_names_the_bad_burst_or_credit_key(extra, field):
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**SPEC, **extra})
    assert e.value.field == field


def test_credit_may_cross_with_baselines_of_its_own():
    spec = CampaignSpec.from_dict({**SPEC, "contention_models": ["cfs-quota", "credit"], "credits_s": [1],
                                   "credit_shares_pct": [5, 25]})
    got = [s.contention for s in spec.grid()]
    assert got[2:] == [Contention(5, 5, "credit", CreditParams(credit_s=1)), Contention(25, 25, "credit", CreditParams(credit_s=1))]
    assert spec.runs == len(spec.plan()) == 4 and CampaignSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**SPEC, "contention_models": ["credit"], "credit_shares_pct": [0.5]})
    assert e.value.field == "credit_shares_pct[0] with credits_s[0]" and "at least 1 ms" in e.value.allowed


def test_a_campaign_refuses_other_models_for_a_sender_on_another_host_before_it_starts():
    """preflight.check_models, against this machine (the cgroup models apply here) and a lab hypervisor (an
    SSHHost object: nothing connects, it only says it is not this machine)."""
    from bbrlab.campaign.preflight import check_models
    from bbrlab.core.hosts import LocalHost, SSHHost

    spec = CampaignSpec.from_dict({**SPEC, "contention_models": ["deadline", "cfs-burst", "credit"]})
    check_models(spec, LocalHost())  # this host: cgroup v1 cpu with cpu.cfs_burst_us
    with pytest.raises(ValidationError) as e:
        check_models(spec, SSHHost(name="hv", address="192.0.2.1"))
    assert e.value.field == "contention_models" and "another host (hv)" in e.value.allowed
    check_models(CampaignSpec.from_dict(SPEC), SSHHost(name="hv", address="192.0.2.1"))  # deadline only: fine


def test_the_contention_params_type_is_the_union_of_the_models_params_types():
    from typing import get_args

    from bbrlab.scenario.cpumodels import MODELS, ContentionParams

    assert set(get_args(ContentionParams)) == {m.params_type for m in MODELS.values()}
