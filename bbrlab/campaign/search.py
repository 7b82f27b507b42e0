"""The threshold search as a campaign (issue #30): for each curve (CCA x timeslice x RTT x rate ...) find the
CPU share at which the median throughput reaches ``target`` x the rate, with the noisy bisection of
:mod:`bbrlab.campaign.adaptive`.

A spec with ``search: {target: 0.8, low: 10, high: 100, step: 2.5, resolution: 2.5, min: 10, block: 5,
max: 40, confidence: 0.95}`` (every key but ``target`` optional) and no ``cpu_shares_pct`` plans the whole
lattice of shares ``low, low + step, ... high`` at ``max`` repetitions per curve, a plan no search ever
runs in full: :class:`SearchGate` opens only the runs :func:`bbrlab.campaign.adaptive.search_step` asks
for and drops the rest once a curve's search is done. The runs go in rounds, a block of every open probe of
every curve per round, in an order seeded by the spec's ``seed`` (:mod:`bbrlab.campaign.interleave`), so a
slow drift spreads over the curves and shares instead of following them. As for adaptive repetitions
(:mod:`bbrlab.campaign.repetitions`), every decision and the order itself are replayed from the committed runs
alone (a share's settled repetitions 0 .. n-1, in order; a run whose attempts are used up settles without a
value), so a SIGKILLed search resumes to the same probes in the same order; ``decisions.json`` holds each
curve's probes, verdicts, levels and interval, the coverage per curve and jointly
(:mod:`bbrlab.campaign.search_coverage`), and every run's place in the order.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bbrlab.core import recordjson
from bbrlab.core.confidence import LEVEL, median_interval
from bbrlab.core.errors import ValidationError
from bbrlab.run.campaignadded import SearchPlace
from bbrlab.scenario.scenario import Scenario

from . import search_coverage
from .adaptive import SearchPlan
from .interleave import Schedule, Slot, replay
from .repetitions import DECISIONS_FILE, Gate, RepetitionRule, measured_mbit

SEARCH_SCHEMA = "bbrlab.search/2"
#: The schema of a search recorded before the interleaved order (each probe's runs back to back); still read.
SEARCH_SCHEMA_BACK_TO_BACK = "bbrlab.search/1"
_KEYS = {"target": None, "low": 10.0, "high": 100.0, "step": 2.5, "resolution": 2.5, "min": 10, "block": 5,
         "max": 40, "confidence": LEVEL}


@dataclass(frozen=True)
class SearchRule:
    """A spec's ``search``: the :class:`SearchPlan` of every curve, its ``target`` a fraction of the rate (the
    range and lattice of shares in percent, the resolution in points, a probe's looks, ``alpha`` = 1 - the
    search's confidence). ``seed`` is the spec's ``seed``: it orders the runs of each round
    (:mod:`bbrlab.campaign.interleave`); it is not part of the ``search`` mapping."""

    shape: SearchPlan
    seed: int = 1

    @property
    def target(self) -> float:
        """The fraction of the link rate the median must reach (the paper: 0.8)."""
        return self.shape.target

    @property
    def min_reps(self) -> int:
        """A probe's first look, in runs."""
        return self.shape.min_reps

    @property
    def max_reps(self) -> int:
        """A probe's last look, in runs."""
        return self.shape.max_reps

    @property
    def confidence(self) -> float:
        """The search's confidence (1 - its error budget)."""
        return round(1 - self.shape.alpha, 12)

    def to_dict(self) -> dict:
        """The rule as the spec's ``search`` mapping."""
        p = self.shape
        return {"target": p.target, "low": p.low, "high": p.high, "step": p.step, "resolution": p.resolution,
                "min": p.min_reps, "block": p.block, "max": p.max_reps, "confidence": self.confidence}

    def shares(self) -> list[float]:
        """The lattice of shares (percent) a search may probe."""
        return self.shape.shares()

    def plan(self, rate_mbit: float) -> SearchPlan:
        """The :class:`SearchPlan` of one curve of link rate ``rate_mbit``."""
        return replace(self.shape, target=self.shape.target * rate_mbit)

    @classmethod
    def from_value(cls, value: object) -> SearchRule:
        """Validate a spec's ``search`` mapping; an error names ``search.<key>`` and its range."""
        if not isinstance(value, Mapping):
            raise ValidationError("search", value, "a mapping {target, low, high, step, resolution, min, block, "
                                  "max, confidence} (target required)")
        for key in value:
            if key not in _KEYS:
                raise ValidationError(f"search.{key}", value[key], f"one of the keys {', '.join(_KEYS)}")
        d = {k: value.get(k, v) for k, v in _KEYS.items()}
        for key in ("target", "low", "high", "step", "resolution", "confidence"):
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValidationError(f"search.{key}", v, "a number" + (" (required)" if key == "target" else ""))
        for key in ("min", "block", "max"):
            if isinstance(d[key], bool) or not isinstance(d[key], int):
                raise ValidationError(f"search.{key}", d[key], "a whole number")
        _check(0 < d["target"] < 1, "target", d["target"], "0 < target < 1 (a fraction of the rate; the paper: 0.8)")
        _check(0 < d["low"] < 100, "low", d["low"], "0 < low < 100 (percent CPU share)")
        _check(d["low"] < d["high"] <= 100, "high", d["high"], f"low ({d['low']:g}) < high <= 100")
        span = d["high"] - d["low"]
        _check(0 < d["step"] <= span and abs(span / d["step"] - round(span / d["step"])) < 1e-9
               and span / d["step"] <= 400, "step", d["step"],
               f"a divisor of high - low ({span:g}) giving at most 400 steps")
        _check(d["step"] / 2 <= d["resolution"] <= span, "resolution", d["resolution"],
               f"step / 2 ({d['step'] / 2:g}) <= resolution <= high - low ({span:g})")
        _check(0.5 <= d["confidence"] < 1, "confidence", d["confidence"], "0.5 <= confidence < 1")
        _check(1 <= d["min"] <= 1000, "min", d["min"], "1 <= min <= 1000")
        _check(1 <= d["block"] <= 1000, "block", d["block"], "1 <= block <= 1000")
        _check(d["min"] <= d["max"] <= 1000, "max", d["max"], f"min ({d['min']}) <= max <= 1000")
        rule = cls(SearchPlan(target=float(d["target"]), low=float(d["low"]), high=float(d["high"]),
                              step=float(d["step"]), resolution=float(d["resolution"]), min_reps=d["min"],
                              block=d["block"], max_reps=d["max"], alpha=1 - float(d["confidence"])))
        alpha = rule.plan(1.0).alpha_per_look()
        _check(0.5 ** rule.max_reps <= alpha, "max", rule.max_reps,
               f"enough runs for a sign test at {alpha:.2g} per look: max >= {math.ceil(-math.log2(alpha))}")
        return rule


def _check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValidationError(f"search.{key}", value, allowed)


def curve_id(scenario: Scenario) -> str:
    """A search curve's key: the scenario without its share and repetition."""
    d = scenario.to_dict()
    d.pop("repetition", None)
    d["contention"] = {k: v for k, v in d["contention"].items() if k != "cpu_share_pct"}
    return json.dumps(d, sort_keys=True)


class SearchGate(Gate):
    """Which runs of a search campaign are open now: those of the round in progress
    (:func:`bbrlab.campaign.interleave.replay`), a block of each curve's open probe.

    ``runs``, ``settled`` and ``value`` as for :class:`~bbrlab.campaign.repetitions.Gate`; ``place(run_id)`` is a
    run's position in the search's order, which the campaign loop runs it by."""

    def __init__(self, search: SearchRule, runs: Sequence[tuple[str, Scenario]],
                 settled: Callable[[str], bool], value: Callable[[str], float | None]):
        self.search = search
        self.curves: dict[str, dict[float, list[str]]] = {}
        self.first: dict[str, Scenario] = {}
        self.order_in_plan: dict[str, int] = {}
        for i, (run_id, sc) in enumerate(runs):
            cid = curve_id(sc)
            share = float(sc.contention.cpu_share_pct)
            self.curves.setdefault(cid, {}).setdefault(share, []).append((sc.repetition, run_id))
            self.first.setdefault(cid, sc)
            self.order_in_plan[run_id] = i
        for shares in self.curves.values():
            for share, reps in shares.items():
                shares[share] = [run_id for _, run_id in sorted(reps)]
        self.plans = {cid: search.plan(sc.link.rate_mbit) for cid, sc in self.first.items()}
        self.schedule = Schedule()
        self.slot_of: dict[str, Slot] = {}
        super().__init__(None, runs, settled, value)
        self.rule = search  # the loop asks for decisions whenever a gate has a rule
        self._replay()

    def _outcome(self, cid: str, share: float, rep: int) -> tuple[bool, float | None]:
        reps = self.curves[cid].get(share, [])
        if rep >= len(reps) or not self.settled(reps[rep]):
            return False, None
        run_id = reps[rep]
        if run_id not in self._values:
            self._values[run_id] = self.value(run_id)
        return True, self._values[run_id]

    def _replay(self) -> None:
        self.schedule = replay(self.plans, self._outcome, self.search.seed)
        self.slot_of = {self.curves[s.curve][s.share][s.repetition]: s for s in self.schedule.slots}
        self.open = {run_id for run_id, s in self.slot_of.items() if s.round == self.schedule.current}

    def place(self, run_id: str) -> int:
        """The run's position in the search's order (after every asked-for run: its place in the plan)."""
        slot = self.slot_of.get(run_id)
        return slot.position if slot is not None else len(self.order_in_plan) * 2 + self.order_in_plan[run_id]

    def record_of(self, run_id: str) -> dict:
        """What a run's record says of its place in the search: ``{"search": {"position", "round"}}``
        (:class:`~bbrlab.run.campaignadded.SearchPlace`)."""
        slot = self.slot_of.get(run_id)
        return {"search": recordjson.to_json(SearchPlace(slot.position, slot.round))} if slot is not None else {}

    def is_open(self, run_id: str) -> bool:
        """Whether the search asks for this run now (or ran it already)."""
        return run_id in self.open or self.settled(run_id)

    def is_skipped(self, run_id: str) -> bool:
        """Whether the search has not asked for this run (it never will once the curve is done)."""
        return not self.is_open(run_id)

    def settle(self, run_id: str) -> list[str]:
        """Replay the search; return the runs open now (those of the round in progress)."""
        self._replay()
        return sorted(self.open, key=self.place)

    def _probes(self, cid: str) -> list[dict]:
        """Each decision of a curve with its level, exact p-value, median and interval, and its runs' span in
        the order (first and last position, rounds)."""
        plan, values = self.plans[cid], self.schedule.values[cid]
        error = search_coverage.plan_error(plan)
        out = []
        for d in self.schedule.states[cid].decisions:
            share, n = d["share"], d["n"]
            x = values.get(share, [])[:n]
            slots = [self.slot_of[r] for r in self.curves[cid][share] if r in self.slot_of and self.settled(r)]
            ci = median_interval(x)
            out.append({**d, "level": None if d["verdict"] == "undecided" else 1 - error,
                        "p_value": _p_value(x, plan.target, d["verdict"]),
                        "median_mbit": _num(statistics.median(x)) if x else None,
                        "interval_mbit": [_num(ci.low), _num(ci.high)], "interval_level": _num(ci.level),
                        "positions": [min((s.position for s in slots), default=None),
                                      max((s.position for s in slots), default=None)],
                        "rounds": sorted({s.round for s in slots})})
        return out

    def _curve(self, cid: str) -> dict:
        sc, plan, state = self.first[cid], self.plans[cid], self.schedule.states[cid]
        opened = sorted(self.slot_of[r].repetition for r in self.open if self.slot_of[r].curve == cid)
        low, high = state.interval()
        decided = sum(d["verdict"] != "undecided" for d in state.decisions)
        runs = sum(self.settled(r) for share in self.curves[cid].values() for r in share if r in self.slot_of)
        return {"curve": {**sc.to_dict(), "repetition": None}, "rate_mbit": sc.link.rate_mbit,
                "target_mbit": plan.target, "done": state.done, "next_share": state.next_share,
                "open_reps": opened, "threshold_low_pct": low, "threshold_high_pct": high,
                "undecided": state.undecided, "decided": decided,
                "level": search_coverage.curve_level(decided, search_coverage.plan_error(plan)),
                "probes": self._probes(cid), "runs": runs}

    def to_dict(self) -> dict:
        """``decisions.json`` of a search: the rule, the seed, the coverage, each curve's probes, verdicts, levels
        and interval, and every run asked for in order (``[position, round, run_id]``)."""
        states = [self._curve(cid) for cid in self.curves]
        coverage = search_coverage.statement(self.search.plan(1.0), [s["decided"] for s in states])
        order = [[s.position, s.round, self.curves[s.curve][s.share][s.repetition]] for s in self.schedule.slots]
        return {"schema": SEARCH_SCHEMA, "search": self.search.to_dict(), "seed": self.search.seed,
                "order": "interleaved", "curves": len(states), "done": sum(s["done"] for s in states),
                "reasons": {"curve(s) searching": sum(not s["done"] for s in states),
                            "curve(s) done": sum(s["done"] for s in states)},
                "planned_runs": len(self.order_in_plan), "runs": sum(s["runs"] for s in states),
                "round": self.schedule.current, "coverage": coverage, "decisions": states, "runs_in_order": order}


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 4)


def _p_value(values: Sequence[float], target: float, verdict: str) -> float | None:
    """The exact one-sided sign test's p-value of a probe's verdict at its deciding look (None: undecided)."""
    if verdict == "undecided" or not values:
        return None
    from scipy.stats import binom

    k, n = sum(v >= target for v in values), len(values)
    return float(binom.sf(k - 1, n, 0.5) if verdict == "above" else binom.cdf(k, n, 0.5))


def make_gate(adaptive: RepetitionRule | None, search: SearchRule | None, runs: Sequence[tuple[str, Scenario]],
              out: Path, settled: Callable[[str], bool]) -> Gate:
    """The gate of a campaign directory's plan: a search's, adaptive repetitions', or one that opens every run;
    run values read from the committed runs in ``out``."""
    def value(run_id: str) -> float | None:
        return measured_mbit(out, run_id)

    if search is not None:
        return SearchGate(search, list(runs), settled, value)
    return Gate(adaptive, list(runs), settled, value)


def search_of(spec_dict: object) -> SearchRule | None:
    """The search rule of a spec's dict (``spec.yaml``), or None."""
    value = spec_dict.get("search") if isinstance(spec_dict, Mapping) else None
    return SearchRule.from_value(value) if value is not None else None


def read_decisions(out: Path) -> dict:
    """A campaign directory's ``decisions.json``."""
    return json.loads((Path(out) / DECISIONS_FILE).read_text())

