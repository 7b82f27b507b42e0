"""Adaptive repetitions in the campaign engine (issue #30): which planned runs a campaign still needs.

A spec that says ``repetitions: {min: 5, max: 30, precision: 0.025}`` plans ``max`` repetitions of every grid
point in its usual (blocked-random) order, and runs a point's repetition ``r`` only while the point still
needs it. After each of a point's runs (its block), :func:`decide_point` applies the stopping rule of
:func:`bbrlab.campaign.adaptive.needs_more`: once the point has ``min`` runs, it stops as soon as the
order-statistic interval of its median reaches 95 % (6 runs or more) with a half-width of at most
``precision`` x the link rate, or when its ``max`` planned repetitions are used. Its later repetitions are then skipped: never run, never counted as
remaining.

**Exact resume.** A decision reads nothing but the committed runs: the throughput of each of the point's
runs in ``runs/`` (a run whose attempts are used up counts as settled, without a value), in repetition
order, and the interval is a pure function of those values. A repetition ``r >= min`` is submitted only once
repetitions ``0 .. r-1`` are settled and the rule asked for more, so a campaign killed at any instant and
resumed replays the same decisions and submits the same next runs (:class:`Gate`). The decisions are
written to ``decisions.json`` in the campaign directory (atomically, after each settled run) and counted by
``bbrlab campaign status``; they are a record, not an input: :func:`replay` rebuilds them from the runs.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bbrlab.core.errors import ValidationError
from bbrlab.run import record as rec
from bbrlab.scenario.scenario import Scenario
from bbrlab.scenario.workloads import DEFAULT_WORKLOAD

from .adaptive import needs_more

DECISIONS_FILE = "decisions.json"
DECISIONS_SCHEMA = "bbrlab.decisions/1"
#: ``precision`` bounds: a half-width of 0.1 % to 50 % of the link rate.
PRECISION_RANGE = (0.001, 0.5)
#: The smallest ``min`` accepted; 5 keeps a tiny campaign possible. The interval of a median reaches 95 % only from
#: 6 runs ([min, max] at 5 covers 93.75 %), so such a point never stops before its 6th run (bbrlab.core.confidence).
MIN_OF_MIN = 5
#: The fewest runs whose interval of the median reaches 95 % (bbrlab.core.confidence.order_statistic_rank).
FEWEST_AT_LEVEL = 6
#: The median's standard error is about sqrt(pi/2) x sigma / sqrt(n) for a normal spread; x 1.96 for 95 %.
_HALF_WIDTH_PER_SIGMA = 1.96 * math.sqrt(math.pi / 2)


@dataclass(frozen=True)
class RepetitionRule:
    """A spec's adaptive repetitions: at least ``min_reps`` and at most ``max_reps`` runs per point, stopping
    once the median's interval reaches 95 % with a half-width of at most ``precision`` x the link rate."""

    min_reps: int
    max_reps: int
    precision: float

    def to_dict(self) -> dict:
        """The rule as the spec's ``repetitions`` mapping."""
        return {"min": self.min_reps, "max": self.max_reps, "precision": self.precision}

    @classmethod
    def from_value(cls, value: object) -> RepetitionRule:
        """Validate a spec's ``repetitions`` mapping; the error names ``repetitions.<key>`` and its range."""
        if not isinstance(value, Mapping):
            raise ValidationError("repetitions", value, "a whole number, or a mapping {min, max, precision}")
        unknown = sorted(str(k) for k in value if k not in ("min", "max", "precision"))
        if unknown:
            raise ValidationError(f"repetitions.{unknown[0]}", value[unknown[0]], "one of the keys min, max, precision")
        for key in ("min", "max", "precision"):
            if key not in value:
                raise ValidationError(f"repetitions.{key}", None, "required in adaptive repetitions "
                                      "{min, max, precision}")
        lo, hi, p = value["min"], value["max"], value["precision"]
        for key, v in (("min", lo), ("max", hi)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValidationError(f"repetitions.{key}", v, "a whole number")
        if not MIN_OF_MIN <= lo <= 1000:
            raise ValidationError("repetitions.min", lo, f"{MIN_OF_MIN} <= min <= 1000 (an interval of the median "
                                  "needs a few runs)")
        if not lo <= hi <= 1000:
            raise ValidationError("repetitions.max", hi, f"min ({lo}) <= max <= 1000")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not PRECISION_RANGE[0] <= p <= PRECISION_RANGE[1]:
            raise ValidationError("repetitions.precision", p, f"{PRECISION_RANGE[0]} <= precision <= "
                                  f"{PRECISION_RANGE[1]} (the target half-width of the median's 95 % interval, as a "
                                  "fraction of the link rate; 0.025 = 2.5 %)")
        return cls(lo, hi, float(p))

    def fewest_reps(self) -> int:
        """The fewest runs a point can stop at: ``min_reps``, but never before its interval reaches 95 %."""
        return min(self.max_reps, max(self.min_reps, FEWEST_AT_LEVEL))

    def expected_reps(self, spread: float) -> int:
        """Runs a point takes if its runs spread normally with standard deviation ``spread`` x the rate: the
        first n whose interval's half-width (about 1.96 x 1.25 x spread / sqrt(n)) meets ``precision``,
        at least 6 (:data:`FEWEST_AT_LEVEL`), between ``min_reps`` and ``max_reps``. A plan estimate; bimodal points near a threshold take more."""
        n = max(math.ceil((_HALF_WIDTH_PER_SIGMA * spread / self.precision) ** 2), FEWEST_AT_LEVEL)
        return max(self.min_reps, min(self.max_reps, n))


@dataclass
class PointDecision:
    """Where one grid point stands: its settled runs (repetitions ``0 .. settled-1``), whether it is still
    ``running`` or ``stopped`` and why (``precise``, ``at maximum``; while running the last look's
    ``below minimum``, ``too few for the level`` or ``too wide``), the median and its interval (Mbit/s), the
    level that interval reaches and the half-width (fraction of the rate) at the last look."""

    point: str
    scenario: dict
    rate_mbit: float
    settled: int = 0
    values: int = 0
    state: str = "running"
    reason: str = "below minimum"
    median_mbit: float | None = None
    ci_mbit: tuple[float | None, float | None] = (None, None)
    ci_level: float | None = None
    half_width: float | None = None

    def to_dict(self) -> dict:
        """The decision as written in ``decisions.json``."""
        d = asdict(self)
        d["ci_mbit"] = list(self.ci_mbit)
        return d


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 4)


def decide_point(values: Sequence[float | None], rate_mbit: float, rule: RepetitionRule,
                 point: str = "", scenario: dict | None = None) -> PointDecision:
    """Replay the stopping rule over one point's settled runs, in repetition order.

    ``values[r]`` is repetition ``r``'s throughput (Mbit/s), or None when that run settled without one (its
    attempts used up). The rule looks after each repetition from the ``min``-th on and stops the point at
    the first look that says so; runs after that look are ignored (there are none unless a failed run was
    retried late with ``--retry-failed``)."""
    d = PointDecision(point, scenario or {}, rate_mbit)
    ok: list[float] = []
    for r, v in enumerate(values[: rule.max_reps]):
        if v is not None and not math.isnan(v):
            ok.append(float(v))
        d.settled, d.values = r + 1, len(ok)
        if r + 1 < rule.min_reps:
            continue
        verdict = needs_more(ok, rate_mbit, min_reps=rule.min_reps, max_reps=rule.max_reps, half_width=rule.precision)
        d.reason, d.ci_mbit, d.half_width = verdict.reason, (_num(verdict.ci[0]), _num(verdict.ci[1])), _num(verdict.half_width)
        d.ci_level = _num(verdict.ci_level)
        d.median_mbit = _num(statistics.median(ok)) if ok else None
        if r + 1 >= rule.max_reps:
            d.state, d.reason = "stopped", "at maximum"
        elif not verdict.more:
            d.state = "stopped"
        if d.state == "stopped":
            break
    return d


def point_id(scenario: Scenario) -> str:
    """A grid point's id: the run id of its repetition 0."""
    return Scenario(scenario.link, scenario.contention, scenario.flow, 0, scenario.kernel,
                    sender_vcpus=scenario.sender_vcpus).run_id


def measured_mbit(out: Path, run_id: str) -> float | None:
    """The throughput a committed run measured (Mbit/s): iperf3's receiver sum in ``iperf.json``, or an
    rsync copy's goodput in its record; None when the run has none (it is then a run without a value)."""
    from bbrlab.run.workloads import REGISTRY

    run_dir = Path(out) / rec.RUNS / run_id
    try:
        record = json.loads((run_dir / rec.RECORD_FILE).read_text())
        name = record.get("scenario", {}).get("flow", {}).get("workload") or DEFAULT_WORKLOAD
        value = REGISTRY.get(name, REGISTRY[DEFAULT_WORKLOAD]).measured_mbit(run_dir, record)
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class _Point:
    runs: list[tuple[str, Scenario]] = field(default_factory=list)  # by repetition


class Gate:
    """Which planned runs a campaign may submit now, under a :class:`RepetitionRule` (None: every run).

    ``runs`` is the plan (run id, scenario) in order; ``settled(run_id)`` says whether a run needs nothing
    more (committed, or its attempts used up); ``value(run_id)`` its throughput. A repetition below ``min`` is
    always open; repetition ``r >= min`` opens once repetitions ``0 .. r-1`` are settled and the rule asks
    for more. Everything it decides follows from those two functions alone."""

    def __init__(self, rule: RepetitionRule | None, runs: Sequence[tuple[str, Scenario]],
                 settled: Callable[[str], bool], value: Callable[[str], float | None]):
        self.rule, self.settled, self.value = rule, settled, value
        self.points: dict[str, _Point] = {}
        self.point_of: dict[str, str] = {}
        self.rep_of: dict[str, int] = {}
        for run_id, scenario in runs:
            pid = point_id(scenario)
            self.rep_of[run_id] = scenario.repetition
            self.points.setdefault(pid, _Point()).runs.append((run_id, scenario))
            self.point_of[run_id] = pid
        for p in self.points.values():
            p.runs.sort(key=lambda item: item[1].repetition)
        self._values: dict[str, float | None] = {}
        self.decisions: dict[str, PointDecision] = {}
        if rule is not None:
            for pid in self.points:
                self._decide(pid)

    def _decide(self, pid: str) -> None:
        runs = self.points[pid].runs
        values = []
        for run_id, _ in runs:
            if not self.settled(run_id):
                break
            if run_id not in self._values:
                self._values[run_id] = self.value(run_id)
            values.append(self._values[run_id])
        scenario = runs[0][1]
        self.decisions[pid] = decide_point(values, scenario.link.rate_mbit, self.rule, pid,
                                           {**scenario.to_dict(), "repetition": None})

    def is_open(self, run_id: str) -> bool:
        """Whether the run is needed and may be submitted now."""
        if self.rule is None:
            return True
        rep, d = self.rep_of[run_id], self.decisions[self.point_of[run_id]]
        if rep < self.rule.min_reps:
            return True
        return d.state == "running" and rep <= d.settled

    def is_skipped(self, run_id: str) -> bool:
        """Whether the stopping rule has dropped the run (its point stopped before its repetition)."""
        if self.rule is None:
            return False
        rep, d = self.rep_of[run_id], self.decisions[self.point_of[run_id]]
        return d.state == "stopped" and rep >= d.settled

    def settle(self, run_id: str) -> list[str]:
        """Take note that ``run_id`` settled; return the runs of its point that are open now (done or not)."""
        if self.rule is None:
            return []
        pid = self.point_of[run_id]
        self._decide(pid)
        return [r for r, _ in self.points[pid].runs if self.is_open(r)]

    def skipped(self) -> int:
        """Runs of the plan the stopping rule dropped."""
        return sum(self.is_skipped(r) for r in self.point_of)

    def to_dict(self) -> dict:
        """``decisions.json``: the rule, the counts of points by state and reason, each point's decision."""
        ds = list(self.decisions.values())
        reasons: dict[str, int] = {}
        for d in ds:
            key = f"point(s) {d.state}: {d.reason}"
            reasons[key] = reasons.get(key, 0) + 1
        return {"schema": DECISIONS_SCHEMA, "rule": self.rule.to_dict() if self.rule else None,
                "points": len(ds), "stopped": sum(d.state == "stopped" for d in ds), "reasons": reasons,
                "planned_runs": len(self.point_of), "skipped_runs": self.skipped(),
                "decisions": [d.to_dict() for d in ds]}

    def write(self, out: Path) -> None:
        """Rewrite ``decisions.json`` in ``out`` atomically (nothing for a spec without adaptive repetitions)."""
        if self.rule is not None:
            rec.write_json_atomic(Path(out) / DECISIONS_FILE, self.to_dict())


def rule_of(spec_dict: object) -> RepetitionRule | None:
    """The adaptive rule of a spec's dict (``spec.yaml``), or None for a fixed number of repetitions."""
    value = spec_dict.get("repetitions") if isinstance(spec_dict, Mapping) else None
    return RepetitionRule.from_value(value) if isinstance(value, Mapping) else None


def replay(rule: RepetitionRule | None, runs: Iterable[tuple[str, Scenario]], out: Path,
           settled: Callable[[str], bool]) -> Gate:
    """The decisions rebuilt from a campaign directory's committed runs (what a resumed campaign starts from)."""
    return Gate(rule, list(runs), settled, lambda run_id: measured_mbit(out, run_id))
