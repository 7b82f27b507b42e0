"""The coverage a threshold search states (issue #36): per probe, per curve, and jointly over every curve.

A probe (:func:`bbrlab.campaign.adaptive.sign_verdict` at each of its looks) errs when it says ``above`` while
the median at its share lies below the target, or the reverse. The chance of that is largest when the median is
at the target, where each run lands at or above it with probability 1/2; :func:`probe_error` computes it
exactly for the probe's whole sequence of looks (a walk over the Binomial(n, 1/2) counts that stops where a
look decides, each look judged by the probe's own test), so it accounts for the peeking of the looks without
Bonferroni's slack. It is the same for every probe of a plan: a property of the test, not of the runs it met.

A curve's interval (low, high] is wrong only if one of the probes the search decided on it is, so it holds with
at least 1 - (decisions x error) (Bonferroni over the decisions made); an undecided probe says nothing and
cannot err. Every curve's interval holds at once with at least 1 - (all decisions x error), whatever the
dependence between the curves (a drift or a busy host makes them dependent; the product of the curves' levels
would need them independent). docs/statistics.md says why and what the levels do not cover.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from .adaptive import SearchPlan, sign_verdict


@lru_cache(maxsize=256)
def probe_error(looks: tuple[int, ...], alpha_per_look: float) -> float:
    """The probability that a probe with these ``looks`` (run counts) and per-look level says ``above`` when
    the median is at the target (by symmetry also that it says ``below``): the most a probe errs."""
    alive = {0: 1.0}  # count at or above the target -> probability, among paths not yet decided
    n_before, wrong = 0, 0.0
    for n in looks:
        for _ in range(n - n_before):
            step: dict[int, float] = {}
            for k, p in alive.items():
                step[k] = step.get(k, 0.0) + p / 2
                step[k + 1] = step.get(k + 1, 0.0) + p / 2
            alive = step
        n_before = n
        verdicts = {k: sign_verdict([1.0] * k + [0.0] * (n - k), 0.5, alpha_per_look) for k in alive}
        wrong += sum(p for k, p in alive.items() if verdicts[k] == "above")
        alive = {k: p for k, p in alive.items() if verdicts[k] == "undecided"}
    return wrong


def plan_error(plan: SearchPlan) -> float:
    """:func:`probe_error` of a search plan's probes."""
    return probe_error(tuple(plan.looks()), plan.alpha_per_look())


def curve_level(decided: int, error: float) -> float:
    """The level a curve's interval holds at after ``decided`` decided probes of ``error`` each (Bonferroni)."""
    return max(0.0, 1.0 - decided * error)


def joint_level(decided_per_curve: Sequence[int], error: float) -> float:
    """The level at which every curve's interval holds at once (Bonferroni over all their decisions)."""
    return curve_level(sum(decided_per_curve), error)


def statement(plan: SearchPlan, decided_per_curve: Sequence[int]) -> dict:
    """The coverage a search states: the method, the per-look level, each probe's error, the decisions made and
    the joint level (for ``decisions.json`` and the report)."""
    error = plan_error(plan)
    return {"method": "Bonferroni over the decisions made; each probe's error exact (sign test, all its looks)",
            "alpha_per_look": plan.alpha_per_look(), "probe_error": error, "probe_level": 1 - error,
            "decisions": sum(decided_per_curve), "joint_level": joint_level(decided_per_curve, error),
            "asked": round(1 - plan.alpha, 12)}
