"""The sender's vCPU count as a spec dimension (issue #38): checked, crossed, kept out of spec.yaml and the run ids
of specs without it, planned so that the sender boots once per kernel and count, refused on a lab testbed, and
left out of the testbed comparison of a resumed campaign that varies it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bbrlab.campaign import preflight, sameness
from bbrlab.campaign.repetitions import point_id
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.scenario.scenario import MAX_SENDER_VCPUS, Contention, Flow, Link, Scenario

BASE = {"name": "v", "ccas": ["cubic", "bbr"], "timeslices_ms": [1], "cpu_shares_pct": [25, 100], "rtts_ms": [20],
        "rates_mbit": [50], "repetitions": 2}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def test_sender_vcpus_is_crossed_and_named_in_the_run_id():
    s = spec(sender_vcpus=[1, 2, 4])
    assert s.runs == 3 * 2 * 2 * 2 == len(s.plan())
    assert {p.sender_vcpus for p in s.grid()} == {1, 2, 4}
    assert all(p.run_id.startswith(f"{p.sender_vcpus}vcpu-") for p in s.plan())
    assert s.to_dict()["sender_vcpus"] == [1, 2, 4] and CampaignSpec.from_dict(s.to_dict()) == s
    assert len({p.run_id for p in s.plan()}) == s.runs
    assert point_id(s.grid()[0]) != point_id(s.grid()[-1])


def test_a_spec_without_it_keeps_its_spec_yaml_and_run_ids():
    s = spec()
    assert "sender_vcpus" not in s.to_dict()
    assert all(p.sender_vcpus is None and "sender_vcpus" not in p.to_dict() for p in s.plan())
    assert [p.run_id for p in s.plan()] == [p.run_id for p in CampaignSpec.from_dict(BASE).plan()]


def test_committed_records_keep_their_run_ids():
    root = Path(__file__).parents[3] / "data"
    records = sorted(root.glob("*/runs/*/record.json"))[:40]
    assert records
    for path in records:
        record = json.loads(path.read_text())
        assert Scenario.from_record(record["scenario"]).run_id == record["run_id"], path


@pytest.mark.parametrize("values, field", [([0], "sender_vcpus[0]"), ([1, MAX_SENDER_VCPUS + 1], "sender_vcpus[1]"),
                                           ([1.5], "sender_vcpus[0]"), ([2, 2], "sender_vcpus"),
                                           (2, "sender_vcpus")])
def test_bad_counts_name_the_key_and_the_range(values, field):
    with pytest.raises(ValidationError) as e:
        spec(sender_vcpus=values)
    assert e.value.field == field


def test_a_scenario_refuses_a_count_out_of_range():
    for bad in (0, 9, True, "2"):
        with pytest.raises(ValidationError, match="sender_vcpus"):
            Scenario(Link(20, 50), Contention(1, 100), Flow("cubic"), sender_vcpus=bad)
    s = Scenario(Link(20, 50), Contention(1, 100), Flow("cubic"), sender_vcpus=2)
    assert Scenario.from_dict(s.to_dict()) == s and s.to_dict()["sender_vcpus"] == 2


def _groups(plan) -> list[tuple]:
    """The (kernel, vCPUs) of each run, consecutive repeats collapsed: one entry per sender boot."""
    out: list[tuple] = []
    for p in plan:
        if not out or out[-1] != (p.kernel, p.sender_vcpus):
            out.append((p.kernel, p.sender_vcpus))
    return out


@pytest.mark.parametrize("order", ["blocked-random", "random", "sequential"])
def test_the_plan_keeps_each_kernel_and_count_together(order):
    s = spec(kernels=["debian-6.1", "debian-6.12"], sender_vcpus=[2, 1], order=order)
    assert _groups(s.plan()) == [("debian-6.1", 2), ("debian-6.1", 1), ("debian-6.12", 2), ("debian-6.12", 1)]
    blocked = spec(sender_vcpus=[1, 2], blocks=2)
    assert _groups(blocked.plan()) == [(None, 1), (None, 2)] * 2
    assert blocked.boot_groups == 2 and spec().boot_groups == 1


def test_without_it_the_plan_is_the_one_specs_always_had():
    s = spec(kernels=["debian-6.1", "debian-6.12"])
    assert _groups(s.plan()) == [("debian-6.1", None), ("debian-6.12", None)]


def test_a_lab_testbed_refuses_it_before_anything_changes():
    lab = SimpleNamespace(kind="lab", name="lab1")
    with pytest.raises(ValidationError) as e:
        preflight.check_testbed(spec(sender_vcpus=[1, 2]), lab)
    assert e.value.field == "sender_vcpus" and "lab" in str(e.value)


def _write_run(out: Path, run_id: str, vcpus: int) -> None:
    d = out / "runs" / run_id
    d.mkdir(parents=True)
    tb = {"name": "local", "kind": "local", "accelerator": "tcg", "sender_vcpus": vcpus, "sender_kernel": "6.1.0"}
    (d / "record.json").write_text(json.dumps({"run_id": run_id, "started_at": run_id, "metadata": {"testbed": tb}}))


def test_a_campaign_that_varies_the_count_is_not_refused_for_the_count_now(tmp_path):
    _write_run(tmp_path, "a", 1)
    _write_run(tmp_path, "b", 2)
    now = {"name": "local", "kind": "local", "accelerator": "tcg", "sender_vcpus": 2, "sender_kernel": "6.1.0"}
    assert sameness.testbed_differences(tmp_path, [now], vcpus_dimension=True) == []
    assert sameness.testbed_differences(tmp_path, [now]) == [
        "testbed 'local': sender_vcpus 2 now, but the campaign's runs on it ran with 1 (first run a)"]
    assert sameness.check_same_testbed(tmp_path, [now], vcpus_dimension=True) is None


def test_a_calibration_made_with_one_count_is_refused_for_a_plan_of_another(tmp_path):
    from dataclasses import replace

    from tests.unit.campaign.test_scaleout import _calibration, _check, _plan

    path = _calibration(tmp_path / "a.json", "a")
    assert preflight.calibrations_for([_check("a")], tmp_path / "camp", _plan(), [path])
    two = [replace(s, sender_vcpus=2) for s in _plan()]
    with pytest.raises(ValidationError, match=r"made with 1 sender vCPU\(s\), the spec also asks \[2\]") as e:
        preflight.calibrations_for([_check("a")], tmp_path / "camp", two, [path])
    assert e.value.field == "--calibration"
