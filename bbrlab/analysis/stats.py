"""Confidence for bbrlab's numbers: the interval of a median, an effect size, a rank test, a threshold's interval.

Every figure's median carries the distribution-free order-statistic interval (:func:`median_interval`, defined in
:mod:`bbrlab.core.confidence` so the campaign can use it too) with the level it really reaches: 95 % asked,
[min, max] at 1 - 2 x 0.5^n where n is too small for that (50 % at n = 2). Two samples (patched vs original BBR
at one point) are compared by the Hodges-Lehmann shift (:func:`hodges_lehmann`), Cliff's delta
(:func:`cliffs_delta`) and the Mann-Whitney U test, all three in :func:`compare`, and only where the runs can
support them (:func:`too_few_to_compare`). :func:`threshold_interval` turns a curve of medians with their
intervals into the interval of the share at which the median reaches a target (the paper's 80 % of the rate).

scipy is imported inside the functions (a heavy import the rest of the package does not need).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bbrlab.core.confidence import (  # noqa: F401 - re-exported
    LEVEL,
    MIN_N,
    BlockedInterval,
    MedianInterval,
    blocked_median_interval,
    level_text,
    median_ci,
    median_interval,
)

#: Significance level a comparison must be able to reach: a pair of samples whose exact two-sided Mann-Whitney
#: test cannot give p < 0.05 even when every run of one lies above every run of the other gets no test and no
#: effect size. With equal groups that is fewer than 4 runs a side (3 vs 3: smallest p = 2 / C(6, 3) = 0.1;
#: 4 vs 4: 2 / C(8, 4) = 0.029). Cliff's delta at 2 vs 2 takes only the values -1, -0.5, 0, 0.5 and 1, so a
#: magnitude word there says nothing about the effect.
COMPARE_ALPHA = 0.05
#: What :meth:`Comparison.magnitude` says for such a pair.
TOO_FEW = "n too small"


def hodges_lehmann(a: Sequence[float], b: Sequence[float]) -> float:
    """The Hodges-Lehmann shift of ``b`` against ``a``: the median of all pairwise differences b_j - a_i."""
    x, y = _clean(a), _clean(b)
    if not len(x) or not len(y):
        return math.nan
    return float(np.median(np.subtract.outer(y, x)))


def cliffs_delta(a: Sequence[float], b: Sequence[float]) -> float:
    """Cliff's delta of ``b`` against ``a``: P(b > a) - P(b < a) over all pairs, in [-1, 1] (1: every b is larger)."""
    x, y = _clean(a), _clean(b)
    if not len(x) or not len(y):
        return math.nan
    d = np.subtract.outer(y, x)
    return float((np.sum(d > 0) - np.sum(d < 0)) / d.size)


def _clean(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[~np.isnan(x)]


@dataclass(frozen=True)
class Comparison:
    """Two samples compared (``b`` against ``a``, e.g. patched against original at one point).

    Attributes
    ----------
    n_a, n_b : int
    median_a, median_b : float
    shift : float
        Hodges-Lehmann shift of b against a (same unit as the values); NaN when the samples are too small
        (:func:`too_few_to_compare`).
    cliffs_delta : float
        In [-1, 1]; |delta| >= 0.474 is conventionally "large", >= 0.33 "medium", >= 0.147 "small"; NaN when
        the samples are too small.
    p_value : float
        Two-sided Mann-Whitney U test (NaN when a sample is empty or too small; with identical samples 1).
    """

    n_a: int
    n_b: int
    median_a: float
    median_b: float
    shift: float
    cliffs_delta: float
    p_value: float

    def magnitude(self) -> str:
        """Cliff's delta in words: negligible, small, medium or large (Romano et al.'s cut-offs)."""
        if too_few_to_compare(self.n_a, self.n_b):
            return TOO_FEW
        d = abs(self.cliffs_delta)
        if math.isnan(d):
            return "n/a"
        return "large" if d >= 0.474 else "medium" if d >= 0.33 else "small" if d >= 0.147 else "negligible"


def too_few_to_compare(n_a: int, n_b: int, alpha: float = COMPARE_ALPHA) -> bool:
    """Whether samples of ``n_a`` and ``n_b`` runs are too small to compare: the exact two-sided Mann-Whitney
    test's smallest p, 2 / C(n_a + n_b, n_a), is not below ``alpha`` (True for 3 vs 3, False for 4 vs 4)."""
    if n_a < 1 or n_b < 1:
        return True
    return 2 / math.comb(n_a + n_b, n_a) >= alpha


def compare(a: Sequence[float], b: Sequence[float], alpha: float = COMPARE_ALPHA) -> Comparison:
    """Compare sample ``b`` with sample ``a``: medians, Hodges-Lehmann shift, Cliff's delta, Mann-Whitney U.

    The shift, Cliff's delta and the test are NaN (and :meth:`Comparison.magnitude` says ``"n too small"``)
    where :func:`too_few_to_compare` holds at ``alpha``: with two runs a side the smallest two-sided p the U test
    can give is 1/3, and Cliff's delta takes five values, so neither can call such a point different.
    """
    x, y = _clean(a), _clean(b)
    med = lambda v: float(np.median(v)) if len(v) else math.nan  # noqa: E731
    if too_few_to_compare(len(x), len(y), alpha):
        return Comparison(len(x), len(y), med(x), med(y), math.nan, math.nan, math.nan)
    p = math.nan
    if len(x) and len(y):
        from scipy.stats import mannwhitneyu

        p = 1.0 if np.all(x == x[0]) and np.all(y == x[0]) else float(
            mannwhitneyu(y, x, alternative="two-sided").pvalue)
    return Comparison(len(x), len(y), med(x), med(y), hodges_lehmann(x, y), cliffs_delta(x, y), p)


@dataclass(frozen=True)
class ThresholdInterval:
    """Where a curve of medians reaches a target, with the confidence of each point's interval.

    The target is reached from ``estimate`` on (medians); it is certainly reached from ``high`` on (every
    interval from there lies at or above the target) and certainly not at ``low`` (the highest share below
    ``high`` whose interval lies below the target), so the share is in (``low``, ``high``]. ``low`` is None
    when no tested share is certainly below (the threshold may lie under the lowest share tested), ``high``
    None when no share is certainly above (it may not be reached at all); ``estimate`` None when no median
    reaches the target.
    """

    estimate: float | None
    low: float | None
    high: float | None

    def text(self) -> str:
        """e.g. ``"45 % (CI 40-50 %)"`` or ``"never below 100 % (CI > 70 %)"``."""
        est = "never below 100 %" if self.estimate is None else f"{self.estimate:g} %"
        lo = "?" if self.low is None else f"{self.low:g}"
        if self.high is None:
            return f"{est} (CI > {lo} %)"
        return f"{est} (CI {lo}-{self.high:g} %)"

    def contains(self, share: float) -> bool:
        """Whether ``share`` lies in (low, high] (an open end counts as unbounded)."""
        return (self.low is None or share > self.low) and (self.high is None or share <= self.high)


def threshold_interval(shares: Sequence[float], medians: Sequence[float], ci_low: Sequence[float],
                       ci_high: Sequence[float], target: float, full_share: float = 100.0) -> ThresholdInterval:
    """The interval of the share at which the median reaches ``target`` (e.g. 80 % of the rate).

    Parameters
    ----------
    shares, medians, ci_low, ci_high : sequences of float
        One entry per tested share (any order); a NaN bound counts as not certain either way.
    target : float
        In the unit of the medians.
    full_share : float, default 100
        The uncontended share: reaching the target only there counts as never reaching it below (estimate None).

    Returns
    -------
    ThresholdInterval
        ``estimate``: lowest share from which every median reaches the target; ``high``: lowest share from
        which every interval's lower bound does; ``low``: highest share below ``high`` whose interval's upper
        bound is below it. With two-sided intervals at level L the statement "in (low, high]" errs only when
        one of two intervals misses on one side: at most 1 - L, for a response that rises with the share.
    """
    order = np.argsort(np.asarray(shares, dtype=float))
    s = np.asarray(shares, dtype=float)[order]
    med, lo, hi = (np.asarray(v, dtype=float)[order] for v in (medians, ci_low, ci_high))

    def from_which(ok: np.ndarray) -> float | None:
        for i in range(len(s)):
            if ok[i:].all():
                return float(s[i])
        return None

    estimate = from_which(med >= target)
    high = from_which(lo >= target)  # NaN >= target is False: not certain
    below = [float(x) for x, h in zip(s, hi, strict=True) if h < target and (high is None or x < high)]
    return ThresholdInterval(None if estimate is not None and estimate >= full_share else estimate,
                             max(below) if below else None, high)
