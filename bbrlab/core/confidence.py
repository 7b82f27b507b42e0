"""The confidence interval of a median, with the coverage it really has: the one statistic both the analysis and
the campaign need.

The interval is the distribution-free order-statistic interval: of the n sorted runs x_(1) <= ... <= x_(n),
[x_(k), x_(n+1-k)]. It holds the true median unless k or more runs fall on one side of it, and the count of runs
below the median is Binomial(n, 1/2) whatever the distribution, so its coverage is exactly
1 - 2 P(B <= k - 1) for continuous values (at least that with ties). :func:`median_interval` takes the largest
k (the narrowest interval) that reaches the asked level; when even k = 1, [min, max], does not (n < 6 at 95 %), it
returns [min, max] with the level it reaches, 1 - 2 x 0.5^n (50 % at n = 2, 75 % at 3, 93.75 % at 5). Every
interval carries its achieved level, so nothing is labelled 95 % that is not.

The percentile bootstrap that was used before is not used: at n = 2 it gives [min, max] too but labels it 95 %,
and below about 10 runs its coverage falls short of its label in a way that depends on the distribution. The
order-statistic interval is exact at every n, needs no seed, and is a pure function of the sorted values.

:mod:`bbrlab.analysis.stats` builds the figures' and claims' confidence on it; the adaptive repetitions of
:mod:`bbrlab.campaign.adaptive` stop a point with it. It lives here, below both, so that neither room imports
the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: The confidence level bbrlab asks of every interval it draws or reports (the level reached may be lower).
LEVEL = 0.95
#: Fewer values than this: no interval (one run says nothing about the spread).
MIN_N = 2


@dataclass(frozen=True)
class MedianInterval:
    """The interval of a median and the coverage it reaches.

    Attributes
    ----------
    low, high : float
        The bounds (NaN below :data:`MIN_N` values).
    level : float
        The coverage reached, in [0, 1] (NaN below :data:`MIN_N` values): the asked level or more when n
        allows, else that of [min, max], 1 - 2 x 0.5^n.
    n : int
        The values used (NaN dropped).
    rank : int
        k of [x_(k), x_(n+1-k)] (1: [min, max]; 0 below :data:`MIN_N` values).
    """

    low: float
    high: float
    level: float
    n: int
    rank: int

    def reaches(self, asked: float) -> bool:
        """Whether the interval reaches the ``asked`` level (a tiny tolerance for float rounding)."""
        return not math.isnan(self.level) and self.level >= asked - 1e-12

    def text(self) -> str:
        """e.g. ``"n = 2: [min, max], 50 %"``, ``"n = 10: [x(2), x(9)], 97.9 %"``, ``"n = 1: no interval"``."""
        if self.rank == 0:
            return f"n = {self.n}: no interval"
        ranks = "[min, max]" if self.rank == 1 else f"[x({self.rank}), x({self.n + 1 - self.rank})]"
        return f"n = {self.n}: {ranks}, {level_text(self.level)}"


def level_text(level: float) -> str:
    """A level as printed: ``"50 %"``, ``"93.8 %"``, ``"96.9 %"`` (never rounded up to a level not reached)."""
    if math.isnan(level):
        return "no interval"
    pct = math.floor(level * 1000 + 1e-9) / 10
    return f"{pct:.0f} %" if pct == int(pct) else f"{pct:.1f} %"


@lru_cache(maxsize=4096)
def order_statistic_rank(n: int, level: float = LEVEL) -> tuple[int, float]:
    """(k, coverage): the largest k whose [x_(k), x_(n+1-k)] covers the median with at least ``level``, and
    that coverage; when none does, (1, coverage of [min, max]). (0, NaN) below :data:`MIN_N` values."""
    if n < MIN_N:
        return 0, math.nan
    if not 0 < level < 1:
        raise ValueError(f"level {level!r}: must lie strictly between 0 and 1")
    total = 2 ** n
    below = 1  # P(B <= k - 1) * 2^n for the k being tried, kept in exact integers and grown a term at a time
    term = 1  # comb(n, k - 1)
    best, best_coverage = 1, 1 - 2 * below / total
    for k in range(2, (n + 1) // 2 + 1):  # coverage(k) = 1 - 2 P(B <= k - 1), B ~ Binomial(n, 1/2)
        term = term * (n - k + 2) // (k - 1)
        below += term
        reached = 1 - 2 * below / total
        if reached < level:
            break
        best, best_coverage = k, reached
    return best, best_coverage


def median_interval(values: Sequence[float], level: float = LEVEL) -> MedianInterval:
    """The order-statistic interval of the median of ``values`` and the level it reaches (see the module's text).

    Parameters
    ----------
    values : sequence of float
        One point's repetitions; NaN values are dropped.
    level : float, default 0.95
        The level asked.

    Returns
    -------
    MedianInterval

    Examples
    --------
    >>> median_interval([80.1, 92.3]).text()
    'n = 2: [min, max], 50 %'
    """
    x = np.sort(np.asarray(values, dtype=float))
    x = x[~np.isnan(x)]
    k, reached = order_statistic_rank(len(x), level)
    if k == 0:
        return MedianInterval(math.nan, math.nan, math.nan, len(x), 0)
    return MedianInterval(float(x[k - 1]), float(x[len(x) - k]), reached, len(x), k)


def median_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of :func:`median_interval` (its level dropped: use :func:`median_interval` to state it)."""
    ci = median_interval(values, level)
    return (ci.low, ci.high)


@dataclass(frozen=True)
class BlockedInterval:
    """The interval of a median when the runs come in blocks (each block on a boot of its own), and the spread
    within and between the blocks.

    Attributes
    ----------
    interval : MedianInterval
        The order-statistic interval over the blocks' medians: its ``n`` counts blocks, its ``level`` is exact
        for independent blocks (the runs within a block need not be).
    runs : int
        The values used.
    within_sd : float
        The runs' standard deviation within their block, pooled over the blocks of 2 runs or more (NaN: none).
    between_sd : float
        The standard deviation of the blocks' medians (NaN below 2 blocks).
    unit : str
        ``block``; ``run`` where a caller took the runs as the unit (no blocks: the spreads are NaN).
    """

    interval: MedianInterval
    runs: int
    within_sd: float
    between_sd: float
    unit: str = "block"


def blocked_median_interval(values: Sequence[float], blocks: Sequence[object], level: float = LEVEL) -> BlockedInterval:
    """The interval of the median with the block, not the run, as the unit of replication.

    Each block (``blocks[i]`` names the block of ``values[i]``; NaN values are dropped) gives one value, the
    median of its runs, and :func:`median_interval` is taken over those. The blocks are independent (each ran on a
    fresh boot), the runs of one block are not (they share its boot's state), so the count of block medians below
    the median of the block medians' distribution is Binomial(K, 1/2) and the level is exact for K blocks, as it
    is for runs; an interval over the runs would count a block's shared offset as many times as it has runs and
    cover less than it says (docs/statistics.md, "Blocks").

    Examples
    --------
    >>> blocked_median_interval([50, 51, 60, 61], ["a", "a", "b", "b"]).interval.text()
    'n = 2: [min, max], 50 %'
    """
    x = np.asarray(values, dtype=float)
    keep = ~np.isnan(x)
    groups: dict[object, list[float]] = {}
    for v, b in zip(x[keep], np.asarray(blocks, dtype=object)[keep], strict=True):
        groups.setdefault(b, []).append(float(v))
    medians = [float(np.median(g)) for g in groups.values()]
    squares = sum(float(np.sum((np.asarray(g) - np.mean(g)) ** 2)) for g in groups.values() if len(g) > 1)
    dof = sum(len(g) - 1 for g in groups.values() if len(g) > 1)
    within = math.sqrt(squares / dof) if dof else math.nan
    between = float(np.std(medians, ddof=1)) if len(medians) > 1 else math.nan
    return BlockedInterval(median_interval(medians, level), int(keep.sum()), within, between)
