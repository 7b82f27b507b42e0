"""Adaptive repetitions on the local testbed (issue #30): SIGKILLed mid-way, resumed, the same decisions.

A tiny adaptive campaign (cubic and bbr at 25 % share of 10 ms timeslices, 20 Mbit/s, 20 ms RTT, runs of
2 s, 5 to 7 repetitions, stop at a half-width of 5 % of the rate) is started with ``bbrlab campaign run`` as a
subprocess, killed with SIGKILL once five runs are complete and a sixth is in flight, and run again. The
runs that end up committed, and ``decisions.json``, must be exactly what a replay of the stopping rule over
the committed runs gives: each point has its repetitions 0 .. n-1 and no other, where n is where the rule
stopped it, and ``bbrlab campaign status`` counts the rest as skipped.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from bbrlab.campaign import directory, repetitions
from bbrlab.run import record
from tests import killed_campaign

# make test-slow: about 2 minutes of the suite's 30 for a mechanism make test covers twice over, with stand-in runs
# killed and resumed by both executors (tests/unit/campaign/test_adaptive_campaign.py) and with a real search SIGKILLed and
# resumed on this testbed to the decisions of a replay (test_search_campaign_testbed.py).
pytestmark = [pytest.mark.system, pytest.mark.testbed, pytest.mark.slow]

RULE = {"min": 5, "max": 7, "precision": 0.05}


def _spec(testbed_name: str) -> dict:
    return {"name": "adaptive-resume", "testbed": testbed_name, "ccas": ["cubic", "bbr"], "timeslices_ms": [10],
            "cpu_shares_pct": [25], "rtts_ms": [20], "rates_mbit": [20], "repetitions": RULE, "duration_s": 2,
            "seed": 3, "max_attempts": 2}


def test_adaptive_campaign_killed_and_resumed_reaches_the_decisions_of_a_replay(testbed, tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_spec(testbed.name)))
    out = tmp_path / "campaign"
    argv = killed_campaign.run_argv(spec_path, out)
    killed_campaign.kill_when(argv, lambda: killed_campaign.complete(out) >= 5 and killed_campaign.in_flight(out),
                              "5 runs complete and a sixth in flight")
    assert 5 <= killed_campaign.complete(out) < 14
    killed_campaign.resume(argv)

    plan = directory.load_plan(out)
    runs = [(r.run_id, r.scenario) for r in plan.runs]
    replayed = repetitions.replay(repetitions.RepetitionRule.from_value(RULE), runs, out,
                                  settled=lambda run_id: record.is_complete(out, run_id)
                                  or len(record.failed_attempts(out, run_id)) >= 2)
    written = json.loads((out / repetitions.DECISIONS_FILE).read_text())
    assert written == replayed.to_dict()
    committed = {p.parent.name for p in (out / "runs").glob("*/record.json")}
    for decision in written["decisions"]:
        assert decision["state"] == "stopped" and decision["reason"] in ("precise", "at maximum"), decision
        reps = sorted(sc.repetition for run_id, sc in runs
                      if run_id in committed and repetitions.point_id(sc) == decision["point"])
        assert reps == list(range(decision["settled"])), (decision, reps)  # 0 .. n-1: none skipped, none beyond
        assert RULE["min"] <= decision["settled"] <= RULE["max"]
    st = directory.status(out)
    assert st.done == len(committed) and st.skipped == st.planned - st.done - st.failed and st.remaining == 0

    shown = subprocess.run([killed_campaign.BBRLAB, "campaign", "status", str(out)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and f"{st.skipped} skipped by the stopping rule" in shown.stdout, shown
