"""The confidence interval of a median: the one statistic both the analysis and the campaign need.

:mod:`bbrlab.analysis.stats` builds the figures' and claims' confidence on it; the adaptive repetitions of
:mod:`bbrlab.campaign.adaptive` stop a point with it. It lives here, below both, so that neither room imports
the other. scipy is imported inside the function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from inspect import signature

import numpy as np

#: The confidence level of every interval bbrlab draws or reports.
LEVEL = 0.95
#: The bootstrap's seed: the same runs always give the same interval.
SEED = 20240530
#: Bootstrap resamples.
RESAMPLES = 2000
#: Fewer values than this: no interval.
MIN_N = 2


def median_ci(values: Sequence[float], level: float = LEVEL, *, seed: int = SEED,
              resamples: int = RESAMPLES) -> tuple[float, float]:
    """The bootstrap confidence interval of the median of ``values`` (percentile method).

    Parameters
    ----------
    values : sequence of float
        One point's repetitions; NaN values are dropped.
    level : float, default 0.95
    seed : int
        Fixed: the same values give the same interval.
    resamples : int

    Returns
    -------
    (float, float)
        (low, high); (NaN, NaN) for fewer than :data:`MIN_N` values.

    Examples
    --------
    >>> stats.median_ci([80.1, 92.3, 93.0, 94.1, 94.2])  # doctest: +SKIP
    (80.1, 94.1)
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < MIN_N:
        return (math.nan, math.nan)
    if np.all(x == x[0]):
        return (float(x[0]), float(x[0]))
    from scipy.stats import bootstrap

    seeded = {"rng" if "rng" in signature(bootstrap).parameters else "random_state": np.random.default_rng(seed)}
    res = bootstrap((x,), np.median, confidence_level=level, n_resamples=resamples, method="percentile",
                    vectorized=True, **seeded)  # scipy < 1.15 calls the generator random_state
    low, high = res.confidence_interval
    return (float(low), float(high))
