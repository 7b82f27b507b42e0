"""Issue 24 item 6: a resumed campaign stays on one testbed unless --allow-mixed, which the records show.

Each campaign directory here is made by the real campaign loop (bbrlab.campaign.loop.run_campaign, real records
committed through bbrlab.run.record) with a run function that reports the testbed it "ran on" in its metadata
as the runner does (``metadata.testbed``); it is stopped part-way (KeyboardInterrupt, as Ctrl-C) and resumed
with another testbed description offered.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bbrlab.campaign import directory, sameness
from bbrlab.campaign.loop import run_campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.sameness import MixedTestbed, check_same_testbed
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.run import record

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

BASE = {"name": "mix", "ccas": ["cubic", "bbr"], "timeslices_ms": [10], "cpu_shares_pct": [25, 100],
        "rtts_ms": [20], "rates_mbit": [100], "repetitions": 1, "duration_s": 5}
LOCAL_TCG = {"name": "local", "kind": "local", "accelerator": "tcg", "sender_vcpus": 1,
             "sender_kernel": "6.1.0-28-amd64", "hypervisor": "QEMU 7.2", "host_kernel": "6.1.0"}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def reporting_run(testbed: dict, calls: list, stop_after: int | None = None, kernels: dict | None = None):
    """A run function that writes a file and returns the metadata a run on ``testbed`` has; after
    ``stop_after`` runs it raises KeyboardInterrupt (the campaign stops, nothing of that run recorded).
    ``kernels`` maps a scenario's kernel to the sender kernel that run reports."""

    def run(scenario, staging, *, run_id, attempt):
        if stop_after is not None and len(calls) >= stop_after:
            raise KeyboardInterrupt
        calls.append(run_id)
        (staging / "iperf.json").write_text("{}")
        tb = dict(testbed)
        if kernels:
            tb["sender_kernel"] = kernels[scenario.kernel]
        return {"testbed": tb}

    return run


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/record.json"))]


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.name != ".lock"}


@pytest.fixture
def half_done(tmp_path) -> Path:
    """A campaign directory with 2 of 4 runs recorded on the local TCG testbed, then stopped."""
    out = tmp_path / "c"
    with pytest.raises(KeyboardInterrupt):
        run_campaign(spec(), out, reporting_run(LOCAL_TCG, [], stop_after=2),
                     options=QUIET, testbed=LOCAL_TCG)
    assert len(_records(out)) == 2
    return out


@pytest.mark.parametrize(("key", "offered_value", "ran_value"), [
    ("accelerator", "kvm", "tcg"),
    ("sender_kernel", "6.12.9-amd64", "6.1.0-28-amd64"),
    ("sender_vcpus", 2, 1),
    ("name", "tbb", "local"),
])
def test_resuming_on_another_testbed_is_refused_before_any_run(half_done, key, offered_value, ran_value):
    offered = {**LOCAL_TCG, key: offered_value}
    before, calls = _files(half_done), []
    with pytest.raises(ValidationError) as e:
        run_campaign(spec(), half_done, reporting_run(offered, calls), options=QUIET, testbed=offered)
    assert isinstance(e.value, MixedTestbed)
    assert e.value.field == "--testbed"
    message = str(e.value)
    assert repr(offered_value) in message and repr(ran_value) in message  # what it ran on, what is offered now
    assert "--allow-mixed" in message
    assert calls == [] and _files(half_done) == before  # nothing ran, nothing written


def test_the_same_testbed_resumes_and_its_records_carry_no_mixed_mark(half_done):
    calls = []
    st = run_campaign(spec(), half_done, reporting_run(LOCAL_TCG, calls), options=QUIET, testbed=LOCAL_TCG)
    assert st.done == 4 and len(calls) == 2
    assert all("mixed" not in r["metadata"] for r in _records(half_done))


def test_allow_mixed_resumes_and_every_record_made_says_so(half_done):
    kvm = {**LOCAL_TCG, "accelerator": "kvm"}
    before = {r["run_id"]: r for r in _records(half_done)}
    calls = []
    st = run_campaign(spec(), half_done, reporting_run(kvm, calls),
                      options=CampaignOptions(progress=False, allow_mixed=True), testbed=kvm)
    assert st.done == 4 and len(calls) == 2
    for r in _records(half_done):
        if r["run_id"] in before:
            assert r == before[r["run_id"]]  # the records of the first testbed are untouched
            continue
        assert r["metadata"]["testbed"]["accelerator"] == "kvm"
        mixed = r["metadata"]["mixed"]
        assert mixed["allowed"] is True
        assert len(mixed["differences"]) == 1
        assert "accelerator 'kvm' now" in mixed["differences"][0] and "'tcg'" in mixed["differences"][0]


def test_a_failed_attempt_made_with_allow_mixed_says_so_too(half_done):
    kvm = {**LOCAL_TCG, "accelerator": "kvm"}

    def failing(scenario, staging, *, run_id, attempt):
        raise RuntimeError("receiver unreachable")

    run_campaign(spec(), half_done, failing,
                 options=CampaignOptions(progress=False, allow_mixed=True), testbed=kvm)
    failed = [json.loads(p.read_text()) for p in (half_done / "failed").glob("*/record.json")]
    assert len(failed) == 2 * 3 and all(r["metadata"]["mixed"]["allowed"] for r in failed)


def test_records_without_a_testbed_are_not_compared(tmp_path):
    # Records made by run functions that say nothing of their testbed (and a new campaign) are never refused.
    out = tmp_path / "c"
    with pytest.raises(KeyboardInterrupt):
        run_campaign(spec(), out, reporting_run({}, [], stop_after=1), options=QUIET)
    assert check_same_testbed(out, [LOCAL_TCG]) is None
    assert check_same_testbed(tmp_path / "new", [LOCAL_TCG]) is None


def test_a_kernel_dimension_compares_each_blocks_kernel_run_by_run(tmp_path):
    # With kernels: the sender boots each block's kernel, so what runs now says nothing; a run whose sender
    # ran another kernel than the block's earlier runs is refused and not recorded.
    two = spec(kernels=["debian-6.1", "debian-6.12"])
    out = tmp_path / "k"
    booted = {"debian-6.1": "6.1.0-28-amd64", "debian-6.12": "6.12.9-amd64"}
    with pytest.raises(KeyboardInterrupt):
        run_campaign(two, out, reporting_run(LOCAL_TCG, [], stop_after=6, kernels=booted), options=QUIET,
                     testbed=LOCAL_TCG)
    assert len(_records(out)) == 6  # the 6.1 block (4 runs) and 2 runs of the 6.12 block
    offered_now = {**LOCAL_TCG, "sender_kernel": "6.12.9-amd64"}  # the sender runs the second block's kernel
    assert check_same_testbed(out, [offered_now], kernel_dimension=True) is None
    rebuilt = {**booted, "debian-6.12": "6.12.10-amd64"}
    calls = []
    before = _files(out)
    with pytest.raises(MixedTestbed) as e:
        run_campaign(two, out, reporting_run(LOCAL_TCG, calls, kernels=rebuilt),
                     options=QUIET, testbed=offered_now)
    assert "'6.12.10-amd64'" in str(e.value) and "'6.12.9-amd64'" in str(e.value)
    assert len(calls) == 1
    after = _files(out)
    assert {k: v for k, v in after.items() if not k.startswith(".tmp/")} == before  # nothing recorded
    assert not (out / "failed").exists()  # and no attempt burnt
    st = run_campaign(two, out, reporting_run(LOCAL_TCG, [], kernels=rebuilt),
                      options=CampaignOptions(progress=False, allow_mixed=True), testbed=offered_now)
    assert st.done == 8
    last = [r for r in _records(out) if r["scenario"].get("kernel") == "debian-6.12"
            and r["metadata"].get("mixed")]
    assert len(last) == 2 and "6.12.10-amd64" in last[0]["metadata"]["mixed"]["differences"][0]


def test_several_testbeds_each_compared_with_its_own_first_run(tmp_path):
    # The multi-testbed path offers every testbed at once: each one must be one the records ran on, as it was.
    out = tmp_path / "c"
    tba, tbb = {**LOCAL_TCG, "name": "tba"}, {**LOCAL_TCG, "name": "tbb"}
    for tb in (tba, tbb):
        with pytest.raises(KeyboardInterrupt):
            run_campaign(spec(), out, reporting_run(tb, [], stop_after=1),
                         options=CampaignOptions(progress=False, allow_mixed=tb is tbb), testbed=tb)
    assert sameness.testbed_differences(out, [tba, tbb]) == []
    with pytest.raises(MixedTestbed) as e:
        check_same_testbed(out, [tba, {**LOCAL_TCG, "name": "tbc"}])
    assert "'tbc' is not one the campaign ran on" in str(e.value) and "'tba', 'tbb'" in str(e.value)
    with pytest.raises(MixedTestbed, match="accelerator 'kvm' now"):
        check_same_testbed(out, [tba, {**tbb, "accelerator": "kvm"}])
    mixed = check_same_testbed(out, [tba, {**LOCAL_TCG, "name": "tbc"}], allow_mixed=True)
    assert mixed["allowed"] is True and len(mixed["differences"]) == 1


def test_the_driver_of_several_testbeds_marks_its_records(tmp_path):
    # bbrlab.campaign.distributed.commit_outcome: the multi-testbed driver's one place where a record is made.
    from bbrlab.campaign.attempt import Attempt, Finished
    from bbrlab.campaign.distributed import commit_outcome

    s = spec()
    out = tmp_path / "c"
    directory.prepare(s, out)
    scenario = s.plan()[0]
    outcome = Finished(Attempt(scenario.run_id, 1, scenario, 0), "ok", None, {"testbed": LOCAL_TCG}, "a", "b",
                       files={"iperf.json": b"{}"}, testbed="local", worker_host="h")
    made = commit_outcome(out, s, scenario, outcome, mixed={"allowed": True, "differences": ["x"]})
    assert made["metadata"]["mixed"] == {"allowed": True, "differences": ["x"]}
    assert json.loads((out / record.RUNS / scenario.run_id / record.RECORD_FILE).read_text())["metadata"]["mixed"]


def test_calibration_runs_of_another_vcpu_count_are_not_resumed(tmp_path):
    # A calibration's runs folder is named by testbed, accelerator and kernel, not by the sender's vCPUs:
    # resuming it with 2 vCPUs would mix ceilings of two senders. Refused before any run, --fresh named.
    from bbrlab.calibration.calibrate import RUNS_FOLDER, calibrate, runs_key
    from bbrlab.calibration.plan import CalibrationSpec

    cal = CalibrationSpec(name="calibration", timeslices_ms=(10,), cpu_shares_pct=(25, 100), rtts_ms=(20,),
                          repetitions=1, duration_s=2, streams=(1,), bridge_reference=False)
    runs_dir = tmp_path / RUNS_FOLDER / runs_key(LOCAL_TCG, cal)
    with pytest.raises(KeyboardInterrupt):
        run_campaign(cal, runs_dir, reporting_run(LOCAL_TCG, [], stop_after=1),
                     options=QUIET, testbed=LOCAL_TCG)

    class TwoVcpus:
        def describe(self):
            return {**LOCAL_TCG, "sender_vcpus": 2}

    calls = []
    with pytest.raises(ValidationError) as e:
        calibrate(TwoVcpus(), cal, tmp_path, runner=reporting_run(LOCAL_TCG, calls), progress=False)
    assert e.value.field == "--testbed" and "sender_vcpus 2 now" in str(e.value) and "--fresh" in str(e.value)
    assert calls == []


def test_a_shared_campaign_resumes_with_a_testbed_that_had_not_recorded_a_run_yet(half_done):
    # Two testbeds shared a campaign that stopped before the second recorded anything: resuming on the same two is
    # the same campaign. Alone, or beside a testbed unlike the first, a testbed the records never name is refused.
    twin = {**LOCAL_TCG, "name": "tbb"}
    assert sameness.testbed_differences(half_done, [LOCAL_TCG, twin]) == []
    assert sameness.testbed_differences(half_done, [twin]) != []  # one testbed, another name: another testbed
    unlike = {**twin, "accelerator": "kvm"}
    assert any("'tbb'" in d for d in sameness.testbed_differences(half_done, [LOCAL_TCG, unlike]))
