"""The order in which a threshold search runs its probes (issue #36): interleaved, a block at a time.

A search (:mod:`bbrlab.campaign.search`) has one open probe per curve at a time (the bisection's next share).
Run back to back, a probe's 10-40 runs sit minutes apart from its neighbours', so a slow drift of the testbed
follows the share and the curve. Here the search goes in **rounds**: each round takes one block (``block``
runs, fewer when the probe's next look needs fewer) from every probe open at its start, across all curves, and
runs them in a seeded random order; the looks of the sign tests come between rounds. A probe's runs are thus
spread over the rounds it stays open, mixed with the other curves' and shares', and a drift moves every probe
open at the same time alike instead of one probe or one curve.

**Exact resume.** :func:`replay` rebuilds the whole order from what is settled: round 0 from nothing, round
r + 1 from the values of rounds 0 .. r, the first round with a run not yet settled is the one in progress. A
probe's runs are its share's repetitions in order (round after round), so the values a look sees are the
same however the campaign was interrupted. The order within a round is a pure function of the seed, the round
and the run (a SHA-256 of them, so it depends on no library's random stream): a resumed search makes the
same decisions and runs the same runs in the same order as one that was never stopped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .adaptive import SearchPlan, SearchState, search_step


@dataclass(frozen=True)
class Slot:
    """One run in the search's order: its ``position`` (0 first, over the whole search), the ``round`` it belongs
    to, and which run it is (the curve's key, the share in percent, the repetition of that share)."""

    position: int
    round: int
    curve: str
    share: float
    repetition: int


@dataclass
class Schedule:
    """The search's order so far and where each curve stands (:func:`replay`).

    ``slots`` lists every run the search has asked for, in order; ``current`` is the round in progress (None:
    every round asked for is settled, so the search is over or stuck); ``states`` each curve's
    :class:`~bbrlab.campaign.adaptive.SearchState` on the runs settled in the rounds before ``current``;
    ``values`` each curve's values per share (what the states were computed from)."""

    slots: list[Slot] = field(default_factory=list)
    current: int | None = None
    states: dict[str, SearchState] = field(default_factory=dict)
    values: dict[str, dict[float, list[float]]] = field(default_factory=dict)

    def in_round(self, number: int | None) -> list[Slot]:
        """The slots of round ``number`` (none for None)."""
        return [s for s in self.slots if s.round == number]


#: ``outcome(curve, share, repetition)``: (settled, value); the value None for a run settled without one (its
#: attempts used up) or not settled; settled False for a repetition the plan does not hold.
Outcome = Callable[[str, float, int], tuple[bool, float | None]]


def order_key(seed: int, round_number: int, curve: str, share: float, repetition: int) -> str:
    """The sort key of one run within its round: a SHA-256 of the seed, the round and the run."""
    text = f"{seed}\n{round_number}\n{curve}\n{share:.6f}\n{repetition}"
    return hashlib.sha256(text.encode()).hexdigest()


def _blocks(plans: Mapping[str, SearchPlan], states: Mapping[str, SearchState], taken: Mapping[str, dict],
            ) -> list[tuple[str, float, int]]:
    """The runs of the next round: one block of each open probe, in curve order (before the shuffle)."""
    runs = []
    for curve in sorted(plans):
        state, plan = states[curve], plans[curve]
        if state.done:
            continue
        share = state.next_share
        first = taken[curve].get(share, 0)
        last = min(first + min(plan.block, state.runs_needed), plan.max_reps)  # the plan holds max_reps runs
        runs += [(curve, share, rep) for rep in range(first, last)]
    return runs


def replay(plans: Mapping[str, SearchPlan], outcome: Outcome, seed: int) -> Schedule:
    """The search's order and state, rebuilt from the settled runs alone (see the module's text).

    Parameters
    ----------
    plans : mapping of curve key to SearchPlan
        Each curve's search (its target in Mbit/s).
    outcome : Outcome
        What is settled: ``outcome(curve, share, repetition)``.
    seed : int
        The spec's seed: it orders the runs within each round.

    Returns
    -------
    Schedule
    """
    values: dict[str, dict[float, list[float]]] = {c: {} for c in plans}
    taken: dict[str, dict[float, int]] = {c: {} for c in plans}
    schedule = Schedule(values=values)
    round_number = 0
    while True:
        schedule.states = {c: search_step(values[c], plans[c]) for c in plans}
        runs = _blocks(plans, schedule.states, taken)
        if not runs:
            return schedule
        runs.sort(key=lambda r: order_key(seed, round_number, *r))
        start = len(schedule.slots)
        schedule.slots += [Slot(start + i, round_number, *r) for i, r in enumerate(runs)]
        results = [outcome(*r) for r in runs]
        if not all(settled for settled, _ in results):
            schedule.current = round_number
            return schedule
        for (curve, share, rep), (_, value) in sorted(zip(runs, results, strict=True), key=lambda x: x[0][2]):
            taken[curve][share] = rep + 1
            if value is not None:
                values[curve].setdefault(share, []).append(value)
        round_number += 1
