"""Issue 17: specs validated in combination, --out rules, resume repair, unique run ids.

Every campaign here runs a run function that writes real files into the real directory layout
(bbrlab.run.record), as in test_campaign_spec.py; nothing of the directory handling is replaced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from bbrlab.campaign import directory, spec_combinations
from bbrlab.campaign import loop as campaign
from bbrlab.campaign.directory import OutDirError
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec, load_spec
from bbrlab.campaign.spec_models import check_admission
from bbrlab.contention.limits import KernelLimits, read_kernel_limits
from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hosts import LocalHost
from bbrlab.run import record
from bbrlab.scenario.scenario import Link
from tests.campaign_runs import writing_run

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

BASE = {
    "name": "t", "ccas": ["cubic", "bbr"], "timeslices_ms": [1, 10], "cpu_shares_pct": [25, 100],
    "rtts_ms": [20], "rates_mbit": [100], "repetitions": 1, "duration_s": 5,
}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- values that are only wrong together -------------------------------------------------------------

def test_a_queue_beyond_tbfs_32_bit_limit_is_refused_naming_the_combination():
    # 40000 Mbit/s x 1000 ms x 1 BDP = 5e9 bytes > 2^32 - 1: tc refuses such a limit (tested for real in
    # tests/system/test_link_host.py), so every attempt of such a run used to fail after the spec was accepted.
    with pytest.raises(ValidationError) as e:
        spec(rates_mbit=[100, 40000], rtts_ms=[20, 1000], buffers_bdp=[0.5, 1])
    assert e.value.field == "buffers_bdp[1] with rates_mbit[1] and rtts_ms[1]"
    assert "32-bit" in str(e.value) and "5000000000 bytes" in str(e.value)
    assert spec(rates_mbit=[40000], rtts_ms=[100], buffers_bdp=[1]).grid()  # 5e8 bytes: fine


def test_a_rate_too_low_for_tbfs_burst_time_is_refused():
    with pytest.raises(ValidationError) as e:
        Link(rtt_ms=20, rate_mbit=0.0004)
    assert e.value.field == "link.rate_mbit" and "274.9 s" in str(e.value)
    Link(rtt_ms=20, rate_mbit=0.00045, buffer_bdp=None, buffer_bytes=4000)  # 450 bit/s: the bucket drains in time


def test_loss_is_at_most_50_percent():
    assert Link(rtt_ms=20, rate_mbit=100, loss_model="uniform", loss_pct=50).loss_pct == 50
    for pct in (50.5, 100):
        with pytest.raises(ValidationError, match="loss_pct"):
            Link(rtt_ms=20, rate_mbit=100, loss_model="uniform", loss_pct=pct)
    with pytest.raises(ValidationError) as e:
        spec(losses_pct=[0, 30, 100])
    assert e.value.field == "losses_pct[2]" and "50" in e.value.allowed


def test_a_share_is_judged_with_each_timeslice_not_with_1_ms():
    # 0.05 ms / 0.02 % gives a 250 ms period (allowed); the old check tried 1 ms / 0.02 % = 5 s and refused.
    s = spec(timeslices_ms=[0.05], cpu_shares_pct=[0.02])
    assert s.grid()[0].contention.period_ns == 250_000_000
    with pytest.raises(ValidationError) as e:
        spec(timeslices_ms=[0.05, 1], cpu_shares_pct=[0.02])
    assert e.value.field == "cpu_shares_pct[0] with timeslices_ms[1]"


def test_a_tiny_share_is_a_validation_error_not_an_overflow():
    with pytest.raises(ValidationError) as e:
        spec(timeslices_ms=[1], cpu_shares_pct=[1e-300])
    assert e.value.field == "cpu_shares_pct[0] with timeslices_ms[0]"


def test_a_grid_too_large_to_plan_is_refused_before_it_is_built():
    huge = {"rtts_ms": list(range(1, 101)), "rates_mbit": list(range(1, 101)), "buffers_bdp": list(range(1, 101))}
    with pytest.raises(ValidationError) as e:
        spec(**huge)
    assert e.value.field == "grid x repetitions" and str(spec_combinations.MAX_RUNS) in e.value.allowed


def test_admission_uses_this_hosts_live_limits_and_the_thread_count():
    limits = read_kernel_limits(LocalHost())  # this machine, read now
    s = spec(timeslices_ms=[10], cpu_shares_pct=[70])
    check_admission(s, limits, n_threads=1)
    threads = int(limits.capacity_cpus / 0.7) + 1  # more 70 % threads than the host's deadline capacity
    with pytest.raises(ValidationError) as e:
        check_admission(s, limits, n_threads=threads)
    assert e.value.field == "cpu_shares_pct[0] with timeslices_ms[0]"
    assert f"{threads} vCPU thread(s)" in str(e.value)


def test_admission_uses_the_hosts_period_limits_not_the_defaults():
    s = spec(timeslices_ms=[1], cpu_shares_pct=[50])  # a 2 ms period: fine with the kernel's defaults
    strict = KernelLimits(period_min_us=5000, period_max_us=4_194_304, rt_runtime_us=950_000,
                          rt_period_us=1_000_000, online_cpus=2, kernel_release="a host with a raised minimum")
    with pytest.raises(ValidationError, match="5000..4194304 us"):
        check_admission(s, strict, n_threads=1)


# -- the YAML file --------------------------------------------------------------------------------------

def test_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE) + "rtts_ms: [40]\n")
    with pytest.raises(ValidationError) as e:
        load_spec(path)
    assert e.value.field == "rtts_ms" and "given twice" in str(e.value)


def test_a_key_given_twice_in_a_testbed_file_is_refused(tmp_path):
    from bbrlab.testbed.file import load_file

    path = tmp_path / "lab.yaml"
    path.write_text("name: lab\nname: lab2\nroles: {}\n")
    with pytest.raises(ValidationError, match="name.*given twice"):
        load_file(path)


def test_yaml_merge_keys_may_still_be_overridden():
    from bbrlab.core.yamlfile import load_text

    doc = load_text("a: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "<test>")
    assert doc == {"a": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}}
    with pytest.raises(ValidationError, match="given twice"):
        load_text("c:\n  x: 1\n  x: 3\n", "<test>")


def test_a_testbed_file_is_taken_from_the_specs_folder(tmp_path, monkeypatch):
    folder = tmp_path / "specs"
    folder.mkdir()
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "testbed": "labs/lab1.yaml"}))
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    assert load_spec(path).testbed == str(folder / "labs" / "lab1.yaml")
    assert load_spec(path.resolve()).testbed == str(folder / "labs" / "lab1.yaml")
    path.write_text(yaml.safe_dump({**BASE, "testbed": "/abs/lab.yaml"}))
    assert load_spec(path).testbed == "/abs/lab.yaml"


def test_testbed_is_a_name_a_file_or_left_to_the_command():
    assert spec().testbed is None
    assert spec(testbed="local").testbed == "local"
    for bad in ("Bad_Name", "a-name-longer-than-12", "x; id", ""):
        with pytest.raises(ValidationError, match="testbed"):
            spec(testbed=bad)


# -- run ids --------------------------------------------------------------------------------------------

def test_two_scenarios_with_the_same_run_id_are_refused():
    # A real collision of the 40-bit digest (found by searching buffer sizes k / 1e6): both runs would be
    # named cubic-ts1ms-sh100-rtt20ms-100mbit-r00-5443889467, and the second taken for done after the first.
    s = CampaignSpec.from_dict({"name": "c", "ccas": ["cubic"], "timeslices_ms": [1], "cpu_shares_pct": [100],
                                "rtts_ms": [20], "rates_mbit": [100], "buffers_bdp": [0.659986, 0.889755],
                                "repetitions": 1, "duration_s": 5})
    a, b = s.grid()
    assert a != b and a.run_id == b.run_id == "cubic-ts1ms-sh100-rtt20ms-100mbit-r00-5443889467"
    with pytest.raises(ValidationError) as e:
        s.plan()
    assert e.value.field == "plan" and "5443889467" in str(e.value)


# -- --out ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["spec.yaml", "notes.txt", ".tmp/mine", "runs/"])
def test_out_with_someone_elses_files_is_refused_and_left_alone(tmp_path, what):
    out = tmp_path / "out"
    target = out / what
    if what.endswith("/"):
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("# my own notes\nname: mine\n")
    before = _tree(out)
    calls: list = []
    with pytest.raises(OutDirError, match="not empty and holds no campaign"):
        campaign.run_campaign(spec(), out, writing_run(calls), options=QUIET)
    assert calls == []
    assert {k: v for k, v in _tree(out).items() if k != ".lock"} == before


def test_out_dot_with_the_users_spec_is_refused_through_the_cli(tmp_path, monkeypatch, capsys):
    from bbrlab.cli.main import main

    monkeypatch.chdir(tmp_path)
    own = "# my commented spec\n" + yaml.safe_dump(BASE)
    Path("spec.yaml").write_text(own)
    assert main(["campaign", "run", "spec.yaml", "--out", "."]) == 1
    assert "not empty and holds no campaign" in capsys.readouterr().err
    assert Path("spec.yaml").read_text() == own
    assert sorted(os.listdir(".")) == ["spec.yaml"]


def test_out_may_be_missing_empty_or_this_campaign(tmp_path):
    s = spec()
    for out in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        calls: list = []
        assert campaign.run_campaign(s, out, writing_run(calls), options=QUIET).done == 8
        assert len(calls) == 8
        again: list = []
        campaign.run_campaign(s, out, writing_run(again), options=QUIET)
        assert again == []


def test_out_prepared_by_bbrlab_calibrate_is_accepted(tmp_path):
    """`bbrlab calibrate SPEC --out DIR` writes calibration.json and calibration/<key>/ (a campaign of its own)
    before `bbrlab campaign run SPEC --out DIR`."""
    (tmp_path / "calibration.json").write_text(json.dumps({"schema": "bbrlab.calibration/1", "points": []}))
    key = tmp_path / "calibration" / "local-tcg-6.1-abc"
    campaign.run_campaign(spec(name="cal"), key, writing_run([]), options=QUIET)
    calls: list = []
    assert campaign.run_campaign(spec(), tmp_path, writing_run(calls), options=QUIET).done == 8
    other = tmp_path / "other"
    other.mkdir()
    (other / "calibration.json").write_text(json.dumps({"schema": "mine"}))
    with pytest.raises(OutDirError, match="calibration.json"):
        campaign.run_campaign(spec(), other, writing_run([]), options=QUIET)


def test_a_campaign_interrupted_between_spec_and_plan_is_recognised_as_its_own(tmp_path):
    s = spec()
    (tmp_path / "spec.yaml").write_text(directory.spec_yaml(s))  # what prepare writes before plan.json
    (tmp_path / ".lock").write_text("")
    calls: list = []
    assert campaign.run_campaign(s, tmp_path, writing_run(calls), options=QUIET).done == 8


def test_resuming_on_another_testbed_is_the_same_campaign(tmp_path):
    calls: list = []
    campaign.run_campaign(spec(testbed="local"), tmp_path, writing_run(calls), options=QUIET)
    again: list = []
    campaign.run_campaign(spec(testbed="other"), tmp_path, writing_run(again), options=QUIET)
    assert again == []


def test_a_damaged_plan_is_explained(tmp_path):
    directory.prepare(spec(), tmp_path)
    (tmp_path / "plan.json").write_text('{"runs": [')
    with pytest.raises(BbrlabError, match="plan.json cannot be read as JSON"):
        directory.prepare(spec(), tmp_path)
    with pytest.raises(BbrlabError, match="plan.json cannot be read as JSON"):
        directory.status(tmp_path)


# -- .tmp/ ---------------------------------------------------------------------------------------------

def test_tmp_cleanup_touches_only_what_the_campaign_made(tmp_path):
    s = spec()
    directory.prepare(s, tmp_path)
    ids = [r.run_id for r in s.plan()]
    tmp = tmp_path / ".tmp"
    ours = tmp / f"{ids[0]}.4242"
    ours.mkdir(parents=True)
    (ours / "iperf.json").write_text("{")
    foreign = {tmp / "notes.txt": "keep", tmp / "other-run.123" / "x": "keep", tmp / f"{ids[1]}.abc" / "y": "keep"}
    for path, text in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert record.clear_tmp(tmp_path) == 1
    assert not ours.exists()
    assert all(p.read_text() == "keep" for p in foreign)


# -- resume repair ---------------------------------------------------------------------------------------

def test_a_half_copied_run_directory_is_set_aside_and_measured_again(tmp_path, capsys):
    s = spec()
    calls: list = []
    campaign.run_campaign(s, tmp_path, writing_run(calls), options=QUIET)
    victim = s.plan()[2].run_id
    (tmp_path / "runs" / victim / "record.json").unlink()  # a copy that stopped before record.json
    again: list = []
    st = campaign.run_campaign(s, tmp_path, writing_run(again), options=QUIET)
    assert again == [(victim, 1)] and st.done == 8
    moved = list((tmp_path / "set-aside" / "runs").iterdir())
    assert len(moved) == 1 and moved[0].name.startswith(victim) and (moved[0] / "iperf.json").is_file()
    assert f"runs/{victim}" in capsys.readouterr().err


def test_a_run_directory_with_a_broken_record_is_set_aside(tmp_path):
    s = spec()
    campaign.run_campaign(s, tmp_path, writing_run([]), options=QUIET)
    victim = s.plan()[0].run_id
    (tmp_path / "runs" / victim / "record.json").write_text('{"run_id": "')
    again: list = []
    assert campaign.run_campaign(s, tmp_path, writing_run(again), options=QUIET).done == 8
    assert again == [(victim, 1)]


def test_a_gap_in_failed_attempts_is_explained_before_any_run(tmp_path):
    s = spec(max_attempts=3)
    victim = s.plan()[4].run_id
    campaign.run_campaign(s, tmp_path, writing_run([], frozenset({victim})), options=QUIET)
    assert record.failed_attempts(tmp_path, victim) == [1, 2, 3]
    # remove the first attempt: a2 and a3 are left
    import shutil

    shutil.rmtree(tmp_path / "failed" / f"{victim}.a1")
    calls: list = []
    with pytest.raises(OutDirError) as e:
        campaign.run_campaign(s, tmp_path, writing_run(calls),
                              options=CampaignOptions(progress=False, retry_failed=True))
    assert calls == []  # explained before anything ran, not "already exists" half-way
    assert f"failed/{victim}.a2" in str(e.value) and "[2, 3]" in str(e.value) and "Move" in str(e.value)


def test_a_failed_attempt_without_its_record_is_set_aside(tmp_path):
    s = spec(max_attempts=2)
    victim = s.plan()[1].run_id
    campaign.run_campaign(s, tmp_path, writing_run([], frozenset({victim})), options=QUIET)
    (tmp_path / "failed" / f"{victim}.a2" / "record.json").unlink()
    calls: list = []
    st = campaign.run_campaign(s, tmp_path, writing_run(calls), options=QUIET)
    assert calls == [(victim, 2)] and st.done == 8
    assert len(list((tmp_path / "set-aside" / "failed").iterdir())) == 1


def test_status_json_of_a_repaired_campaign_is_consistent(tmp_path):
    s = spec()
    campaign.run_campaign(s, tmp_path, writing_run([]), options=QUIET)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert directory.status(tmp_path).done == len(plan["runs"]) == 8


def test_given_up_names_each_run_out_of_attempts_with_its_last_reason(tmp_path):
    s = spec(max_attempts=2)
    ids = [r.run_id for r in directory.Plan.of(s).runs]
    campaign.run_campaign(s, tmp_path, writing_run([], fail_ids={ids[0]}), options=QUIET)
    got = directory.given_up(tmp_path)
    assert list(got) == [f"{ids[0]}.a2"] and "receiver unreachable" in got[f"{ids[0]}.a2"]
    assert directory.given_up(tmp_path) == got  # read-only: asking twice changes nothing


def test_given_up_is_empty_while_attempts_remain(tmp_path):
    s = spec(max_attempts=2)
    ids = [r.run_id for r in directory.Plan.of(s).runs]
    campaign.run_campaign(s, tmp_path, writing_run([], fail_ids={ids[0]}), options=QUIET)
    (tmp_path / "spec.yaml").write_text((tmp_path / "spec.yaml").read_text().replace("max_attempts: 2",
                                                                                     "max_attempts: 3"))
    assert directory.given_up(tmp_path) == {}


def test_campaign_run_exits_1_saying_which_runs_failed_and_why(tmp_path, capsys):
    from bbrlab.cli.campaign import _exit_status

    s = spec(max_attempts=1)
    ids = [r.run_id for r in directory.Plan.of(s).runs]
    st = campaign.run_campaign(s, tmp_path, writing_run([], fail_ids={ids[1]}), options=QUIET)
    capsys.readouterr()
    assert _exit_status(st, tmp_path) == 1
    err = capsys.readouterr().err
    assert f"{ids[1]}.a1: " in err and "receiver unreachable" in err and "--retry-failed" in err
    done = campaign.run_campaign(spec(max_attempts=1, name="u"), tmp_path / "ok", writing_run([]), options=QUIET)
    assert _exit_status(done, tmp_path / "ok") == 0 and capsys.readouterr().err == ""
