"""Adaptive repetitions and the threshold search, as pure decision functions (issue #30).

Nothing here runs anything. Each function takes what a campaign has committed (a point's throughputs, in the
order they were committed) and says what to do next, so a campaign that is killed and resumed makes the same
decisions: they depend on the inputs alone (the interval is a pure function of the sorted runs, the search has
no randomness at all).

**Stopping rule** (:func:`needs_more`). A point gets at least ``min_reps`` and at most ``max_reps`` runs; in
between it stops once the order-statistic interval of its median
(:func:`bbrlab.core.confidence.median_interval`) reaches the asked level (95 %: 6 runs or more) and has a
half-width of at most ``half_width`` x the link rate, or (when a ``threshold`` is given) once such an interval
lies wholly on one side of it: a threshold question needs no more from such a point. Below 6 runs even
[min, max] covers the median with less than 95 % (93.75 % at 5), so a point never stops there before its
maximum, however well its runs agree. The campaign asks after
each block, so the looks are at ``min_reps``, then every block.

**Threshold search** (:func:`search_step`, :func:`run_search`). The share at which the median throughput
reaches a target (80 % of the rate) is found by a noisy bisection on a lattice of shares ``step`` apart
(2.5 points). Each probed share is judged by a sequential sign test of "median >= target": the count of runs
at or above the target against Binomial(n, 1/2). The sign test is exact and distribution-free at any n, it
asks exactly the question (is the median above the target?), and it judges a share far from the threshold,
where every run agrees, with a handful of runs: this is where the repetitions are saved.

Error budget: the result "the threshold is in (low, high]" is wrong only if some probe was judged on the
wrong side. The search allows at most ``ceil(log2(lattice + 2)) + 1`` probes' worth of error (a plain
bisection of the lattice), and each probe looks at most ``looks`` times, so each look is tested at
``alpha / (probes x looks)`` one-sided (Bonferroni over probes and looks: conservative, also under peeking).
A share still undecided at ``max_reps`` has a median too close to the target to tell apart; it is kept
(``undecided``), the search then narrows the gaps on both sides of it, and the interval spans it; such
probes come on top of the bisection's, so the budget above no longer bounds the error then. The
bound assumes the median rises with the share; the benchmark (``benchmarks/thresholds.py``) checks the
coverage on a response resampled from real runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bbrlab.core.confidence import LEVEL, median_interval


@dataclass(frozen=True)
class RepDecision:
    """Whether a point needs more runs, and why.

    Attributes
    ----------
    more : bool
    n : int
        Runs committed.
    ci : (float, float)
        The interval of the median (NaN below 2 runs).
    half_width : float
        Half the interval's width, as a fraction of the rate (NaN below 2 runs).
    reason : str
        ``below minimum``, ``at maximum``, ``precise``, ``clear of the threshold``, ``too few for the level``
        or ``too wide``.
    ci_level : float
        The coverage the interval reaches (NaN below 2 runs).
    """

    more: bool
    n: int
    ci: tuple[float, float]
    half_width: float
    reason: str
    ci_level: float = math.nan


def needs_more(throughputs: Sequence[float], rate: float, *, min_reps: int, max_reps: int, half_width: float,
               threshold: float | None = None, level: float = LEVEL) -> RepDecision:
    """Whether one point needs more repetitions (the stopping rule, see the module's docstring).

    Parameters
    ----------
    throughputs : sequence of float
        The point's committed runs (Mbit/s).
    rate : float
        The link rate (Mbit/s): the half-width is a fraction of it.
    min_reps, max_reps : int
    half_width : float
        Target half-width of the median's interval, as a fraction of ``rate`` (e.g. 0.025).
    threshold : float, optional
        A throughput (Mbit/s) the question is about, e.g. 0.8 x rate: a point whose interval excludes it stops.
    level : float, default 0.95

    Returns
    -------
    RepDecision
    """
    x = [float(v) for v in throughputs if not math.isnan(float(v))]
    interval = median_interval(x, level)
    ci = (interval.low, interval.high)
    hw = (ci[1] - ci[0]) / 2 / rate if rate > 0 else math.nan

    def decision(more: bool, reason: str) -> RepDecision:
        return RepDecision(more, len(x), ci, hw, reason, interval.level)

    if len(x) < min_reps:
        return decision(True, "below minimum")
    if len(x) >= max_reps:
        return decision(False, "at maximum")
    if not interval.reaches(level):
        return decision(True, "too few for the level")
    if hw <= half_width:
        return decision(False, "precise")
    if threshold is not None and (ci[0] >= threshold or ci[1] < threshold):
        return decision(False, "clear of the threshold")
    return decision(True, "too wide")


@dataclass(frozen=True)
class SearchPlan:
    """The search's parameters (a campaign spec would carry them).

    Attributes
    ----------
    target : float
        The throughput to reach (Mbit/s), e.g. 0.8 x rate.
    low, high : float
        The range of shares searched (percent), e.g. 10 and 100.
    step : float
        Lattice spacing (percent): shares probed are ``low + k x step``.
    resolution : float
        Stop once the interval is at most ``2 x resolution`` wide (the threshold is then known to +- it).
    min_reps, block, max_reps : int
        A probe's first look is at ``min_reps`` runs, then every ``block`` runs, up to ``max_reps``.
    alpha : float
        Error budget of the whole search (1 - confidence).
    """

    target: float
    low: float = 10.0
    high: float = 100.0
    step: float = 2.5
    resolution: float = 2.5
    min_reps: int = 10
    block: int = 5
    max_reps: int = 40
    alpha: float = 1 - LEVEL

    def shares(self) -> list[float]:
        """The lattice of shares the search may probe."""
        k = int(round((self.high - self.low) / self.step))
        return [round(self.low + i * self.step, 6) for i in range(k + 1)]

    def looks(self) -> list[int]:
        """The run counts at which a probe is judged."""
        return list(range(self.min_reps, self.max_reps, self.block)) + [self.max_reps]

    def alpha_per_look(self) -> float:
        """One-sided level of each sign test (Bonferroni over the probes of a bisection and their looks)."""
        probes = math.ceil(math.log2(len(self.shares()) + 2)) + 1
        return self.alpha / (probes * len(self.looks()))


@dataclass
class SearchState:
    """Where a search stands, replayed from the committed runs (:func:`search_step`).

    ``below`` is the highest share judged below the target (None: none yet), ``above`` the lowest judged
    above; ``undecided`` the shares left undecided at ``max_reps``; ``decisions`` each probe's share, verdict
    and the runs it took, in order; ``next_share`` and ``runs_needed`` what to run next (None when done).
    """

    below: float | None = None
    above: float | None = None
    undecided: list[float] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    next_share: float | None = None
    runs_needed: int = 0

    @property
    def done(self) -> bool:
        """True when the search has nothing left to run."""
        return self.next_share is None

    def interval(self) -> tuple[float | None, float | None]:
        """(low, high): the threshold lies in (low, high]; None: open on that side (below the range / never)."""
        return self.below, self.above

    def runs(self) -> int:
        """Runs the judged probes took."""
        return sum(d["n"] for d in self.decisions)


def sign_verdict(values: Sequence[float], target: float, alpha: float) -> str:
    """``above``, ``below`` or ``undecided``: an exact one-sided sign test of the median against ``target``."""
    from scipy.stats import binom

    n = len(values)
    k = int(np.sum(np.asarray(values, dtype=float) >= target))
    if n and binom.sf(k - 1, n, 0.5) <= alpha:  # P(K >= k) under a median at the target
        return "above"
    if n and binom.cdf(k, n, 0.5) <= alpha:
        return "below"
    return "undecided"


def _judge(values: Sequence[float], plan: SearchPlan) -> tuple[str, int] | None:
    """The verdict at the first look that decides among the committed runs, or None (more runs needed)."""
    alpha = plan.alpha_per_look()
    for n in plan.looks():
        if len(values) < n:
            return None
        verdict = sign_verdict(values[:n], plan.target, alpha)
        if verdict != "undecided" or n == plan.max_reps:
            return verdict, n
    return None


def _next_probe(plan: SearchPlan, state: SearchState) -> float | None:
    lattice = plan.shares()
    lo = -1 if state.below is None else lattice.index(state.below)
    hi = len(lattice) if state.above is None else lattice.index(state.above)
    if state.below is not None and state.above is not None and hi - lo <= 2 * plan.resolution / plan.step:
        return None  # an open end goes on to the end of the range: it tells "below the range" / "never"
    inside = (lattice.index(u) for u in state.undecided)
    cuts = sorted({lo, hi, *(i for i in inside if lo < i < hi)})
    gaps = [(b - a, a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b - a > 1]
    if not gaps:
        return None
    _, a, b = max(gaps)  # the widest gap (of equal ones, the higher)
    return lattice[(a + b) // 2]


def search_step(runs: Mapping[float, Sequence[float]], plan: SearchPlan) -> SearchState:
    """Replay the search on the committed runs and say what comes next.

    Parameters
    ----------
    runs : mapping of share to sequence of float
        Every committed run of the search, per share, in the order committed.
    plan : SearchPlan

    Returns
    -------
    SearchState
        ``next_share`` and ``runs_needed`` (to reach the probe's next look), or done with its interval.
    """
    state = SearchState()
    while True:
        share = _next_probe(plan, state)
        if share is None:
            return state
        have = list(runs.get(share, []))
        judged = _judge(have, plan)
        if judged is None:
            nxt = next(n for n in plan.looks() if n > len(have))
            state.next_share, state.runs_needed = share, nxt - len(have)
            return state
        verdict, n = judged
        state.decisions.append({"share": share, "verdict": verdict, "n": n})
        if verdict == "above":
            state.above = share
        elif verdict == "below":
            state.below = share
        else:
            state.undecided.append(share)


def run_search(response: Callable[[float, int], Sequence[float]], plan: SearchPlan) -> SearchState:
    """Drive :func:`search_step` with ``response(share, n)`` -> n throughputs until it is done (benchmarks, tests)."""
    runs: dict[float, list[float]] = {}
    while True:
        state = search_step(runs, plan)
        if state.done:
            return state
        runs.setdefault(state.next_share, []).extend(float(v) for v in response(state.next_share, state.runs_needed))
