"""The order a campaign's runs go in: reproducible from the spec's ``seed``, and the same in a resumed campaign
(``plan.json`` holds it).

Block after block (``blocks``: each block on a fresh boot of the sender, :mod:`bbrlab.campaign.blocks`); within a
block, kernel after kernel and within a kernel vCPU count after vCPU count (the sender boots once per kernel,
vCPU count and block); within those, the block's repetitions
of every grid point as ``order`` says: ``blocked-random`` (each repetition a permutation of the grid of its own),
``random`` (one permutation of them all) or ``sequential`` (point after point). One random generator, seeded
once, draws every permutation in this order, so a spec without blocks keeps the plan it always had.
"""

from __future__ import annotations

import dataclasses
import random

from bbrlab.scenario.scenario import Scenario


def plan_order(spec) -> list[Scenario]:
    """Every run of ``spec`` (a :class:`~bbrlab.campaign.spec.CampaignSpec`) in execution order."""
    rng = random.Random(spec.seed)
    per_block = spec.repetitions // spec.blocks
    return [s for b in range(spec.blocks) for kernel in (spec.kernels or (None,))
            for vcpus in (spec.sender_vcpus or (None,))
            for s in ordered(spec.grid(kernel, vcpus), range(b * per_block, (b + 1) * per_block), spec.order, rng)]


def ordered(grid: list[Scenario], reps: range, order: str, rng: random.Random) -> list[Scenario]:
    """The repetitions ``reps`` of every point of ``grid`` in ``order``, permutations drawn from ``rng``."""
    with_rep = [[dataclasses.replace(s, repetition=r) for s in grid] for r in reps]
    if order == "sequential":
        return [with_rep[r][i] for i in range(len(grid)) for r in range(len(reps))]
    if order == "random":
        out = [s for block in with_rep for s in block]
        rng.shuffle(out)
        return out
    out = []
    for block in with_rep:  # blocked-random: each repetition is its own permutation
        block = list(block)
        rng.shuffle(block)
        out.extend(block)
    return out
