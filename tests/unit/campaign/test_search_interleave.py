"""The interleaved order of a threshold search and the coverage it states (issue #36, bbrlab.campaign.interleave,
bbrlab.campaign.search_coverage).

The decision procedure is the real one (:func:`bbrlab.campaign.interleave.replay` over
:func:`bbrlab.campaign.adaptive.search_step`); what runs is a stand-in: :func:`stand_in_run` settles a run with
a throughput computed from its share and its position in the order (a linear drift), nothing is measured. The
campaign-level tests (records, resume through the loop) are in test_search_campaign.py.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from bbrlab.analysis import thresholds
from bbrlab.campaign import adaptive, interleave, search_coverage

PLAN = adaptive.SearchPlan(target=16.0, low=10, high=100, step=2.5, resolution=2.5, min_reps=10, block=5,
                           max_reps=40)
#: Mbit/s lost per run of the order: 1 Mbit/s over 100 runs, slow against a run, large against a probe's spread.
DRIFT_MBIT_PER_RUN = 0.01
#: The back-to-back search of 2026-11-26 (schema 1), kept as a fixture when data/ was re-recorded interleaved.
BACK_TO_BACK_SEARCH = Path(__file__).resolve().parents[2] / "fixtures" / "search-v1"


def stand_in_run(share: float, position: int, repetition: int, drift: float = DRIFT_MBIT_PER_RUN) -> float:
    """A stand-in for a run (nothing runs): 16 Mbit/s (the target) at 41 % share, 0.4 Mbit/s more per point of
    share, a little spread by repetition, minus a linear drift with the run's position in the order."""
    return 16.0 + 0.4 * (share - 41.0) - drift * position + 0.05 * (repetition % 3)


def interleaved(curves, seed: int = 7, drift: float = DRIFT_MBIT_PER_RUN, stop_after: int | None = None,
                done: dict | None = None, reverse_rounds: bool = False):
    """Drive the real schedule with :func:`stand_in_run`: settle the round in progress's runs in order (or in
    reverse order, as a cluster may finish them), until the search is over or ``stop_after`` runs are settled.
    Returns the schedule and every settled run (curve, share, repetition) -> value, in the order settled."""
    plans = {c: PLAN for c in curves}
    done = {} if done is None else done
    while True:
        sched = interleave.replay(plans, lambda c, s, r: ((c, s, r) in done, done.get((c, s, r))), seed)
        todo = [sl for sl in sched.in_round(sched.current) if (sl.curve, sl.share, sl.repetition) not in done]
        if not todo:
            return sched, done
        for sl in reversed(todo) if reverse_rounds else todo:
            if stop_after is not None and len(done) >= stop_after:
                return sched, done
            done[(sl.curve, sl.share, sl.repetition)] = stand_in_run(sl.share, sl.position, sl.repetition, drift)


def back_to_back(curves, drift: float = DRIFT_MBIT_PER_RUN):
    """The order the search had before (each probe's runs in a row, one curve's probes after another), with
    the same stand-in and the same pure search: each curve's state and the positions of its runs."""
    clock, states, positions = [0], {}, {}
    for c in curves:
        taken: dict[float, int] = {}

        def response(share: float, n: int, c=c, taken=taken) -> list[float]:
            first = taken.get(share, 0)
            taken[share] = first + n
            out = []
            for rep in range(first, first + n):
                out.append(stand_in_run(share, clock[0], rep, drift))
                positions.setdefault(c, []).append(clock[0])
                clock[0] += 1
            return out

        states[c] = adaptive.run_search(response, PLAN)
    return states, positions


def test_the_open_probes_of_every_curve_run_mixed_a_block_at_a_time():
    sched, _ = interleaved(["a", "b", "c"])
    assert all(sched.states[c].done for c in "abc")
    rounds = sorted({s.round for s in sched.slots})
    assert [s.position for s in sched.slots] == list(range(len(sched.slots)))
    for r in rounds:
        slots = sched.in_round(r)
        per_probe = {(s.curve, s.share) for s in slots}
        assert len(per_probe) == len({s.curve for s in slots})  # one open probe per curve
        for probe in per_probe:
            assert sum((s.curve, s.share) == probe for s in slots) <= PLAN.block
        curves_in_order = [s.curve for s in slots]
        stretches = [c for c, _ in itertools.groupby(curves_in_order)]
        if len(per_probe) > 1:  # mixed, not each curve's block in a row
            assert len(stretches) > len(per_probe), curves_in_order
    shared_probes = 0
    for c in "abc":  # every probe spans two rounds at least; while others are open, their runs come between
        for d in sched.states[c].decisions:
            mine = [s for s in sched.slots if (s.curve, s.share) == (c, d["share"])]
            assert len({s.round for s in mine}) >= 2
            first, last = mine[0].position, mine[-1].position
            shared = any(s.curve != c for r in {s.round for s in mine} for s in sched.in_round(r))
            assert shared == any(s.curve != c for s in sched.slots[first:last])
            shared_probes += shared
    assert shared_probes >= 6


def test_a_linear_drift_moves_identical_curves_alike_instead_of_following_their_order():
    """Two curves of the same response: run back to back, the second sees the drift the first did not and its
    threshold comes out a step higher; interleaved, both see the same drift, at every seed tried, and their
    runs' mean position (the drift they meet) is the same within a round."""
    states, positions = back_to_back(["a", "b"])
    assert states["a"].interval() != states["b"].interval()
    assert states["b"].interval()[0] > states["a"].interval()[0]
    assert np.mean(positions["b"]) - np.mean(positions["a"]) > 40
    no_drift, _ = interleaved(["a"], drift=0.0)
    for seed in range(5):
        sched, _ = interleaved(["a", "b"], seed=seed)
        assert sched.states["a"].interval() == sched.states["b"].interval()
        assert sched.states["a"].decisions == sched.states["b"].decisions
        mean = {c: np.mean([s.position for s in sched.slots if s.curve == c]) for c in "ab"}
        round_size = 2 * PLAN.block
        assert abs(mean["a"] - mean["b"]) < round_size / 2, mean
        low, high = sched.states["a"].interval()
        assert abs(low - no_drift.states["a"].interval()[0]) <= PLAN.step  # drift of the mean run: ~1 point


@pytest.mark.parametrize("reverse_rounds", [False, True])
def test_a_search_resumed_at_any_run_makes_the_same_decisions_in_the_same_order(reverse_rounds):
    whole, settled = interleaved(["a", "b", "c"], reverse_rounds=reverse_rounds)
    order = list(settled)
    for cut in (1, 7, 10, 23, 31, len(order) - 1):
        kept = {k: settled[k] for k in order[:cut]}  # what a SIGKILL at that run leaves committed
        resumed, again = interleaved(["a", "b", "c"], done=kept, reverse_rounds=reverse_rounds)
        assert list(again) == order and again == settled
        assert resumed.slots == whole.slots
        for c, state in whole.states.items():
            assert resumed.states[c].decisions == state.decisions


def test_a_run_settled_without_a_value_is_replaced_by_a_later_repetition_in_the_next_round():
    plans = {"a": PLAN}
    failed = ("a", 55.0, 2)
    done: dict = {}
    while True:
        sched = interleave.replay(plans, lambda c, s, r: ((c, s, r) in done, done.get((c, s, r))), 3)
        todo = [sl for sl in sched.in_round(sched.current) if (sl.curve, sl.share, sl.repetition) not in done]
        if not todo:
            break
        for sl in todo:
            key = (sl.curve, sl.share, sl.repetition)
            done[key] = None if key == failed else stand_in_run(sl.share, sl.position, sl.repetition, 0.0)
    first = sched.states["a"].decisions[0]
    assert first["share"] == 55.0 and first["n"] == 10
    reps = sorted(s.repetition for s in sched.slots if s.share == 55.0)
    assert reps == list(range(11))  # 10 values from 11 runs


def _enumerated_error(looks: tuple[int, ...], alpha: float) -> float:
    """P(a probe says above | median at the target) by enumerating every sequence of runs above/below."""
    total = 0.0
    for path in itertools.product((0, 1), repeat=looks[-1]):
        for n in looks:
            verdict = adaptive.sign_verdict([float(v) for v in path[:n]], 0.5, alpha)
            if verdict != "undecided":
                total += 0.5 ** looks[-1] if verdict == "above" else 0.0
                break
    return total


@pytest.mark.parametrize(("looks", "alpha"), [((3, 4, 5), 0.2), ((4, 6, 8, 10), 0.05), ((10,), 0.001)])
def test_a_probes_error_is_exact_and_within_bonferronis_bound(looks, alpha):
    error = search_coverage.probe_error(looks, alpha)
    assert error == pytest.approx(_enumerated_error(looks, alpha), abs=1e-12)
    assert 0 < error <= len(looks) * alpha + 1e-12


def test_the_default_plans_probe_error_matches_a_simulation_at_the_target():
    """200,000 probes with every run at or above the target with probability 1/2 (the median at it): the
    share that says above is the exact error within 4 standard errors."""
    error = search_coverage.plan_error(PLAN)
    rng = np.random.default_rng(11)
    hits = rng.integers(0, 2, size=(200_000, PLAN.max_reps)).cumsum(axis=1)
    alive = np.ones(len(hits), bool)
    above = 0
    for n in PLAN.looks():
        k = hits[:, n - 1]
        says = {v: adaptive.sign_verdict([1.0] * v + [0.0] * (n - v), 0.5, PLAN.alpha_per_look())
                for v in range(n + 1)}
        up = np.array([says[v] == "above" for v in range(n + 1)])[k] & alive
        down = np.array([says[v] == "below" for v in range(n + 1)])[k] & alive
        above += up.sum()
        alive &= ~(up | down)
    se = np.sqrt(error * (1 - error) / len(hits))
    assert abs(above / len(hits) - error) < 4 * se
    assert error < len(PLAN.looks()) * PLAN.alpha_per_look()


def test_the_statement_gives_each_curve_and_all_curves_their_bonferroni_level():
    sched, _ = interleaved(["a", "b"])
    decided = [sum(d["verdict"] != "undecided" for d in sched.states[c].decisions) for c in "ab"]
    st = search_coverage.statement(PLAN, decided)
    error = search_coverage.plan_error(PLAN)
    assert st["probe_error"] == error and st["decisions"] == sum(decided)
    assert st["joint_level"] == pytest.approx(1 - sum(decided) * error)
    assert search_coverage.curve_level(decided[0], error) > st["joint_level"] >= 1 - PLAN.alpha * 2
    assert st["asked"] == pytest.approx(0.95)


def test_a_back_to_back_search_of_schema_1_still_reads_with_its_levels():
    d = thresholds.read_search(BACK_TO_BACK_SEARCH)
    raw = json.loads((BACK_TO_BACK_SEARCH / "decisions.json").read_text())
    assert raw["schema"] == "bbrlab.search/1" and d["order"] == "back to back"
    error = d["coverage"]["probe_error"]
    for curve in d["decisions"]:
        decided = sum(p["verdict"] != "undecided" for p in curve["probes"])
        assert curve["level"] == pytest.approx(1 - decided * error)
    assert d["coverage"]["joint_level"] == pytest.approx(1 - d["coverage"]["decisions"] * error)
    table = thresholds.threshold_table(BACK_TO_BACK_SEARCH)
    assert len(table) == 4 and set(table["order"]) == {"back to back"} and (table["level"] < 1).all()
    lines = thresholds.coverage_lines(BACK_TO_BACK_SEARCH)
    assert lines[0] == "order: back to back" and "undecided" in "\n".join(lines)
