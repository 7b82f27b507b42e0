"""The threshold search on the local testbed (issues #30, #36): SIGKILLed mid-way, resumed, the same probes.

A tiny search (bbr at 10 ms timeslices, 20 Mbit/s, 20 ms RTT, runs of 2 s; shares 50 and 100 only, 3 runs a
probe at 50 % confidence so that a unanimous probe decides) is started with ``bbrlab campaign run`` as a
subprocess, killed with SIGKILL once two runs are complete and a third is in flight, and run again. The runs
committed and ``decisions.json`` must be what a replay of the search over the committed runs gives, each
probed share holding its repetitions 0 .. n-1 and no other, and each record saying its place in the search's
order (round after round, one run a round here); ``bbrlab campaign thresholds`` shows the interval.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from bbrlab.campaign import directory, search
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.run import record
from tests import killed_campaign

pytestmark = [pytest.mark.system, pytest.mark.testbed]

RULE = {"target": 0.8, "low": 50, "high": 100, "step": 50, "resolution": 50, "min": 3, "block": 1, "max": 3,
        "confidence": 0.5}


def _spec(testbed_name: str) -> dict:
    return {"name": "search-resume", "testbed": testbed_name, "ccas": ["bbr"], "timeslices_ms": [10],
            "rtts_ms": [20], "rates_mbit": [20], "search": RULE, "duration_s": 2, "seed": 5, "max_attempts": 2}


def test_search_killed_and_resumed_reaches_the_probes_of_a_replay(testbed, tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_spec(testbed.name)))
    out = tmp_path / "campaign"
    argv = killed_campaign.run_argv(spec_path, out)
    killed_campaign.kill_when(argv, lambda: killed_campaign.complete(out) >= 2 and killed_campaign.in_flight(out),
                              "2 runs complete and a third in flight")
    killed_campaign.resume(argv)

    plan = directory.load_plan(out)
    runs = [(r.run_id, r.scenario) for r in plan.runs]
    rule = CampaignSpec.from_dict(_spec(testbed.name)).search  # its seed (5) is the spec's
    replayed = search.make_gate(None, rule, runs, out,
                                settled=lambda run_id: record.is_complete(out, run_id)
                                or len(record.failed_attempts(out, run_id)) >= 2)
    written = search.read_decisions(out)
    assert written == json.loads(json.dumps(replayed.to_dict()))
    [curve] = written["decisions"]
    assert curve["done"], curve
    committed = {p.parent.name for p in (out / "runs").glob("*/record.json")}
    probed = {}
    for run_id, sc in runs:
        if run_id in committed:
            probed.setdefault(sc.contention.cpu_share_pct, []).append(sc.repetition)
    assert {p["share"] for p in curve["probes"]} == set(probed), (curve["probes"], probed)
    for share, reps in probed.items():
        assert sorted(reps) == list(range(len(reps))), (share, reps)  # 0 .. n-1: none skipped, none beyond
    assert curve["runs"] == len(committed) == sum(p["n"] for p in curve["probes"])
    in_order = written["runs_in_order"]  # every run in the search's order, each record saying its place
    assert [p for p, _, _ in in_order] == list(range(len(committed))) and {r for *_, r in in_order} == committed
    for position, round_number, run_id in in_order:
        meta = json.loads((out / "runs" / run_id / "record.json").read_text())["metadata"]
        assert meta["search"] == {"position": position, "round": round_number}, run_id

    shown = subprocess.run([killed_campaign.BBRLAB, "campaign", "thresholds", str(out)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    low, high = curve["threshold_low_pct"], curve["threshold_high_pct"]
    interval = f"{'below range' if low is None else f'({low:g}'}, {'never' if high is None else f'{high:g}]'}"
    assert interval in shown.stdout, (shown.stdout, low, high)
