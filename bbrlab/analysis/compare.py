"""The calibration of bbrlab's own uncertainty: does a second recording of the same conditions fall inside the
intervals the first one states?

Each point of recording A (one condition: variant, CPU share and every other dimension of :data:`POINT_KEYS`) has
the order-statistic interval of its median with the level it reaches (:func:`bbrlab.core.confidence.median_interval`:
95 % from 6 runs, 50 % at 2). :func:`calibration` matches B's points to A's (:func:`match_points`, the one place
that decides "the same condition") and counts, per level A states, how many of B's point medians lie inside A's
interval. A second median is itself noisy, so even two recordings that differ in nothing but their runs' chance
put fewer of B's medians inside than the level states (at n = 2 a side about 39 % inside [min, max], stated 50 %;
at 20 a side about 86 % inside a 95.8 % interval): :func:`expected_inside` computes that reference for each point's
n, and a fraction well below it says A's intervals miss a variation that lies between the recordings.

Beside it: how many of B's medians lie within ±10 % of A's; the median half-width of A's intervals as a
fraction of the link rate (issue 36's second target); the points whose medians stay below 0.8 x both recordings'
CPU ceilings (where the ceiling, a property of the machine, bounds neither); which variation A's intervals span
(runs, sender boots, blocks, machines, days per point); and whether A and B ran on different machines.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from bbrlab.core.confidence import LEVEL, MedianInterval, level_text, median_interval, order_statistic_rank
from bbrlab.core.errors import BbrlabError

from . import runkey

#: The dimensions of one condition (those present in both tables count): the run-identity key
#: (:data:`bbrlab.analysis.runkey.RUN_KEY`), the one definition of "the same condition".
POINT_KEYS = runkey.RUN_KEY
#: Columns never matched on, even when a run-identity key holds them: comparing machines is what compare is for.
NOT_MATCHED_ON = ("machine", "machine_id", "host_boot_id", "sender_boot_id", "block")
#: The values compare reads, and whether each is in Mbit/s (its half-width is then divided by the link rate).
VALUES = {"throughput_mbit": True, "goodput_mbit": True, "link_utilisation": False}
#: Within this fraction of A's median, B's median "agrees".
AGREEMENT = 0.10
#: Draws of :func:`expected_inside`'s simulation (its standard error is below half a percentage point).
REFERENCE_DRAWS = 20_000
#: A point counts as below the ceilings when both medians are below this fraction of both recordings' ceilings.
BELOW_CEILING = 0.8


def _plain(value):
    """``value`` as a hashable plain Python value: missing (NaN, NA, None) -> None, numpy scalars -> Python."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


def _order(value) -> tuple:
    """A sort key for a plain value of any type: numbers in order, then strings, missing last."""
    if value is None:
        return (2, "", 0)
    return (0, "", value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, str(value), 0)


def point_keys(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """The columns of :data:`POINT_KEYS` both tables have, less :data:`NOT_MATCHED_ON`."""
    return [k for k in POINT_KEYS if k in a.columns and k in b.columns and k not in NOT_MATCHED_ON]


def _points(runs: pd.DataFrame, keys: list[str]) -> dict[tuple, pd.DataFrame]:
    return {tuple(_plain(v) for v in (values if isinstance(values, tuple) else (values,))): group
            for values, group in runs.groupby(keys, dropna=False, sort=True)}


def match_points(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> tuple[list[tuple], dict, dict]:
    """B's points matched to A's by identical condition: the one definition of "the same condition" compare uses.

    Parameters
    ----------
    a, b : pandas.DataFrame
        ``runs`` tables (their ok runs).
    keys : list of str
        The condition's columns (:func:`point_keys`); two runs are of one point when they agree in every one
        (missing equals missing).

    Returns
    -------
    (list of tuple, dict, dict)
        The keys of the points both hold (sorted), and ``{key: runs}`` of A's and of B's points.
    """
    pa, pb = _points(a, keys), _points(b, keys)
    both = sorted(set(pa) & set(pb), key=lambda k: tuple(_order(v) for v in k))
    return both, pa, pb


@lru_cache(maxsize=256)
def expected_inside(n_a: int, n_b: int, level: float = LEVEL) -> float:
    """The fraction of B's medians (``n_b`` runs) inside A's interval of the median (``n_a`` runs, asked
    ``level``) when both are independent draws of one distribution: what a comparison shows when nothing but the
    runs' chance differs. Simulated with normal draws (fixed seed, :data:`REFERENCE_DRAWS`); for odd ``n_b`` the
    fraction depends on ranks alone, so on no distribution; for even ``n_b`` (the median a mean of two) it moves
    by about a point between a normal and an exponential. NaN below 2 runs in A or 1 in B."""
    k, _ = order_statistic_rank(n_a, level)
    if k == 0 or n_b < 1:
        return math.nan
    rng = np.random.default_rng(36)
    a = np.sort(rng.standard_normal((REFERENCE_DRAWS, n_a)), axis=1)
    b = np.median(rng.standard_normal((REFERENCE_DRAWS, n_b)), axis=1)
    return float(np.mean((a[:, k - 1] <= b) & (b <= a[:, n_a - k])))


def _true(series: pd.Series) -> int:
    """How many of ``series`` are True (None and NA are not)."""
    return int(series.eq(True).sum())


def _count(series: pd.Series | None) -> int | None:
    """Distinct values of ``series``; None when it has none (the records do not say)."""
    if series is None:
        return None
    n = series.dropna().nunique()
    return int(n) if n else None


def variation(runs: pd.DataFrame) -> dict:
    """What the runs of one point span: ``runs``, ``boots`` (sender boots), ``blocks``, ``machines`` (machine ids,
    else machine labels) and ``days`` (UTC dates they started on); None where the records do not say."""
    machines = _count(runs.get("machine_id")) or _count(runs.get("machine"))
    days = runs["started_at"].dropna().astype(str).str[:10] if "started_at" in runs else None
    return {"runs": int(len(runs)), "boots": _count(runs.get("sender_boot_id")), "blocks": _count(runs.get("block")),
            "machines": machines, "days": _count(days)}


def _ceiling(runs: pd.DataFrame) -> float:
    return float(runs["ceiling_mbit"].median()) if "ceiling_mbit" in runs and runs["ceiling_mbit"].notna().any() \
        else math.nan


def _units(runs: pd.DataFrame, value: str) -> tuple[np.ndarray, str]:
    """A point's units of replication and their name: its block medians (``blocks``) when its runs span blocks,
    else its runs' values (``runs``); the rule is :func:`bbrlab.analysis.data.replication_values`."""
    from bbrlab.analysis.data import replication_values

    values, unit = replication_values(runs, value)
    return values, f"{unit}s"


def point_row(key: dict, a: pd.DataFrame, b: pd.DataFrame, value: str, level: float) -> dict:
    """One matched point: A's interval (asked ``level``) and what B's median does against it. When a side's
    runs span blocks, its units are its block medians (:func:`bbrlab.core.confidence.blocked_median_interval`'s
    reasoning): A's interval is over them and B's median is the median of B's."""
    (va, unit_a), (vb, unit_b) = _units(a, value), _units(b, value)
    ci: MedianInterval = median_interval(va, level)
    med_a, med_b = float(np.nanmedian(va)), float(np.nanmedian(vb))
    rate = key.get("rate_mbit")
    scale = rate if VALUES.get(value, True) else 1.0
    half = (ci.high - ci.low) / 2 / scale if scale and not math.isnan(ci.low) else math.nan
    ceil_a, ceil_b = _ceiling(a), _ceiling(b)
    below = (max(med_a, med_b) < BELOW_CEILING * min(ceil_a, ceil_b)) if not (math.isnan(ceil_a)
                                                                             or math.isnan(ceil_b)) else None
    return {**key, "unit_a": unit_a, "unit_b": unit_b, "n_a": ci.n, "n_b": int(np.count_nonzero(~np.isnan(vb))),
            "median_a": med_a, "median_b": med_b,
            "low_a": ci.low, "high_a": ci.high, "level_a": ci.level, "reaches": ci.reaches(level),
            "interval_a": ci.text(), "inside": bool(ci.low <= med_b <= ci.high) if ci.rank else None,
            "expected_inside": expected_inside(ci.n, int(np.count_nonzero(~np.isnan(vb))), level),
            "within_agreement": bool(abs(med_b - med_a) <= AGREEMENT * abs(med_a)),
            "half_width_of_rate": half, "ceiling_a_mbit": ceil_a, "ceiling_b_mbit": ceil_b, "below_ceilings": below,
            **{f"{k}_a": v for k, v in variation(a).items()}}


@dataclass
class LevelRow:
    """B's medians inside A's intervals, for the points whose interval states one level."""

    stated: str  # "95 % or more", "50 %" ...
    level: float  # the level (the asked one for the row of those that reach it)
    points: int
    inside: int
    expected: float  # the mean of the points' expected_inside: the fraction if only the runs' chance differed

    @property
    def fraction(self) -> float:
        """inside / points (NaN without points)."""
        return self.inside / self.points if self.points else math.nan


@dataclass
class Calibration:
    """What :func:`calibration` finds; :meth:`to_dict` is ``bbrlab compare --json``'s output."""

    a: str
    b: str
    value: str
    level: float
    keys: list[str]
    runs_a: int
    runs_b: int
    points_a: int
    points_b: int
    levels: list[LevelRow]
    inside: int
    matched: int
    no_interval: int  # matched points of a single run in A: no interval to fall into
    expected: float  # the fraction inside if only the runs' chance differed (mean of the points' expected_inside)
    agree: int
    below_ceilings: dict | None
    half_width: dict
    covers: dict
    machines: dict
    points: pd.DataFrame = field(repr=False)

    def to_dict(self) -> dict:
        """Plain JSON: every field, the levels with their fractions, the points as a list of rows."""
        out = {k: v for k, v in asdict(self).items() if k != "points"}
        out["levels"] = [{**asdict(r), "fraction": r.fraction} for r in self.levels]
        out["points"] = [{k: _plain(v) for k, v in row.items()} for row in self.points.to_dict("records")]
        return _nan_to_none(out)


def _nan_to_none(obj):
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return None if isinstance(obj, float) and math.isnan(obj) else obj


def level_rows(points: pd.DataFrame, level: float) -> list[LevelRow]:
    """One row for the points whose interval reaches ``level``, then one per lower level stated (highest first)."""
    rows = []
    reach = points[points["reaches"]]
    if len(reach):
        rows.append(LevelRow(f"{level_text(level)} or more", level, len(reach), _true(reach["inside"]),
                             float(reach["expected_inside"].mean())))
    short = points[~points["reaches"] & points["level_a"].notna()]
    for lvl, group in sorted(short.groupby("level_a"), key=lambda t: -t[0]):
        units = group["unit_a"] if "unit_a" in group else pd.Series("runs", index=group.index)
        n = ", ".join(f"{k} {u}" for k, u in sorted(set(zip(group["n_a"], units, strict=True))))
        rows.append(LevelRow(f"{level_text(lvl)} (n = {n})", float(lvl), len(group),
                             _true(group["inside"]), float(group["expected_inside"].mean())))
    return rows


def _mean_or_nan(series: pd.Series) -> float:
    s = series.dropna()
    return float(s.mean()) if len(s) else math.nan


def _median_or_nan(series: pd.Series) -> float:
    s = series.dropna()
    return float(s.median()) if len(s) else math.nan


def half_widths(points: pd.DataFrame) -> dict:
    """The median half-width of A's intervals over the link rate: of every interval, and of those that reach the
    asked level (NaN without such intervals), with their counts."""
    reach = points[points["reaches"]]
    return {"all": _median_or_nan(points["half_width_of_rate"]), "all_n": int(points["half_width_of_rate"].notna().sum()),
            "reaching": _median_or_nan(reach["half_width_of_rate"]),
            "reaching_n": int(reach["half_width_of_rate"].notna().sum())}


def covers(points: pd.DataFrame) -> dict:
    """What A's intervals span per point: the median over points of runs, sender boots, blocks, machines, days
    (None where the records do not say)."""
    out = {}
    for what in ("runs", "boots", "blocks", "machines", "days"):
        s = points[f"{what}_a"].dropna() if f"{what}_a" in points else pd.Series(dtype=float)
        out[what] = float(s.median()) if len(s) else None
    return out


def machines(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    """Which machines A and B ran on, and whether they differ: ``verdict`` is ``different``, ``same machine id,
    other boots``, ``same`` or ``unknown`` (a side whose records do not name the machine), ``sentence`` says it."""
    def side(runs: pd.DataFrame) -> dict:
        col = lambda name: sorted(runs[name].dropna().astype(str).unique()) if name in runs else []  # noqa: E731
        return {"labels": col("machine"), "ids": col("machine_id"), "host_boots": col("host_boot_id"),
                "testbeds": col("testbed")}

    sa, sb = side(a), side(b)
    named = f"A on {', '.join(sa['labels']) or 'an unnamed machine'}, B on {', '.join(sb['labels']) or 'an unnamed machine'}"
    if not sa["ids"] or not sb["ids"]:
        which = " and ".join(s for s, d in (("A", sa), ("B", sb)) if not d["ids"])
        verdict, sentence = "unknown", (f"{which}'s records do not name the machine (made before bbrlab recorded it): "
                                        "whether A and B ran on one machine cannot be told")
    elif not set(sa["ids"]) & set(sb["ids"]):
        kind = " of one kind (same CPU model and speed)" if sa["labels"] == sb["labels"] else ""
        verdict, sentence = "different", f"A and B ran on DIFFERENT machines{kind}: {named}"
    elif not set(sa["host_boots"]) & set(sb["host_boots"]):
        verdict, sentence = "same machine id, other boots", (
            f"A and B ran on one machine id but on different boots of its host (or on clones of one VM image, "
            f"which share the id): {named}")
    else:
        verdict, sentence = "same", f"A and B ran on the same machine and host boot: {named}"
    return {"a": sa, "b": sb, "verdict": verdict, "sentence": sentence}


def _ok(runs: pd.DataFrame, value: str, name: str, where: str) -> pd.DataFrame:
    if runs.empty:
        raise BbrlabError(f"{name} ({where}) holds no runs: give a campaign directory (runs/, plan.json) or a "
                          "folder of campaigns")
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    ok = ok[ok[value].notna()] if value in ok else ok.iloc[0:0]
    if ok.empty:
        raise BbrlabError(f"{name} ({where}) holds {len(runs)} runs but no ok run with a {value}")
    return ok


def no_match_error(a: pd.DataFrame, b: pd.DataFrame, keys: list[str], where: tuple[str, str]) -> BbrlabError:
    """The error for two recordings without a common point: the dimensions whose values never meet."""
    apart = []
    for k in keys:
        va, vb = {_plain(v) for v in a[k]}, {_plain(v) for v in b[k]}
        if not va & vb:
            shown = lambda vs: ", ".join(map(str, sorted(vs, key=_order)[:4])) + (" ..." if len(vs) > 4 else "")  # noqa: E731
            apart.append(f"{k} (A: {shown(va)}; B: {shown(vb)})")
    why = ("values that never meet: " + "; ".join(apart)) if apart else \
        "each dimension's values occur in both, but no combination of them does"
    return BbrlabError(f"no point of B ({where[1]}) matches a point of A ({where[0]}) in every dimension "
                       f"({', '.join(keys)}): {why}")


def calibration(a_runs: pd.DataFrame, b_runs: pd.DataFrame, *, value: str = "throughput_mbit", level: float = LEVEL,
                names: tuple[str, str] = ("A", "B")) -> Calibration:
    """B's point medians against A's intervals (see the module's text).

    Parameters
    ----------
    a_runs, b_runs : pandas.DataFrame
        ``runs`` tables of the two recordings (failed runs and runs without ``value`` are left out).
    value : str, default "throughput_mbit"
        One of :data:`VALUES`.
    level : float, default 0.95
        The level asked of A's intervals (each states the level its n reaches).
    names : (str, str)
        How A and B are named in errors and in the result (their folders).

    Returns
    -------
    Calibration

    Raises
    ------
    BbrlabError
        A side without runs or without ok runs, ``value`` or ``level`` out of range, or no point in common.
    """
    if value not in VALUES:
        raise BbrlabError(f"value {value!r}: must be one of {', '.join(VALUES)}")
    if not 0 < level < 1:
        raise BbrlabError(f"level {level!r}: must lie strictly between 0 and 1 (0.95 is 95 %)")
    a, b = _ok(a_runs, value, "A", names[0]), _ok(b_runs, value, "B", names[1])
    a, b = runkey.with_identity(a), runkey.with_identity(b)  # an uncontended run's timeslice is no dimension
    keys = point_keys(a, b)
    both, pa, pb = match_points(a, b, keys)
    if not both:
        raise no_match_error(a, b, keys, names)
    points = pd.DataFrame([point_row(dict(zip(keys, k, strict=True)), pa[k], pb[k], value, level) for k in both])
    below = points[points["below_ceilings"].eq(True)]  # None (no ceilings) is not below
    ceilings = None if points["below_ceilings"].isna().all() else {
        "points": len(below), "inside": _true(below["inside"]),
        "agree": int(below["within_agreement"].sum())}
    return Calibration(a=names[0], b=names[1], value=value, level=level, keys=keys, runs_a=len(a), runs_b=len(b),
                       points_a=len(pa), points_b=len(pb), levels=level_rows(points, level),
                       inside=_true(points["inside"]), matched=len(points),
                       no_interval=int(points["inside"].isna().sum()),
                       expected=_mean_or_nan(points["expected_inside"]), agree=int(points["within_agreement"].sum()),
                       below_ceilings=ceilings, half_width=half_widths(points), covers=covers(points),
                       machines=machines(a, b), points=points)
