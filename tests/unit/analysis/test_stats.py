"""Confidence intervals, effect sizes and threshold intervals (bbrlab.analysis.stats) and where they show:
the summaries the figures draw, their bands and points.json. Real computations on small simulated data."""

import json
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bbrlab.analysis import data, facets, offaxis, stats


def _mixture_median() -> float:
    """The median of 0.7 N(90, 3) + 0.3 N(10, 5): a point where some runs collapse (bimodal)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    return brentq(lambda m: 0.7 * norm.cdf(m, 90, 3) + 0.3 * norm.cdf(m, 10, 5) - 0.5, 10, 90)


DISTRIBUTIONS = {  # name: (draw(rng, shape), true median)
    "normal": (lambda rng, shape: rng.normal(50, 10, shape), 50.0),
    "exponential": (lambda rng, shape: rng.exponential(1.0, shape), math.log(2)),
    "bimodal": (lambda rng, shape: np.where(rng.random(shape) < 0.7, rng.normal(90, 3, shape),
                                            rng.normal(10, 5, shape)), None),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_every_stated_level_is_met_by_simulation(name):
    """3000 seeded samples of each n in {2, 3, 5, 10, 20, 30} from a known distribution, at the asked levels
    95 % and 80 %: the share of intervals that hold the true median is at least the level each interval
    states, less 2 points (the binomial sd of a share near 95 % over 3000 draws is 0.4 points; near 50 %,
    0.9). The old percentile bootstrap stated 95 % at n = 2 and covered about 50 %."""
    draw, median = DISTRIBUTIONS[name]
    median = _mixture_median() if median is None else median
    rng = np.random.default_rng(36)
    for n in (2, 3, 5, 10, 20, 30):
        samples = draw(rng, (3000, n))
        for asked in (0.95, 0.8):
            intervals = [stats.median_interval(x, asked) for x in samples]
            stated = {ci.level for ci in intervals}
            assert len(stated) == 1  # the level depends on n and the asked level only
            [level] = stated
            covered = np.mean([ci.low <= median <= ci.high for ci in intervals])
            assert covered >= level - 0.02, (name, n, asked, level, covered)
            assert level >= asked or (n < 6 and level == pytest.approx(1 - 2 * 0.5 ** n))


def test_the_interval_states_its_level_and_names_min_max_where_n_is_too_small():
    two = stats.median_interval([94.7, 80.0])
    assert (two.low, two.high, two.level) == (80.0, 94.7, 0.5) and two.text() == "n = 2: [min, max], 50 %"
    assert not two.reaches(0.95)
    assert stats.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]).text() == "n = 5: [min, max], 93.7 %"  # never 93.8
    ten = stats.median_interval(list(range(10)))
    assert (ten.low, ten.high, ten.rank) == (1.0, 8.0, 2) and ten.reaches(0.95)
    assert ten.level == pytest.approx(1 - 2 * 11 / 1024)


def test_a_wider_level_gives_a_wider_interval_and_the_same_runs_the_same_interval():
    x = np.random.default_rng(3).normal(50, 10, 20)
    lo95, hi95 = stats.median_ci(x)
    lo99, hi99 = stats.median_ci(x, 0.99)
    assert lo99 <= lo95 < np.median(x) < hi95 <= hi99 and hi99 - lo99 > hi95 - lo95
    assert stats.median_ci(x) == stats.median_ci(list(x)) == stats.median_ci(x[::-1])  # order does not matter


def test_fewer_than_two_runs_give_no_interval_and_identical_runs_a_point():
    assert all(math.isnan(v) for v in stats.median_ci([5.0]))
    assert all(math.isnan(v) for v in stats.median_ci([5.0, float("nan")]))
    assert math.isnan(stats.median_interval([5.0]).level)
    assert stats.median_ci([94.7, 94.7, 94.7]) == (94.7, 94.7)


def test_effect_sizes_and_the_rank_test_see_a_shift_and_not_noise():
    rng = np.random.default_rng(11)
    a, b = rng.normal(10, 1, 30), rng.normal(14, 1, 30)
    c = stats.compare(a, b)
    assert c.shift == pytest.approx(4, abs=0.7) and c.cliffs_delta > 0.9 and c.p_value < 1e-6
    assert c.magnitude() == "large"
    same = stats.compare(a, rng.normal(10, 1, 30))
    assert abs(same.cliffs_delta) < 0.4 and same.p_value > 0.01
    assert stats.cliffs_delta([1, 2], [3, 4]) == 1.0 and stats.cliffs_delta([3, 4], [1, 2]) == -1.0
    assert stats.hodges_lehmann([0, 0], [1, 3]) == 2.0


def test_below_four_runs_a_side_there_is_no_effect_size_and_no_test():
    """2 vs 2: the exact test's smallest p is 1/3 and Cliff's delta takes five values; 3 vs 3: p >= 0.1.
    From 4 vs 4 (p >= 0.029) a test can call a difference, and the magnitude word returns."""
    for n in (2, 3):
        c = stats.compare([1.0, 2.0, 3.0][:n], [90.0, 91.0, 92.0][:n])
        assert c.magnitude() == "n too small" and math.isnan(c.cliffs_delta) and math.isnan(c.p_value)
        assert math.isnan(c.shift) and (c.median_a, c.n_a) == (np.median([1.0, 2.0, 3.0][:n]), n)
    assert stats.too_few_to_compare(2, 7) and not stats.too_few_to_compare(2, 8)  # 2 / C(10, 2) = 0.044
    c = stats.compare([1.0, 2.0, 3.0, 4.0], [90.0, 91.0, 92.0, 93.0])
    assert c.cliffs_delta == 1.0 and c.p_value == pytest.approx(2 / 70) and c.magnitude() == "large"


def test_threshold_interval_brackets_the_crossing_between_certain_points():
    shares = [10, 25, 40, 55, 70, 100]
    med = [5, 20, 70, 85, 92, 95]
    lo = [3, 15, 50, 78, 90, 94]  # 55: its interval straddles 80
    hi = [7, 25, 82, 90, 94, 96]  # 40 as well
    t = stats.threshold_interval(shares, med, lo, hi, 80)
    assert (t.estimate, t.low, t.high) == (55, 25, 70)
    assert t.contains(40) and t.contains(70) and not t.contains(25) and not t.contains(71)
    assert t.text() == "55 % (CI 25-70 %)"


def test_threshold_interval_open_ends():
    never = stats.threshold_interval([10, 50, 100], [5, 40, 95], [3, 30, 94], [7, 50, 96], 80)
    assert never.estimate is None and never.low == 50 and never.high == 100
    always = stats.threshold_interval([10, 50], [85, 90], [81, 88], [90, 92], 80)
    assert always.estimate == 10 and always.low is None and always.high == 10
    unsure = stats.threshold_interval([10, 50], [70, 90], [60, float("nan")], [85, float("nan")], 80)
    assert unsure.estimate == 50 and unsure.low is None and unsure.high is None


def _runs(values_by_share: dict) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": f"{s}-{i}", "variant": "BBRv1", "cpu_share_pct": float(s), "throughput_mbit": v}
                         for s, vals in values_by_share.items() for i, v in enumerate(vals)])


def test_summaries_carry_the_ci_of_the_median_beside_the_iqr():
    runs = _runs({25: [1.0, 2.0, 3.0, 4.0, 50.0], 50: [90.0, 91.0, 92.0], 70: [95.0]})
    table = data.summarise(runs, ["variant", "cpu_share_pct"])
    assert list(table.columns) == ["variant", "cpu_share_pct", *data.SUMMARY_COLUMNS]
    row = table.set_index("cpu_share_pct").loc[25.0]
    assert (row["ci_low"], row["ci_high"]) == stats.median_ci([1.0, 2.0, 3.0, 4.0, 50.0])
    assert row["ci_low"] <= row["median"] <= row["ci_high"] and (row["q25"], row["q75"]) == (2.0, 4.0)
    assert table.set_index("cpu_share_pct").loc[70.0, ["ci_low", "ci_high"]].isna().all()
    assert list(data.summarise(runs.iloc[0:0], ["variant"]).columns) == ["variant", *data.SUMMARY_COLUMNS]
    levels = table.set_index("cpu_share_pct")["ci_level"]
    assert levels[25.0] == pytest.approx(0.9375) and levels[50.0] == pytest.approx(0.75) and math.isnan(levels[70.0])


def test_a_figure_of_two_run_points_says_50_and_never_95(tmp_path):
    """The figures of data/ (2 runs a point) drew [min, max] under "95 % CI of the median"; the legend and
    points.json now state the level each point reaches."""
    runs = _runs({25: [10.0, 12.0], 50: [20.0, 21.0], 75: [30.0 + v for v in range(6)]})
    fig, table = facets.facet_lines(runs, x="cpu_share_pct", value="throughput_mbit", hue="variant", row=None,
                                    col=None)
    facets.save(fig, tmp_path, "f", formats=("png",))
    legend = fig.legends[0].get_title().get_text()
    assert "n = 2: [min, max], 50 %" in legend and "n >= 6: >= 95 %" in legend and "95 % CI" not in legend
    (band,) = json.loads((tmp_path / "f.points.json").read_text())[0]["bands"]
    assert band["level"] == pytest.approx([0.5, 0.5, 1 - 2 * 0.5 ** 6]) and band["n"] == [2, 2, 6]
    assert "95" not in band["shows"]
    plt.close(fig)


def test_points_json_carries_the_bands_and_they_stay_in_view(tmp_path):
    """One outlier far above the medians: the band reaches it, the shared y axis must too (a relim that
    forgot the bands would end near the medians and hide the band's top)."""
    runs = _runs({25: [10.0, 10.5, 11.0, 200.0], 50: [10.0, 10.2, 10.4, 10.6]})
    fig, table = facets.facet_lines(runs, x="cpu_share_pct", value="throughput_mbit", hue="variant", row=None,
                                    col=None)
    facets.save(fig, tmp_path, "f", formats=("png",))
    points = json.loads((tmp_path / "f.points.json").read_text())
    (band,) = points[0]["bands"]
    assert band["label"] == "BBRv1" and band["shows"] == facets.BAND_SHOWS
    assert band["low"] == pytest.approx(table["ci_low"].tolist())
    assert band["high"] == pytest.approx(table["ci_high"].tolist())
    assert band["high"][0] > 100  # the outlier is in the interval ...
    assert offaxis.points_outside_axes(points) == []  # ... and in view
    assert facets.BAND_SHOWS in fig.legends[0].get_title().get_text()
    plt.close(fig)


def test_a_band_outside_its_panel_is_reported_as_hidden():
    points = [{"title": "p", "xlim": [0, 100], "ylim": [0, 50], "lines": [],
               "bands": [{"label": "BBRv1", "shows": facets.BAND_SHOWS, "x": [25.0], "low": [10.0], "high": [60.0]}]}]
    (hidden,) = offaxis.points_outside_axes(points)
    assert hidden["y"] == 60.0 and "CI" in hidden["label"]


@pytest.mark.parametrize("level", [0.5, 0.95, 0.99])
def test_the_order_statistic_rank_is_the_binomial_rank_for_every_n_up_to_20000(level):
    """The rank grows its binomial sum a term at a time: it must equal scipy's binomial CDF for every n, and a
    group of 20,000 runs is in reach (the quadratic sum before took 334 s in one figure of make bench; the speed
    itself is make bench's to print, not this test's)."""
    from scipy.stats import binom

    from bbrlab.core.confidence import order_statistic_rank

    for n in [*range(2, 300), 1_000, 4_999, 20_000]:
        k, reached = order_statistic_rank(n, level)
        assert reached == pytest.approx(1 - 2 * binom.cdf(k - 1, n, 0.5), abs=1e-9)
        assert k == 1 or reached >= level
        if k < (n + 1) // 2:  # one rank further in falls short of the level
            assert 1 - 2 * binom.cdf(k, n, 0.5) < level
