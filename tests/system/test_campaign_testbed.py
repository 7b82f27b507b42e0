"""The campaign engine on the local testbed: killed with SIGKILL mid-way, resumed, nothing lost or doubled.

A 2 x 2 x 2 grid (cubic/bbr x 25/100 % CPU share x 1/10 ms timeslice) of 2 s runs is started with the
``bbrlab campaign run`` command as a subprocess, killed with SIGKILL once three runs are complete (a
fourth is then usually half-way, with its deadline policy applied), and run again. The end state must
be exactly 8 complete run records whose metadata show the requested CCA, the deadline policy read back
on the sender's vCPU thread and the emulator's qdiscs as the kernel reported them. That test runs in make
test-slow (its docstring names the make test tests that cover each of its mechanisms).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bbrlab.campaign import directory
from bbrlab.campaign.options import CampaignOptions
from bbrlab.contention.deadline import show_policies
from bbrlab.link import emulator as link

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

pytestmark = [pytest.mark.system, pytest.mark.testbed]

BBRLAB = str(Path(sys.executable).with_name("bbrlab"))


def _spec(testbed_name: str, **over) -> dict:
    return {
        "name": "resume-2x2x2", "testbed": testbed_name, "ccas": ["cubic", "bbr"], "timeslices_ms": [1, 10],
        "cpu_shares_pct": [25, 100], "rtts_ms": [20], "rates_mbit": [100], "buffers_bdp": [1],
        "repetitions": 1, "duration_s": 2, "seed": 1, "max_attempts": 2, **over,
    }


def _complete(out: Path) -> int:
    return len(list((out / "runs").glob("*/record.json")))


def _qdisc_setup(testbed) -> dict:
    """The emulator's qdiscs without their counters (which move with any packet)."""
    shown = link.show(testbed.emulator.host, testbed.emulator.ports)
    keys = ("kind", "handle", "parent", "root", "options")
    return {ifname: [{k: q.get(k) for k in keys} for q in qdiscs] for ifname, qdiscs in shown.items()}


def test_bad_spec_refused_before_anything_runs(testbed, tmp_path):
    qdiscs_before = _qdisc_setup(testbed)
    threads = testbed.sender.vcpu_threads()
    policies_before = show_policies(testbed.sender.hypervisor, threads)
    spec_path = tmp_path / "bad.yaml"
    spec_path.write_text(yaml.safe_dump(_spec(testbed.name, cpu_shares_pct=[25, 0])))
    out = tmp_path / "out"
    res = subprocess.run([BBRLAB, "campaign", "run", str(spec_path), "--out", str(out)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1
    assert "cpu_shares_pct[1]" in res.stderr
    assert not out.exists()
    assert _qdisc_setup(testbed) == qdiscs_before
    assert show_policies(testbed.sender.hypervisor, threads) == policies_before


@pytest.mark.slow
def test_campaign_killed_and_resumed(testbed, tmp_path):
    """In make test-slow (about 60 s: eight 2 s runs and the killed one's restart); make test covers each of
    its mechanisms on the same real parts. A ``bbrlab campaign run`` SIGKILLed mid-run on this testbed and
    resumed to exactly its plan, none lost or twice: test_search_campaign_testbed.py::
    test_search_killed_and_resumed_reaches_the_probes_of_a_replay. The deadline policy a SIGKILLed run left
    on the vCPU threads cleared by the next process: test_worker_killed_testbed.py::
    test_a_worker_killed_during_a_contended_run_loses_nothing_and_the_testbed_is_restored; the campaign's
    own recovery, recorded as ``deadline_cleared_tids``, before it describes the testbed:
    test_a_resumed_campaign_clears_a_left_deadline_before_it_describes_the_testbed below. A half-written
    run under ``.tmp`` cleared, not counted: tests/unit/campaign/test_campaign_spec.py::
    test_half_written_runs_are_cleared_not_counted (the campaign directory's own logic, no testbed in it)."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_spec(testbed.name)))
    out = tmp_path / "campaign"
    argv = [BBRLAB, "campaign", "run", str(spec_path), "--out", str(out), "--no-progress"]

    threads = testbed.sender.vcpu_threads()
    hypervisor = testbed.sender.hypervisor

    def under_deadline() -> bool:
        return any(p.is_deadline for p in show_policies(hypervisor, threads).values())

    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 900
    try:
        # Kill once 3 runs are complete AND a contended run is in flight (4 of the 8 runs are contended,
        # so one is always still to come): the killed process leaves its deadline policy behind.
        while _complete(out) < 3 or not under_deadline():
            assert first.poll() is None, f"campaign ended early: {first.communicate()}"
            assert time.monotonic() < deadline, "no contended run in flight after 3 complete runs in 900 s"
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    killed_at = _complete(out)
    assert 3 <= killed_at < 8
    assert under_deadline(), "the SIGKILLed run should have left SCHED_DEADLINE on the vCPU thread"

    second = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    assert second.returncode == 0, second.stderr[-3000:]

    st = directory.status(out)
    assert st.planned == 8 and st.done == 8 and st.failed == 0 and st.remaining == 0
    assert st.running == 0
    plan = json.loads((out / "plan.json").read_text())
    run_dirs = sorted(p.name for p in (out / "runs").iterdir())
    assert run_dirs == sorted(r["run_id"] for r in plan["runs"])  # exactly the plan: none lost, none twice
    leftovers = list((out / ".tmp").iterdir()) if (out / ".tmp").exists() else []
    assert leftovers == []  # the half-written run of the killed process was cleared, not counted

    for run_id in run_dirs:
        _check_record(out / "runs" / run_id, testbed)

    # the resumed process cleared what the killed one left, before its first run, and said so
    records = [json.loads((out / "runs" / r / "record.json").read_text()) for r in run_dirs]
    recovered = [r["metadata"]["recovered"] for r in records if "recovered" in r["metadata"]]
    failed = [json.loads(f.read_text()).get("reason") for f in (out / "failed").glob("*/record.json")]
    assert any(sorted(r["deadline_cleared_tids"]) == sorted(threads) for r in recovered), (recovered, failed)
    assert not under_deadline()


def _check_record(run_dir: Path, testbed) -> None:
    record = json.loads((run_dir / "record.json").read_text())
    assert record["schema"] == "bbrlab.run/2" and record["status"] == "ok" and record["reason"] is None
    iperf = json.loads((run_dir / "iperf.json").read_text())
    scenario, meta = record["scenario"], record["metadata"]
    cca = scenario["flow"]["cca"]
    assert meta["cca"]["requested"] == cca == meta["cca"]["iperf_sender"] == iperf["end"]["sender_tcp_congestion"]
    assert cca in meta["cca"]["available"]
    assert meta["testbed"]["accelerator"] in ("kvm", "tcg")

    share, ts = scenario["contention"]["cpu_share_pct"], scenario["contention"]["timeslice_ms"]
    contention = meta["contention"]
    assert contention["evidence"]["policy_held"] is True
    for applied, after in zip(contention["applied"], contention["evidence"]["threads"], strict=True):
        if share < 100:
            assert applied["policy"] == "SCHED_DEADLINE"
            assert applied["runtime_ns"] == ts * 1_000_000
            assert applied["period_ns"] == ts * 1_000_000 * 100 // share
            assert after["policy_after"]["policy"] == "SCHED_DEADLINE"
        else:
            assert applied["policy"] != "SCHED_DEADLINE"
            assert after["policy_after"]["policy"] != "SCHED_DEADLINE"

    qdiscs = meta["qdiscs"]
    assert set(qdiscs) == set(testbed.emulator.ports)
    configured = link.configured_from_readback(qdiscs, testbed.emulator.ports)
    assert configured["rtt_ms"] == pytest.approx(20, abs=0.01)
    assert configured["rate_mbit"] == pytest.approx(100, rel=0.01)
    assert 0 < meta["iperf"]["receiver_mbit"] <= 101


def test_a_resumed_campaign_clears_a_left_deadline_before_it_describes_the_testbed(testbed, tmp_path):
    """A killed campaign can leave the sender's vCPU under SCHED_DEADLINE; the next campaign on the testbed
    must clear it before anything reads the testbed over SSH (a fresh clone's make test once saw the resumed
    campaign's description time out on the SSH banner of a sender left at 25 %, and the campaign was refused
    as run on another kernel). The testbed's ``record`` (what ``describe`` and the run session read the testbed
    with) is wrapped to read the vCPU threads' policies when it is called: on the old code it met the leftover
    policy."""
    from bbrlab.campaign.single import run_on_testbed
    from bbrlab.campaign.spec import CampaignSpec

    threads = testbed.sender.vcpu_threads()
    hypervisor = testbed.sender.hypervisor
    subprocess.run([BBRLAB, "contention", "set", "--timeslice", "10ms", "--share", "50%", "--threads",
                    ",".join(map(str, threads))], check=True, capture_output=True, text=True, timeout=120)
    seen: list[bool] = []
    record = testbed.record

    def describing():
        seen.append(any(p.is_deadline for p in show_policies(hypervisor, threads).values()))
        return record()

    testbed.record = describing
    try:
        spec = CampaignSpec.from_dict(_spec(testbed.name, ccas=["cubic"], timeslices_ms=[10], cpu_shares_pct=[100],
                                            duration_s=1, name="leftover-first"))
        st = run_on_testbed(spec, tmp_path / "campaign", testbed, options=QUIET)
    finally:
        del testbed.record
        subprocess.run([BBRLAB, "contention", "clear", "--threads", ",".join(map(str, threads))],
                       capture_output=True, text=True, timeout=120)
    assert seen and not any(seen), "the testbed was described while the left deadline policy held"
    assert st.done == 1 and st.failed == 0
    (run,) = (tmp_path / "campaign" / "runs").iterdir()
    recovered = json.loads((run / "record.json").read_text())["metadata"]["recovered"]
    assert sorted(recovered["deadline_cleared_tids"]) == sorted(threads)
