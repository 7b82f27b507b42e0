"""Adaptive repetitions and the threshold search (bbrlab.campaign.adaptive): pure decisions on small data."""

import numpy as np
import pytest

from bbrlab.campaign import adaptive


def test_a_tight_point_stops_once_its_interval_reaches_95_a_spread_one_goes_on_to_its_maximum():
    """Five agreeing runs give [min, max] at 93.75 %, not 95 %: the point goes on to its 6th run (96.9 %)."""
    kw = {"min_reps": 5, "max_reps": 12, "half_width": 0.025}
    assert adaptive.needs_more([94.0, 94.5, 94.2], 100, **kw).reason == "below minimum"
    five = adaptive.needs_more([94.0, 94.5, 94.2, 94.1, 94.3], 100, **kw)
    assert five.more and five.reason == "too few for the level" and five.ci_level == pytest.approx(0.9375)
    tight = adaptive.needs_more([94.0, 94.5, 94.2, 94.1, 94.3, 94.2], 100, **kw)
    assert not tight.more and tight.reason == "precise" and tight.half_width <= 0.025
    assert tight.ci_level == pytest.approx(1 - 2 * 0.5 ** 6)
    spread = [5.0, 90.0, 8.0, 85.0, 50.0, 70.0]
    assert adaptive.needs_more(spread, 100, **kw).more
    assert adaptive.needs_more(spread * 2, 100, **kw).reason == "at maximum"


def test_a_point_clear_of_the_threshold_stops_early_only_when_asked():
    low = [5.0, 20.0, 9.0, 30.0, 12.0, 15.0]
    kw = {"min_reps": 5, "max_reps": 30, "half_width": 0.01}
    assert adaptive.needs_more(low, 100, **kw).more
    assert adaptive.needs_more(low, 100, threshold=80, **kw).reason == "clear of the threshold"


def test_the_sign_test_needs_agreement_to_decide():
    assert adaptive.sign_verdict([95.0] * 10, 80, 0.001) == "above"
    assert adaptive.sign_verdict([5.0] * 10, 80, 0.001) == "below"
    assert adaptive.sign_verdict([5.0] * 9, 80, 0.001) == "undecided"  # 2^-9 > 0.001
    assert adaptive.sign_verdict([95.0] * 6 + [5.0] * 4, 80, 0.001) == "undecided"


@pytest.mark.parametrize("edge", [12.3, 37.0, 61.0, 88.8])
def test_the_search_finds_a_step_within_its_resolution(edge):
    plan = adaptive.SearchPlan(target=80)
    state = adaptive.run_search(lambda s, n: [95.0 if s >= edge else 5.0] * n, plan)
    low, high = state.interval()
    assert low < edge <= high and high - low <= 2 * plan.resolution
    assert state.runs() < 19 * 30 / 5  # a fifth of the fixed 5 % grid at 30 repetitions


def test_the_search_finds_a_noisy_sigmoid_threshold_and_says_when_it_is_out_of_range():
    rng = np.random.default_rng(5)

    def bimodal(share, n, mid=47.0):  # the share of runs that escape rises smoothly; the median crosses at mid
        escaped = rng.random(n) < 1 / (1 + np.exp(-(share - mid) / 3))
        return np.where(escaped, rng.normal(92, 3, n), rng.normal(10, 5, n))

    plan = adaptive.SearchPlan(target=80)
    state = adaptive.run_search(bimodal, plan)
    low, high = state.interval()
    assert low < 47 <= high and high - low <= 10
    never = adaptive.run_search(lambda s, n: [5.0] * n, plan)
    assert never.interval() == (100.0, None)
    always = adaptive.run_search(lambda s, n: [95.0] * n, plan)
    assert always.interval() == (None, 10.0)


def test_the_same_committed_runs_give_the_same_decisions():
    """A resumed search replays its decisions from the committed runs alone; cutting them short (a kill
    before the next block) asks for the same next runs again."""
    rng = np.random.default_rng(9)
    plan = adaptive.SearchPlan(target=80)
    committed: dict[float, list[float]] = {}
    history = []
    while not (state := adaptive.search_step(committed, plan)).done:
        history.append((state.next_share, state.runs_needed))
        committed.setdefault(state.next_share, []).extend(rng.normal(60 + state.next_share / 2, 15, state.runs_needed))
    again = adaptive.search_step({k: list(v) for k, v in committed.items()}, plan)
    assert again.decisions == state.decisions and again.interval() == state.interval()
    share, n = history[-1]
    cut = {k: list(v) for k, v in committed.items()}
    cut[share] = cut[share][:-n]
    resumed = adaptive.search_step(cut, plan)
    assert (resumed.next_share, resumed.runs_needed) == (share, n)
    runs = [70.0, 85.0, 90.0, 60.0, 95.0, 88.0]
    first = adaptive.needs_more(runs, 100, min_reps=5, max_reps=30, half_width=0.05)
    assert adaptive.needs_more(list(runs), 100, min_reps=5, max_reps=30, half_width=0.05) == first
