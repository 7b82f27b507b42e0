"""Module parameters (``cca_params``) and sender sysctls (``sender_sysctls``) as dimensions of a campaign spec
(issue #38): checked with errors that name the key, crossed into the grid (a CCA's parameters with its own runs
alone), in the run id, the run identity and the runs table, and absent at their defaults, so older specs,
scenarios and run ids stay as they were."""

from __future__ import annotations

import pandas as pd
import pytest

from bbrlab.analysis import runkey, tables
from bbrlab.campaign.dimensions import BY_KEY, assignments
from bbrlab.campaign.spec import CampaignSpec, spec_from_yaml
from bbrlab.core.errors import ValidationError
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario

BASE = {"name": "t", "ccas": ["cubic", "bbr2b"], "timeslices_ms": [1], "cpu_shares_pct": [50], "rtts_ms": [10],
        "rates_mbit": [100], "repetitions": 1}
GAINS = {"bbr2b": {"deficit_gain": [512, 739, 1023]}}
LIMITS = {"net.ipv4.tcp_limit_output_bytes": [262144, 1048576], "net.ipv4.tcp_pacing_ss_ratio": [200]}


def test_assignments_cross_every_named_list():
    assert assignments((("a", (1, 2)), ("b", (3,)))) == [(("a", 1), ("b", 3)), (("a", 2), ("b", 3))]
    assert assignments(()) == [()]


def test_a_ccas_parameters_cross_its_own_runs_alone():
    spec = CampaignSpec.from_dict({**BASE, "cca_params": GAINS})
    grid = spec.grid()
    assert [(s.flow.cca, s.cca_params) for s in grid] == [
        ("cubic", ()), ("bbr2b", (("deficit_gain", 512),)), ("bbr2b", (("deficit_gain", 739),)),
        ("bbr2b", (("deficit_gain", 1023),))]
    assert spec.runs == len(spec.plan()) == 4


def test_several_parameters_of_one_module_cross_too():
    spec = CampaignSpec.from_dict({**BASE, "ccas": ["bbr2b"], "cca_params": {
        "bbr2b": {"deficit_gain": [512, 739], "deficit_ewma_shift": [0, 2]}}})
    assert {s.cca_params for s in spec.grid()} == {
        (("deficit_ewma_shift", e), ("deficit_gain", g)) for e in (0, 2) for g in (512, 739)}
    assert spec.runs == 4


def test_sysctls_cross_every_run():
    spec = CampaignSpec.from_dict({**BASE, "sender_sysctls": LIMITS, "cca_params": GAINS})
    assert spec.runs == len(spec.grid()) == 4 * 2
    assert {s.sender_sysctls for s in spec.grid()} == {
        (("net.ipv4.tcp_limit_output_bytes", v), ("net.ipv4.tcp_pacing_ss_ratio", 200)) for v in (262144, 1048576)}


def test_spec_yaml_holds_them_as_given_and_leaves_them_out_at_their_defaults():
    spec = CampaignSpec.from_dict({**BASE, "sender_sysctls": LIMITS, "cca_params": GAINS})
    stored = spec.to_dict()
    assert stored["cca_params"] == GAINS and stored["sender_sysctls"] == LIMITS
    assert CampaignSpec.from_dict(stored) == spec
    plain = CampaignSpec.from_dict(BASE).to_dict()
    assert "cca_params" not in plain and "sender_sysctls" not in plain
    yaml_spec = spec_from_yaml("name: y\nccas: [bbr2b]\ntimeslices_ms: [1]\ncpu_shares_pct: [100]\nrtts_ms: [10]\n"
                               "rates_mbit: [100]\ncca_params: {bbr2b: {deficit_gain: [512]}}\n"
                               "sender_sysctls: {net.ipv4.tcp_autocorking: [0, 1]}\n")
    assert yaml_spec.runs == 2 * 30


@pytest.mark.parametrize(("extra", "field", "allowed"), [
    ({"cca_params": {"bbr2b": {"deficit_gain": [512, 1024]}}}, "cca_params.bbr2b.deficit_gain[1]",
     "0 <= deficit_gain <= 1023"),
    ({"cca_params": {"bbr": {"x": [1]}}}, "cca_params.bbr", "one of ccas (cubic, bbr2b)"),
    ({"cca_params": {"bbr2b": {"Gain": [1]}}}, "cca_params.bbr2b.Gain[0]", "a module parameter's name"),
    ({"cca_params": {"bbr2b": [512]}}, "cca_params.bbr2b", "a mapping of its module's parameters"),
    ({"cca_params": {"bbr2b": {"deficit_gain": []}}}, "cca_params.bbr2b.deficit_gain", "a non-empty list"),
    ({"cca_params": {"bbr2b": {"deficit_gain": [1, 1]}}}, "cca_params.bbr2b.deficit_gain", "distinct values"),
    ({"cca_params": {"bbr2b": {"deficit_gain": [1.5]}}}, "cca_params.bbr2b.deficit_gain[0]", "a whole number"),
    ({"cca_params": [1]}, "cca_params", "a mapping of CCAs"),
    ({"sender_sysctls": {"net.core.default_qdisc": [1]}}, "sender_sysctls.net.core.default_qdisc[0]",
     "sender_qdiscs sets the sender's root qdisc"),
    ({"sender_sysctls": {"kernel.panic": [1]}}, "sender_sysctls.kernel.panic[0]", "net.ipv4.tcp_limit_output_bytes"),
    ({"sender_sysctls": {"net.ipv4.tcp_pacing_ss_ratio": [200, 1001]}}, "sender_sysctls.net.ipv4.tcp_pacing_ss_ratio[1]",
     "0 <= tcp_pacing_ss_ratio <= 1000"),
    ({"sender_sysctls": {"net.ipv4.tcp_min_tso_segs": [0]}}, "sender_sysctls.net.ipv4.tcp_min_tso_segs[0]",
     "1 <= tcp_min_tso_segs <= 255"),
    ({"sender_sysctls": {"net.ipv4.tcp_autocorking": [True]}}, "sender_sysctls.net.ipv4.tcp_autocorking[0]",
     "a whole number"),
    ({"sender_sysctls": [262144]}, "sender_sysctls", "a mapping of names"),
])
def test_a_bad_value_is_refused_naming_the_key_and_what_is_allowed(extra, field, allowed):
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**BASE, **extra})
    assert e.value.field == field and allowed in e.value.allowed


def test_the_run_id_shows_them_and_tells_them_apart():
    plain = Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow("bbr2b"))
    gain = Scenario(plain.link, plain.contention, plain.flow, cca_params={"deficit_gain": 512})
    limit = Scenario(plain.link, plain.contention, plain.flow, sender_sysctls={"net.ipv4.tcp_limit_output_bytes": 4096})
    assert gain.run_id.startswith("bbr2b-deficit_gain512-ts1ms-sh100-rtt10ms-100mbit-r00-")
    assert limit.run_id.startswith("bbr2b-ts1ms-sh100-rtt10ms-100mbit-limit_output_bytes4096-r00-")
    assert len({plain.run_id, gain.run_id, limit.run_id}) == 3
    assert gain.to_dict()["cca_params"] == {"deficit_gain": 512}
    assert Scenario.from_dict(gain.to_dict()) == gain and Scenario.from_dict(limit.to_dict()) == limit


def test_a_scenario_without_them_keeps_its_record_and_run_id():
    plain = Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow("bbr2b"))
    assert "cca_params" not in plain.to_dict() and "sender_sysctls" not in plain.to_dict()
    assert plain.run_id == "bbr2b-ts1ms-sh100-rtt10ms-100mbit-r00-" + plain.run_id.rsplit("-", 1)[1]
    assert Scenario.from_dict(plain.to_dict()).cca_params == ()


def test_a_long_list_of_sysctls_keeps_the_run_id_short():
    s = Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow("cubic"), sender_sysctls={
        "net.ipv4.tcp_limit_output_bytes": 2**31 - 1, "net.ipv4.tcp_notsent_lowat": 2**32 - 1,
        "net.ipv4.tcp_pacing_ss_ratio": 1000, "net.ipv4.tcp_pacing_ca_ratio": 1000, "net.ipv4.tcp_min_tso_segs": 255})
    assert len(s.run_id) < 120


def test_the_runs_table_and_the_run_identity_have_one_column_each():
    class View:
        scenario = Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow("bbr2b"),
                            cca_params={"deficit_gain": 512, "deficit_enable": 1},
                            sender_sysctls={"net.ipv4.tcp_limit_output_bytes": 262144})

    columns = {c.name: c for c in tables.RUN_SCHEMA}
    assert columns["cca_params"].of_record(View()) == "deficit_enable=1,deficit_gain=512"
    assert columns["sender_sysctls"].of_record(View()) == "net.ipv4.tcp_limit_output_bytes=262144"
    assert "cca_params" in runkey.CCA_KEY and "sender_sysctls" in runkey.SENDER_KEY
    assert BY_KEY["cca_params"].column == "cca_params" and BY_KEY["sender_sysctls"].column == "sender_sysctls"
    runs = pd.DataFrame({"variant": ["BBRv1 patched"] * 2, "cca_params": pd.array(["deficit_gain=512", pd.NA],
                                                                                  dtype="string")})
    assert runkey.mixed(runs, ["variant"]) == {"cca_params": 1}
    labelled, added = runkey.split(runs, "variant", [])
    assert added == ["cca_params"] and list(labelled["variant"]) == [
        "BBRv1 patched [params deficit_gain=512]", "BBRv1 patched [default params]"]


def test_the_preflight_refuses_a_parameter_the_senders_module_lacks_and_changes_nothing(tmp_path):
    from types import SimpleNamespace

    from bbrlab.campaign.preflight import check_knobs
    from tests.unit.run.test_sender_knobs import GAIN, LIMIT, RootedHost

    host = RootedHost(tmp_path)
    for path, value in ((GAIN, "739"), (LIMIT, "1048576")):
        host.file(path).parent.mkdir(parents=True, exist_ok=True)
        host.file(path).write_text(value + "\n")
    tb = SimpleNamespace(name="local", sender=SimpleNamespace(host=host))
    good = CampaignSpec.from_dict({**BASE, "cca_params": GAINS, "sender_sysctls": {
        "net.ipv4.tcp_limit_output_bytes": [262144]}})
    check_knobs(good, tb)
    typo = CampaignSpec.from_dict({**BASE, "cca_params": {"bbr2b": {"deficit_gian": [1]}}})
    with pytest.raises(ValidationError) as e:
        check_knobs(typo, tb)
    assert e.value.field == "cca_params.bbr2b.deficit_gian" and "testbed local" in str(e.value)
    assert host.commands == 2 and host.value(GAIN) == "739" and host.value(LIMIT) == "1048576"
    check_knobs(CampaignSpec.from_dict(BASE), tb)  # nothing to check: no command
    assert host.commands == 2
