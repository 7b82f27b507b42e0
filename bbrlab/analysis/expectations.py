"""Expectations judged on a campaign's runs: pass, fail or undecided, each with its evidence (``bbrlab check``).

An expectation (:mod:`bbrlab.campaign.expect`) is judged at each *point* it selects: the ok runs of one condition,
the full run identity (:mod:`bbrlab.analysis.runkey`), never runs of different conditions pooled. A point's values
are taken at its unit of replication (:func:`bbrlab.analysis.data.replication_values`: each block's median when
its runs span blocks, each run otherwise), and the project's statistics decide:

- **A statistic against a value** (``op``, ``value``): the order-statistic interval of the median at the asked
  ``confidence`` (:func:`bbrlab.core.confidence.median_interval`). *pass* when the whole interval meets the
  comparison (``>= 0.8``: its low end is at least 0.8), *fail* when the whole interval misses it, *undecided*
  when it straddles the value, or when the point's runs cannot reach the level asked: n = 2 gives [min, max] at
  50 %, 95 % needs 6 runs (or blocks). The verdict then says the level reached and how many it would take.
- **Not below another CCA** (``not_below``): at every point where both ran (the same identity but the CCA), the
  two-sided Mann-Whitney test of :func:`bbrlab.analysis.stats.compare` at alpha = 1 - confidence, its p corrected
  by Holm over the expectation's points (as the fidelity report's patched-vs-original calls,
  :mod:`bbrlab.analysis.confidence_report`), on the block medians when both sides span blocks, else on the runs.
  *fail* when the corrected p is below alpha and the Hodges-Lehmann shift is negative (significantly below),
  *pass* otherwise, *undecided* when the two samples are too small for any outcome to reach alpha (fewer than 4
  a side at 95 %).

An expectation fails when one of its points fails; else it is undecided when one is (or when it selects no
point); else it passes. The intervals are two-sided, so a pass at 95 % is one-sidedly at least 97.5 % sure. A
threshold expectation judged at many points makes no correction for their number: each point's verdict stands
at its own level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bbrlab.campaign.expect import (
    FILE_KEYS,
    MAX_FILE_BYTES,
    OPS,
    Expectation,
    expectations_from_file,
    read_expectations,
)
from bbrlab.core.confidence import MIN_N, level_text, median_interval, order_statistic_rank
from bbrlab.core.errors import BbrlabError

from . import runkey
from .confidence_report import holm_adjust
from .stats import Comparison, compare, too_few_to_compare

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
#: Verdicts from the best to the worst: an expectation takes its points' worst.
ORDER = (PASS, UNDECIDED, FAIL)
#: The columns a point's label leaves out (``cca`` names the CCA; ``variant`` only repeats it).
_UNLABELLED = ("variant",)


@dataclass(frozen=True)
class PointVerdict:
    """One point's verdict and its evidence.

    ``point`` names the point in words (the identity's columns that vary among the points judged); ``n`` counts
    its units of replication (``unit``: runs or blocks), ``runs`` its runs; ``median``, ``low`` and ``high`` are
    the median and its interval at ``level`` (the level reached); ``needed`` the units that would reach the
    confidence asked (None when it was reached). For ``not_below``: ``other`` the other CCA's median and units
    (``other_n``), ``shift`` the Hodges-Lehmann shift of this CCA against it and ``p_value`` the test's."""

    point: str
    verdict: str
    evidence: str
    n: int
    unit: str
    runs: int
    median: float
    low: float = math.nan
    high: float = math.nan
    level: float = math.nan
    needed: int | None = None
    other: float = math.nan
    other_n: int | None = None
    shift: float = math.nan
    p_value: float = math.nan


@dataclass(frozen=True)
class Judgement:
    """An expectation's verdict: the worst of its points' (:data:`ORDER`), undecided without any; ``notes`` say
    what was left out (points without a value, points the other CCA did not run) and why no point was judged."""

    expectation: Expectation
    verdict: str
    points: tuple[PointVerdict, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckReport:
    """What ``bbrlab check`` judged: the data folder, where the expectations came from, how many ok runs were
    read and every expectation's :class:`Judgement`."""

    path: Path
    source: str
    runs: int
    judgements: tuple[Judgement, ...] = field(default=())

    @property
    def verdict(self) -> str:
        """fail when an expectation failed, else undecided when one is, else pass (no expectation: pass)."""
        return worst(j.verdict for j in self.judgements)

    def counts(self) -> dict[str, int]:
        """How many expectations have each verdict."""
        return {v: sum(1 for j in self.judgements if j.verdict == v) for v in ORDER}


def worst(verdicts) -> str:
    """The worst of ``verdicts`` (:data:`ORDER`); pass for none."""
    return max(verdicts, key=ORDER.index, default=PASS)


def units_needed(level: float) -> int:
    """The fewest runs (or blocks) whose interval of the median reaches ``level``: 6 at 95 %, 2 at 50 %."""
    n = MIN_N
    while order_statistic_rank(n, level)[1] < level - 1e-12:
        n += 1
    return n


def per_side_needed(alpha: float) -> int:
    """The fewest runs (or blocks) a side whose two-sided Mann-Whitney test can reach ``alpha``: 4 at 0.05."""
    m = 1
    while too_few_to_compare(m, m, alpha):
        m += 1
    return m


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4g}"


# -- selecting points ----------------------------------------------------------------------------------------------

def _matches(runs: pd.DataFrame, e: Expectation, cca: str | None) -> tuple[pd.DataFrame, str | None]:
    """The runs of ``cca`` (if given) that meet ``e``'s ``where``; with none left, a note naming the condition
    that emptied the selection and the values the data has."""
    conditions = [("cca", lambda v: v == cca, f"cca = {cca}")] if cca else []
    conditions += [(c.column, _uncontended_too(c) if c.column in runkey.CONTENTION_PARAMETERS else c.holds,
                    c.text()) for c in e.where]
    for column, holds, text in conditions:
        if column not in runs.columns:
            return runs.iloc[0:0], f"the runs have no column {column} ({text})"
        keep = runs[column].map(lambda v, h=holds: bool(h(_plain(v))))
        if not keep.any():
            have = sorted({_plain(v) for v in runs[column].dropna()}, key=str)
            shown = ", ".join(_fmt(v) if isinstance(v, float) else str(v) for v in have) or "none"
            return runs.iloc[0:0], f"no run with {text} (the runs have {column} {shown})"
        runs = runs[keep.to_numpy(dtype=bool)]
    return runs, None


def _uncontended_too(condition):
    """A condition on a contention parameter (a timeslice, a CFS period ...) that an uncontended point, which has
    none (:func:`bbrlab.analysis.runkey.identity`), meets too: it belongs to every timeslice's curve, as in the
    figures."""
    return lambda v: v is None or condition.holds(v)


def _plain(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if isinstance(v, np.generic) else v


def _points(runs: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """``runs`` split into points (one run identity each, :func:`bbrlab.analysis.runkey.identity`): each as its
    identity's values and its runs, in the identity's order."""
    if runs.empty:
        return []
    ids = runkey.identity(runs)
    cols = list(ids.columns)
    codes = ids.groupby([ids[c] for c in cols], dropna=False, sort=True).ngroup().to_numpy()
    out = []
    for code in sorted(set(codes.tolist())):
        mask = codes == code
        first = ids[mask].iloc[0]
        out.append(({c: _plain(first[c]) for c in cols}, runs[mask]))
    return out


def _labeller(keys: Sequence[dict], named: Sequence[str] = ()):
    """A function naming a point by its CCA, the columns ``named`` (an expectation's ``where``) and the identity
    columns that vary among ``keys``; a missing value (an uncontended point's timeslice) is left out."""
    shown = [c for c in (keys[0] if keys else {})
             if c == "cca" or c in named or len({str(k[c]) for k in keys}) > 1]
    shown = [c for c in shown if c not in _UNLABELLED]

    def label(key: dict) -> str:
        return runkey.label({c: key[c] for c in shown if key.get(c) is not None}) or "all runs"
    return label


def _units(group: pd.DataFrame, metric: str) -> tuple[np.ndarray, str]:
    """A point's values of ``metric`` at its unit of replication, NaN left out, and the unit's plural."""
    from .data import replication_values

    values, unit = replication_values(group, metric)
    values = np.asarray(values, dtype=float)
    return values[~np.isnan(values)], f"{unit}s"


# -- judging -------------------------------------------------------------------------------------------------------

def judge_threshold(e: Expectation, values: np.ndarray, unit: str, runs: int, point: str) -> PointVerdict:
    """One point of a statistic-against-value expectation (see the module docstring)."""
    ci = median_interval(values, e.confidence)
    median = float(np.median(values)) if len(values) else math.nan
    base = dict(point=point, n=ci.n, unit=unit, runs=runs, median=median, low=ci.low, high=ci.high, level=ci.level)
    if not ci.reaches(e.confidence):
        needed = units_needed(e.confidence)
        reached = f"[min, max] [{_fmt(ci.low)}, {_fmt(ci.high)}] reaches {level_text(ci.level)}" if ci.rank else \
            "no interval"
        return PointVerdict(**base, verdict=UNDECIDED, needed=needed, evidence=(
            f"median {_fmt(median)}, {reached} with n = {ci.n} {unit}; {level_text(e.confidence)} asked: "
            f"{needed} {unit} would reach it"))
    test = OPS[e.op]
    shown = f"median {_fmt(median)}, interval [{_fmt(ci.low)}, {_fmt(ci.high)}] at {level_text(ci.level)}, n = {ci.n} {unit}"
    if test(ci.low, e.value) and test(ci.high, e.value):
        return PointVerdict(**base, verdict=PASS, evidence=f"{shown}: the whole interval is {e.op} {e.value:g}")
    if not test(ci.low, e.value) and not test(ci.high, e.value):
        return PointVerdict(**base, verdict=FAIL, evidence=f"{shown}: no part of the interval is {e.op} {e.value:g}")
    return PointVerdict(**base, verdict=UNDECIDED, evidence=(
        f"{shown}: the interval straddles {e.value:g}; more {unit} narrow it"))


def judge_not_below(e: Expectation, c: Comparison, p_holm: float, unit: str, runs: int, point: str) -> PointVerdict:
    """One point of a ``not_below`` expectation: ``c`` compares this CCA's values (``b``) with the other's (``a``),
    ``p_holm`` is its p after Holm's correction over the expectation's points (see the module docstring)."""
    alpha = 1 - e.confidence
    base = dict(point=point, n=c.n_b, unit=unit, runs=runs, median=c.median_b, other=c.median_a, other_n=c.n_a)
    sides = (f"{e.cca} median {_fmt(c.median_b)} vs {e.not_below} {_fmt(c.median_a)} "
             f"(n = {c.n_b} vs {c.n_a} {unit})")
    if too_few_to_compare(c.n_b, c.n_a, alpha) or math.isnan(p_holm):
        best = 1 - 2 / math.comb(c.n_a + c.n_b, c.n_a) if c.n_a and c.n_b else 0.0
        needed = per_side_needed(alpha)
        return PointVerdict(**base, verdict=UNDECIDED, level=max(best, 0.0), needed=needed, evidence=(
            f"{sides}: a test of these samples reaches at most {level_text(max(best, 0.0))}, "
            f"{level_text(e.confidence)} asked: {needed} {unit} a side would reach it"))
    test = f"Hodges-Lehmann shift {c.shift:+.4g}, Mann-Whitney p = {c.p_value:.3g}, Holm {p_holm:.3g}"
    base.update(shift=c.shift, p_value=p_holm, level=e.confidence)
    if p_holm < alpha and c.shift < 0:
        return PointVerdict(**base, verdict=FAIL, evidence=f"{sides}: significantly below ({test} < {alpha:.3g})")
    why, cmp = ("significantly above", "<") if p_holm < alpha else ("no significant difference", ">=")
    return PointVerdict(**base, verdict=PASS, evidence=f"{sides}: {why} ({test} {cmp} {alpha:.3g})")


def judge(e: Expectation, runs: pd.DataFrame) -> Judgement:
    """Judge expectation ``e`` on ``runs`` (a ``runs`` table; its ok runs are used)."""
    ok = runkey.with_identity(runs[runs["status"] == "ok"] if "status" in runs.columns else runs)
    selected, empty = _matches(ok, e, e.cca)
    if empty:
        return Judgement(e, UNDECIDED, (), (empty,))
    if e.metric not in selected.columns:
        return Judgement(e, UNDECIDED, (), (f"the runs have no column {e.metric}",))
    points = _points(selected)
    with_values = [(k, g) for k, g in points if g[e.metric].notna().any()]
    notes = []
    if len(with_values) < len(points):
        notes.append(f"{len(points) - len(with_values)} of {len(points)} points have no {e.metric} (e.g. "
                     "jain_index in runs of one flow): left out")
    if not with_values:
        return Judgement(e, UNDECIDED, (), (*notes, f"no point has a value of {e.metric}"))
    if e.kind == "not_below":
        return _judge_not_below(e, ok, with_values, notes)
    label = _labeller([k for k, _ in with_values], [c.column for c in e.where])
    verdicts = []
    for key, group in with_values:
        values, unit = _units(group, e.metric)
        verdicts.append(judge_threshold(e, values, unit, len(group), label(key)))
    return Judgement(e, worst(v.verdict for v in verdicts), tuple(verdicts), tuple(notes))


def _judge_not_below(e: Expectation, ok: pd.DataFrame, own: list[tuple[dict, pd.DataFrame]],
                     notes: list[str]) -> Judgement:
    """``not_below``: each of ``own``'s points against the other CCA's point of the same identity but the CCA."""
    others, empty = _matches(ok, e, e.not_below)
    if empty:
        return Judgement(e, UNDECIDED, (), (*notes, empty))
    free = [c for c in runkey.CCA_KEY if c != "kernel"]
    by_setting = {_setting(k, free): g for k, g in _points(others)}
    pairs = [(k, g, by_setting.get(_setting(k, free))) for k, g in own]
    alone = [k for k, _, o in pairs if o is None]
    pairs = [(k, g, o) for k, g, o in pairs if o is not None]
    label = _labeller([k for k, _ in own], [c.column for c in e.where])
    if alone:
        notes.append(f"{len(alone)} {e.cca} point(s) without {e.not_below} runs, not judged: "
                     + "; ".join(label(k) for k in alone[:6]) + (" ..." if len(alone) > 6 else ""))
    if not pairs:
        return Judgement(e, UNDECIDED, (), (*notes, f"no point where both {e.cca} and {e.not_below} ran"))
    alpha = 1 - e.confidence
    compared = []
    for key, group, other in pairs:
        mine, theirs, unit = _samples(group, other, e.metric)
        compared.append((key, group, compare(theirs, mine, alpha), unit))
    holm = holm_adjust([c.p_value for _, _, c, _ in compared])
    verdicts = [judge_not_below(e, c, p, unit, len(group), label(key))
                for (key, group, c, unit), p in zip(compared, holm, strict=True)]
    return Judgement(e, worst(v.verdict for v in verdicts), tuple(verdicts), tuple(notes))


def _samples(own: pd.DataFrame, other: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, str]:
    """Both sides' values of ``metric`` and their unit: each block's median when both sides span blocks, else the
    runs (the rule of :func:`bbrlab.analysis.confidence_report.comparison_rows`)."""
    (mine, unit), (theirs, other_unit) = _units(own, metric), _units(other, metric)
    if unit == other_unit == "blocks":
        return mine, theirs, unit
    return _clean(own[metric]), _clean(other[metric]), "runs"


def _clean(values: pd.Series) -> np.ndarray:
    x = values.to_numpy(dtype=float)
    return x[~np.isnan(x)]


def _setting(key: dict, free: Sequence[str]) -> tuple:
    """A point's identity without the columns ``free`` (the CCA's), hashable; a missing value is None."""
    return tuple((c, key[c]) for c in key if c not in free)


# -- a campaign ----------------------------------------------------------------------------------------------------

def spec_expectations(path: Path) -> tuple[Expectation, ...]:
    """The ``expect:`` block of the campaign directory's ``spec.yaml`` (empty when it has none)."""
    from bbrlab.core.yamlfile import load_file

    spec = path / "spec.yaml"
    if not spec.is_file():
        raise BbrlabError(f"{path} has no spec.yaml to read expectations from: give them with --expect FILE")
    data = load_file(spec, "spec", "campaign spec")
    return read_expectations(data.get("expect", [])) if isinstance(data, dict) else ()


def expectations_of_file(path: str | Path) -> tuple[Expectation, ...]:
    """The expectations of ``path``: a file of expectations (``expect:`` and ``description:``,
    :func:`bbrlab.campaign.expect.expectations_from_file`), or a campaign spec, whole, checked as
    :func:`bbrlab.campaign.spec.load_spec` checks it (its ``expect:`` block)."""
    from bbrlab.campaign.spec import load_spec
    from bbrlab.core.yamlfile import load_file

    try:
        data = load_file(path, "expect", "file of expectations", MAX_FILE_BYTES)
    except (OSError, UnicodeDecodeError) as e:
        raise BbrlabError(f"cannot read the file of expectations {path}: {getattr(e, 'strerror', None) or e}") from None
    if isinstance(data, dict) and set(data) - set(FILE_KEYS):
        return load_spec(path).expect
    return expectations_from_file(path).expectations


def check(path: str | Path, expectations: Sequence[Expectation] | None = None, *, source: str | None = None,
          cache: bool = True) -> CheckReport:
    """Judge the runs under ``path`` (a campaign directory, or a folder of them) against ``expectations``
    (default: the ``expect:`` block of ``path/spec.yaml``). Raises :class:`BbrlabError` when ``path`` holds no
    runs or there are no expectations."""
    from . import data

    path = Path(path)
    if not path.is_dir() or not data.find_sources(path):
        raise BbrlabError(f"{path} holds no runs: no campaign (runs/, failed/ or plan.json) here or in its subfolders")
    if expectations is None:
        expectations, source = spec_expectations(path), f"{path / 'spec.yaml'}"
    if not expectations:
        raise BbrlabError(f"no expectations to judge: {source or path} has no expect: block (docs/expectations.md); "
                          "add one to the spec, or give --expect FILE")
    runs = data.load(path, cache=cache).runs
    ok = runs[runs["status"] == "ok"]
    return CheckReport(path, source or "", len(ok), tuple(judge(e, runs) for e in expectations))
