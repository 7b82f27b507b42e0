"""Adaptive repetitions wired into the campaign engine (issue #30, bbrlab.campaign.repetitions).

The loop is driven with a synthetic run function (no testbed): it writes an ``iperf.json`` whose throughput is
known from the scenario and repetition, so the decisions it should lead to are known. A tight point stops at
its minimum, a spread one runs to its maximum; the blocked-random order is kept; a campaign interrupted after
any number of runs and resumed (by either executor) ends with the same runs and the same decisions as one
never interrupted, and as a replay of the rule over its committed runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bbrlab.campaign import directory, repetitions
from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.core.signals import Interrupted
from bbrlab.run import record
from tests.campaign_runs import run_metadata
from tests.unit.campaign.test_engine import Reversed

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

RULE = {"min": 5, "max": 8, "precision": 0.05}
BASE = {"name": "adaptive", "ccas": ["cubic", "bbr"], "timeslices_ms": [1, 10], "cpu_shares_pct": [25, 100],
        "rtts_ms": [20], "rates_mbit": [100], "repetitions": RULE, "duration_s": 5, "max_attempts": 2}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def known_mbit(scenario) -> float:
    """The synthetic response: Cubic and uncontended BBR give 94-95 Mbit/s (tight); BBR at 25 % share swings
    between collapse and recovery (4 to 92 Mbit/s, never precise within 5 % of the rate in 8 runs)."""
    r = scenario.repetition
    if scenario.flow.cca == "bbr" and scenario.contention.cpu_share_pct < 100:
        return [4.0, 92.0, 10.0, 85.0, 40.0, 70.0, 8.0, 90.0][r]
    return 94.0 + 0.1 * (r % 3)


def synthetic_run(calls: list, fail_ids=frozenset(), interrupt_at: int | None = None):
    """A synthetic run function: writes iperf.json with :func:`known_mbit`; fails for ``fail_ids``; raises
    :class:`Interrupted` (a signal's effect) when called for the ``interrupt_at``-th time."""

    def run(scenario, staging, *, run_id, attempt):
        if interrupt_at is not None and len(calls) + 1 == interrupt_at:
            raise Interrupted(15)
        calls.append((run_id, attempt))
        if run_id in fail_ids:
            raise RuntimeError("receiver unreachable")
        report = {"end": {"sum_received": {"bits_per_second": known_mbit(scenario) * 1e6}}}
        (staging / "iperf.json").write_text(json.dumps(report))
        return run_metadata(scenario)

    return run


def _committed(out: Path) -> list[str]:
    return sorted(p.parent.name for p in (out / record.RUNS).glob(f"*/{record.RECORD_FILE}"))


def _decisions(out: Path) -> dict:
    return json.loads((out / repetitions.DECISIONS_FILE).read_text())


# -- the spec --------------------------------------------------------------------------------------------

def test_the_spec_states_min_max_and_precision_and_plans_the_maximum():
    s = spec()
    assert s.adaptive == repetitions.RepetitionRule(5, 8, 0.05) and s.repetitions == 8 and s.runs == 64
    assert s.to_dict()["repetitions"] == RULE and "adaptive" not in s.to_dict()
    assert CampaignSpec.from_dict(s.to_dict()) == s
    assert spec(repetitions=4).adaptive is None and "adaptive" not in spec(repetitions=4).to_dict()


@pytest.mark.parametrize(("value", "field"), [
    ({"min": 5, "max": 8}, "repetitions.precision"),
    ({"min": 4, "max": 8, "precision": 0.05}, "repetitions.min"),
    ({"min": 5, "max": 4, "precision": 0.05}, "repetitions.max"),
    ({"min": 5, "max": 8, "precision": 0.6}, "repetitions.precision"),
    ({"min": 5, "max": 8, "precision": True}, "repetitions.precision"),
    ({"min": 5.0, "max": 8, "precision": 0.05}, "repetitions.min"),
    ({"min": 5, "max": 8, "precision": 0.05, "block": 2}, "repetitions.block"),
])
def test_bad_adaptive_repetitions_are_refused_naming_the_key(value, field):
    with pytest.raises(ValidationError) as e:
        spec(repetitions=value)
    assert e.value.field == field and e.value.allowed


def test_the_plan_keeps_its_blocked_random_order_and_the_expected_count_lies_between_min_and_max():
    s = spec()
    runs = s.plan()
    assert [sc.repetition for sc in runs] == [r for r in range(8) for _ in range(8)]
    assert runs == spec(repetitions=8).plan()  # the same order as a fixed campaign of max repetitions
    rule = s.adaptive
    assert rule.expected_reps(0.001) == 6 and rule.expected_reps(0.5) == 8  # 95 % needs 6 runs
    assert 6 * 8 <= s.expected_runs(0.05) <= 64


# -- the decision rule -----------------------------------------------------------------------------------

def test_decide_point_stops_a_tight_point_once_95_is_reached_and_a_spread_one_at_its_maximum():
    rule = repetitions.RepetitionRule(5, 8, 0.05)
    five = repetitions.decide_point([94.0, 94.1, 94.2, 94.1, 94.0], 100, rule)
    assert (five.state, five.reason, five.ci_level) == ("running", "too few for the level", 0.9375)
    tight = repetitions.decide_point([94.0, 94.1, 94.2, 94.1, 94.0, 94.1], 100, rule)
    assert (tight.state, tight.reason, tight.settled) == ("stopped", "precise", 6)
    assert tight.half_width <= 0.05 and tight.median_mbit == 94.1
    early = repetitions.decide_point([94.0, 94.1, 94.2, 94.1], 100, rule)
    assert (early.state, early.reason) == ("running", "below minimum")
    spread = [4.0, 92.0, 10.0, 85.0, 40.0, 70.0, 8.0, 90.0]
    assert repetitions.decide_point(spread[:6], 100, rule).reason == "too wide"
    full = repetitions.decide_point(spread, 100, rule)
    assert (full.state, full.reason, full.settled, full.values) == ("stopped", "at maximum", 8, 8)


def test_a_run_without_a_value_counts_as_settled_and_the_point_goes_on():
    rule = repetitions.RepetitionRule(5, 8, 0.05)
    d = repetitions.decide_point([94.0, None, 94.2, 94.1, 94.0], 100, rule)
    assert d.settled == 5 and d.values == 4 and d.state == "running" and d.reason == "below minimum"
    assert repetitions.decide_point([94.0, None, 94.2, 94.1, 94.0, 94.2], 100, rule).state == "running"
    assert repetitions.decide_point([94.0, None, 94.2, 94.1, 94.0, 94.2, 94.1], 100, rule).state == "stopped"


# -- the engine with a synthetic run function --------------------------------------------------------------

def test_with_a_synthetic_run_function_tight_points_stop_at_6_and_spread_ones_reach_max(tmp_path):
    s = spec()
    calls: list = []
    st = campaign.run_campaign(s, tmp_path, synthetic_run(calls), options=QUIET)
    per_point: dict[str, int] = {}
    for sc in s.plan():
        if sc.run_id in _committed(tmp_path):
            per_point[(sc.flow.cca, sc.contention.timeslice_ms, sc.contention.cpu_share_pct)] = sc.repetition + 1
    spread = {("bbr", 1, 25), ("bbr", 10, 25)}
    assert {k: n for k, n in per_point.items() if k in spread} == {k: 8 for k in spread}
    assert {k: n for k, n in per_point.items() if k not in spread} == {k: 6 for k in per_point if k not in spread}
    assert st.done == 2 * 8 + 6 * 6 and st.skipped == 64 - st.done and st.remaining == 0 and st.complete
    assert st.points == {"point(s) stopped: at maximum": 2, "point(s) stopped: precise": 6}
    order = [sc.run_id for sc in s.plan()]
    assert [r for r, _ in calls] == [r for r in order if r in set(_committed(tmp_path))]  # the plan's order
    d = _decisions(tmp_path)
    assert d["rule"] == RULE and d["skipped_runs"] == 64 - st.done and d["stopped"] == 8
    assert sorted(p["settled"] for p in d["decisions"]) == [6] * 6 + [8] * 2


def test_a_failed_run_settles_without_a_value(tmp_path):
    s = spec()
    cubic = next(sc for sc in s.plan() if sc.flow.cca == "cubic" and sc.repetition == 1)
    campaign.run_campaign(s, tmp_path, synthetic_run([], {cubic.run_id}), options=QUIET)
    point = next(p for p in _decisions(tmp_path)["decisions"] if p["point"] == repetitions.point_id(cubic))
    assert (point["settled"], point["values"], point["reason"]) == (7, 6, "precise")


@pytest.mark.parametrize("kill_after", [1, 9, 30, 37, 44])
@pytest.mark.parametrize("executor", ["in-process", "reversed"])
def test_an_interrupted_campaign_resumes_to_the_same_decisions(tmp_path, kill_after, executor):
    """Interrupted after ``kill_after`` runs and resumed, the campaign runs what one never interrupted runs
    and writes the same decisions; both equal a replay of the rule over the committed runs."""
    s = spec()

    def make(out, run_fn):
        return campaign.InProcess(run_fn, out) if executor == "in-process" else Reversed(run_fn, out)

    whole = tmp_path / "whole"
    campaign.drive(s, whole, make(whole, synthetic_run([])), options=QUIET)
    cut = tmp_path / "cut"
    first: list = []
    with pytest.raises(Interrupted):
        campaign.drive(s, cut, make(cut, synthetic_run(first, interrupt_at=kill_after + 1)), options=QUIET)
    assert len(_committed(cut)) == kill_after
    second: list = []
    campaign.drive(s, cut, make(cut, synthetic_run(second)), options=QUIET)
    assert not {r for r, _ in first} & {r for r, _ in second}
    assert _committed(cut) == _committed(whole)
    assert _decisions(cut) == _decisions(whole)
    plan = directory.load_plan(cut)
    replayed = repetitions.replay(s.adaptive, [(r.run_id, r.scenario) for r in plan.runs], cut,
                                  settled=lambda r: record.is_complete(cut, r))
    assert replayed.to_dict() == _decisions(cut)


def test_a_fixed_campaign_writes_no_decisions_and_counts_as_before(tmp_path):
    s = spec(repetitions=2)
    st = campaign.run_campaign(s, tmp_path, synthetic_run([]), options=QUIET)
    assert not (tmp_path / repetitions.DECISIONS_FILE).exists()
    assert st.to_dict() == {"campaign": "adaptive", "planned": 16, "done": 16, "failed": 0, "failed_attempts": 0,
                            "running": 0, "remaining": 0}
