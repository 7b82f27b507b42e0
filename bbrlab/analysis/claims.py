"""Findings that cannot drift: a registry of the numbers the prose states about ``data/``, recomputed.

Each claim in the registry (``docs/claims.yaml``) names a data folder, a selection (column filters on its
``runs`` table, applied with :func:`bbrlab.analysis.data.select`), a statistic and the value as printed. The
prose carries an invisible marker right after each number (``7.6<!-- claim:fq-cubic-25-fq --> Mbit/s``), and
:func:`check` recomputes every claim and compares it with the registry and with the prose. ``bbrlab claims
check`` prints what differs; ``tests/unit/analysis/test_claims.py`` fails on it.

Statistics (``stat``) of ``column`` over the selected runs:

- ``median``, ``mean``, ``min``, ``max``, ``sum``; ``range`` prints ``low-high`` (one value when both print alike);
- ``count``: the selected runs (no column); ``groups``: the distinct values of ``by`` among them (points);
  ``fraction``: the percentage of them that also match ``where``
  (every other statistic keeps only the runs that match ``where``); ``within`` narrows the selection by
  ranges (``{inflight_bdp: {below: 1}}``) before any statistic, a fraction's denominator included;
- ``interval``: the order-statistic interval of the median (:func:`bbrlab.core.confidence.median_interval`,
  asked at 95 %) as ``low-high``; ``level``: the level that interval reaches, as a percentage (50 at n = 2);
- ``threshold_low``, ``threshold_high``: the ends of the share interval (low, high] a threshold search decided
  from its runs (:func:`bbrlab.analysis.thresholds.threshold_table`; ``select`` filters its rows: ``cca``,
  ``timeslice_ms``).

With ``by`` (columns), the statistic is taken per group and ``across`` (``range``, ``min``, ``max``) combines
the groups' values: the range of per-queue medians, say. A ``column`` of the form ``record:a.b.c`` reads that
field of each selected run's ``record.json`` (the sampler's own interval statistics, for instance).
``scale`` multiplies the column (100: a fraction as a percentage). ``format`` is a Python format spec (``.1f``, ``d``, ``,d``) or ``hh:mm`` for a UTC time stamp.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bbrlab.core.confidence import median_interval
from bbrlab.core.errors import BbrlabError
from bbrlab.core.yamlfile import load_file

from .tables import Tables

STATS = ("median", "mean", "min", "max", "sum", "range", "count", "groups", "fraction", "interval", "level",
         "threshold_low", "threshold_high", "calibration")
ACROSS = ("range", "min", "max")
#: ``runs``: one row per run; ``flows``: one row per flow of a run, ``ss``: one row per socket sample, each with
#: its run's columns beside it.
TABLES = ("runs", "flows", "ss")
#: The prose files whose numbers about data/ are tied to claims (relative to the repository root).
PROSE = ("README.md", "data/README.md", "docs/*.md")
MARKER = re.compile(r"<!-- claim:([A-Za-z0-9_.-]+) -->")
FINDINGS = re.compile(r"<!-- findings -->(.*?)<!-- /findings -->", re.S)
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")


@dataclass(frozen=True)
class Claim:
    """One number the prose states about data/: where it comes from and how it is printed."""

    id: str
    data: str
    stat: str
    value: str
    column: str | None = None
    select: Mapping[str, object] = field(default_factory=dict)
    where: Mapping[str, object] = field(default_factory=dict)
    within: Mapping[str, object] = field(default_factory=dict)
    by: tuple[str, ...] = ()
    across: str | None = None
    format: str = ".1f"
    scale: float = 1.0
    table: str = "runs"
    against: str | None = None  # stat calibration: the second recording (a folder of data/) held against data
    note: str = ""


@dataclass(frozen=True)
class Difference:
    """A claim whose recomputed value, or whose printed value in a prose file, differs from the registry."""

    claim: str
    where: str
    stated: str
    recomputed: str


@dataclass(frozen=True)
class Registry:
    """The claims and the phrases whose numbers are parameters, not data (``parameters``: regexes)."""

    claims: tuple[Claim, ...]
    parameters: tuple[str, ...]

    def by_id(self) -> dict[str, Claim]:
        """The claims by their id."""
        return {c.id: c for c in self.claims}


def _claim(raw: object, index: int) -> Claim:
    if not isinstance(raw, dict):
        raise BbrlabError(f"claims[{index}]: a mapping with id, data, stat, value")
    known = set(Claim.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise BbrlabError(f"claims[{index}]: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
    missing = [k for k in ("id", "data", "stat", "value") if k not in raw]
    if missing:
        raise BbrlabError(f"claims[{index}] ({raw.get('id', '?')}): missing {', '.join(missing)}")
    c = Claim(**{**raw, "value": str(raw["value"]), "by": tuple(raw.get("by") or ())})
    if c.stat not in STATS:
        raise BbrlabError(f"claims[{index}].stat = {c.stat!r} ({c.id}): one of {', '.join(STATS)}")
    if c.table not in TABLES:
        raise BbrlabError(f"claims[{index}].table = {c.table!r} ({c.id}): one of {', '.join(TABLES)}")
    if c.across is not None and c.across not in ACROSS:
        raise BbrlabError(f"claims[{index}].across = {c.across!r} ({c.id}): one of {', '.join(ACROSS)}")
    if c.stat == "groups" and not c.by:
        raise BbrlabError(f"claims[{index}] ({c.id}): stat groups needs by (the columns that make a point)")
    if c.stat == "calibration" and not (c.against and c.column):
        raise BbrlabError(f"claims[{index}] ({c.id}): stat calibration needs against (the second recording's "
                          "folder) and column (a field of `bbrlab compare --json`, dotted: inside, matched, "
                          "fraction, expected, agree, half_width.all, ...)")
    if c.stat not in ("count", "groups", "fraction", "threshold_low", "threshold_high") and not c.column:
        raise BbrlabError(f"claims[{index}] ({c.id}): stat {c.stat} needs a column")
    return c


def load_registry(path: str | Path) -> Registry:
    """The registry in YAML file ``path``: ``claims: [...]`` and ``parameters: [regex, ...]``."""
    if not Path(path).is_file():
        raise BbrlabError(f"claims registry {path}: no such file (run from the repository's root, or give --root "
                          "or --registry)")
    doc = load_file(path, "claims", "claims registry")
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        raise BbrlabError(f"{path}: a mapping with a list 'claims' (and 'parameters')")
    claims = tuple(_claim(raw, i) for i, raw in enumerate(doc["claims"]))
    seen: set[str] = set()
    for c in claims:
        if c.id in seen:
            raise BbrlabError(f"{path}: claim id {c.id!r} twice")
        seen.add(c.id)
    return Registry(claims, tuple(str(p) for p in doc.get("parameters") or ()))


# -- recomputing -------------------------------------------------------------------------------------------

def _record_field(root: Path, runs: pd.DataFrame, dotted: str) -> pd.Series:
    """``dotted`` (``metadata.sampling.samples``) of each run's record.json, NaN where absent."""
    def one(rel: str) -> float:
        node: object = json.loads((root / rel / "record.json").read_text())
        for key in dotted.split("."):  # a number indexes a list: phases.1.achieved_share_pct
            if isinstance(node, list) and key.isdigit():
                node = node[int(key)] if int(key) < len(node) else None
            else:
                node = node.get(key) if isinstance(node, dict) else None
        return float(node) if isinstance(node, int | float) else math.nan

    return pd.Series([one(str(p)) for p in runs["path"]], index=runs.index, dtype="float64")


def _values(claim: Claim, runs: pd.DataFrame, root: Path) -> pd.Series:
    col = claim.column or ""
    if col.startswith("record:"):
        return _record_field(root, runs, col.removeprefix("record:"))
    if col not in runs.columns:
        raise BbrlabError(f"claim {claim.id}: no column {col!r} in {claim.data}")
    return runs[col]


def _match(runs: pd.DataFrame, conditions: Mapping[str, object]) -> pd.Series:
    """Rows whose columns have the wanted values, or lie ``{at_least: x}`` / ``{below: x}``."""
    keep = pd.Series(True, index=runs.index)
    for col, want in conditions.items():
        if isinstance(want, dict):
            x = runs[col].astype(float)
            keep &= (x >= want.get("at_least", -math.inf)) & (x < want.get("below", math.inf))
            continue
        values = list(want) if isinstance(want, list | tuple) else [want]
        keep &= runs[col].isin(values).fillna(False).astype(bool)
    return keep


def _scalar(claim: Claim, runs: pd.DataFrame, root: Path) -> float | str | tuple:
    if claim.stat == "fraction":
        return 100.0 * float(_match(runs, claim.where).mean()) if len(runs) else math.nan
    runs = runs[_match(runs, claim.where)]
    if claim.stat == "count":
        return len(runs)
    x = _values(claim, runs, root).dropna()
    if claim.scale != 1.0:
        x = x.astype(float) * claim.scale
    if claim.stat in ("interval", "level"):
        ci = median_interval(x.astype(float).tolist())
        return (ci.low, ci.high) if claim.stat == "interval" else math.floor(ci.level * 1000 + 1e-9) / 10
    if claim.stat == "range":
        return (x.min(), x.max())
    return getattr(x, claim.stat)()


def selectable(claim: Claim, tables: Tables) -> Tables:
    """Tables whose ``runs`` is the table the claim counts in: ``runs``, or ``flows`` or ``ss`` with each row's run
    columns beside it (only that table is kept: a selection then filters nothing else)."""
    rows = tables.runs
    if claim.table != "runs":
        table = getattr(tables, claim.table)
        runs = tables.runs[[c for c in tables.runs.columns if c == "run_id" or c not in table.columns]]
        rows = table.merge(runs, on="run_id", how="inner")
    return Tables.of_frames({"runs": rows, **{name: df.iloc[:0] for name, df in tables.frames().items()
                                              if name != "runs"}}, [], [])


def recompute(claim: Claim, tables: Tables, root: Path) -> str:
    """The claim's value, as printed, from ``tables`` (:func:`selectable` of a folder's tables) of folder ``root``."""
    from bbrlab.analysis import data

    if claim.stat.startswith("threshold_"):
        return _threshold(claim, root)
    selected = data.select(tables, dict(claim.select)).runs
    selected = selected[_match(selected, claim.within)]
    if selected.empty:
        return "(no runs)"
    if claim.stat == "groups":
        return _printed(selected[_match(selected, claim.where)].groupby(list(claim.by), dropna=False).ngroups,
                        claim.format)
    if not claim.by:
        return _printed(_scalar(claim, selected, root), claim.format)
    per_group = [_scalar(claim, g, root) for _, g in selected.groupby(list(claim.by), dropna=False)]
    if claim.across == "range":
        return _printed((min(per_group), max(per_group)), claim.format)
    return _printed((min if claim.across == "min" else max)(per_group), claim.format)


def _threshold(claim: Claim, root: Path) -> str:
    from bbrlab.analysis.thresholds import threshold_table

    rows = threshold_table(root)
    rows = rows[_match(rows, claim.select)]
    if len(rows) != 1:
        return f"({len(rows)} curves)"
    value = rows.iloc[0]["low_pct" if claim.stat == "threshold_low" else "high_pct"]
    return "open" if value is None or pd.isna(value) else _printed(value, claim.format)


def _calibration(claim: Claim, a: Tables, b: Tables) -> str:
    """A field of :func:`bbrlab.analysis.compare.calibration` of ``b`` (the claim's ``against``) against ``a``:
    ``column`` is a dotted path into ``bbrlab compare --json``'s output (``fraction``: inside / matched points
    with an interval; ``agree_fraction``: agree / matched)."""
    from bbrlab.analysis import compare

    out = compare.calibration(a.runs, b.runs, names=(claim.data, str(claim.against))).to_dict()
    with_interval = out["matched"] - out["no_interval"]
    out["fraction"] = out["inside"] / with_interval if with_interval else math.nan
    out["agree_fraction"] = out["agree"] / out["matched"] if out["matched"] else math.nan
    value: object = out
    for part in str(claim.column).split("."):  # a dict's key, or a list's index (levels.0.level)
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise BbrlabError(f"claim {claim.id}: column {claim.column!r} is not a field of bbrlab compare --json")
    return _printed(math.nan if value is None else value * claim.scale, claim.format)


def _one(value: object, spec: str) -> str:
    if spec == "hh:mm":
        return str(value)[11:16]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if spec.endswith("d"):
        return format(int(round(float(value))), spec)
    return format(float(value), spec)


def _printed(value: object, spec: str) -> str:
    if isinstance(value, tuple):  # a range; printed once when both ends print alike
        ends = [_one(v, spec) for v in value]
        return ends[0] if ends[0] == ends[1] else "-".join(ends)
    return _one(value, spec)


def recompute_all(registry: Registry, data_dir: str | Path,
                  load: Callable[[Path], Tables] | None = None) -> dict[str, str]:
    """Every claim's recomputed value, by id; each data folder is loaded once (its parquet cache reused)."""
    from bbrlab.analysis import data

    load = load or data.load
    loaded: dict[str, Tables] = {}
    prepared: dict[tuple[str, str], Tables] = {}
    out = {}
    for c in registry.claims:
        folder = Path(data_dir) / c.data
        for name in (c.data, c.against) if c.against else (c.data,):
            if name not in loaded:
                if not (Path(data_dir) / name).is_dir():
                    raise BbrlabError(f"claim {c.id}: no data folder {Path(data_dir) / name}")
                loaded[name] = load(Path(data_dir) / name)
        if c.stat == "calibration":
            out[c.id] = _calibration(c, loaded[c.data], loaded[str(c.against)])
            continue
        if (c.data, c.table) not in prepared:
            prepared[c.data, c.table] = selectable(c, loaded[c.data])
        out[c.id] = recompute(c, prepared[c.data, c.table], folder)
    return out


# -- the prose ---------------------------------------------------------------------------------------------

def prose_files(root: str | Path) -> list[Path]:
    """The prose files of :data:`PROSE` under the repository ``root``."""
    root = Path(root)
    return sorted({p for pattern in PROSE for p in root.glob(pattern)})


def markers(text: str) -> list[tuple[str, str]]:
    """(claim id, the text before its marker on the same line) for every marker in ``text`` (a marker inside a
    code span is an example, not a claim)."""
    text = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)
    out = []
    for m in MARKER.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        out.append((m.group(1), MARKER.sub("", text[line_start:m.start()])))
    return out


def prose_differences(registry: Registry, files: Iterable[Path], root: Path) -> list[Difference]:
    """Markers whose preceding text does not end with the registry's value, and markers of unknown claims."""
    claims = registry.by_id()
    out = []
    for path in files:
        for cid, before in markers(path.read_text()):
            where = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
            if cid not in claims:
                out.append(Difference(cid, where, before[-30:].strip(), "(no such claim)"))
            elif not before.rstrip().endswith(claims[cid].value):
                out.append(Difference(cid, where, before[-30:].strip(), claims[cid].value))
    return out


def unclaimed_numbers(text: str, parameters: Iterable[str]) -> list[str]:
    """The numbers in ``text``'s findings sections that carry no claim marker and match no parameter phrase.

    A number is claimed when it lies inside the value printed right before a marker. Numbers inside code
    spans, links' targets and image paths, and inside a match of a ``parameters`` regex, are not data.
    """
    found = []
    for section in FINDINGS.finditer(text):
        body = section.group(1)
        covered = _covered(body, parameters)
        for m in NUMBER.finditer(body):
            if not all(covered[m.start():m.end()]):
                line = body[body.rfind("\n", 0, m.start()) + 1:body.find("\n", m.end())]
                found.append(f"{m.group(0)!r} in: {MARKER.sub('', line).strip()[:120]}")
    return found


def _covered(body: str, parameters: Iterable[str]) -> list[bool]:
    """Per character of ``body``: inside code, a link target, a comment, a parameter phrase or a claimed value."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"`[^`\n]*`|\]\([^)]*\)|<!--.*?-->", body)]
    for pattern in parameters:  # a space in a pattern matches any whitespace: prose wraps its lines
        spans += [(m.start(), m.end()) for m in re.finditer(pattern.replace(" ", r"\s+"), body)]
    spans += [(_value_start(body, m.start()), m.start()) for m in MARKER.finditer(body)]
    covered = [False] * len(body)
    for start, end in spans:
        covered[start:end] = [True] * (end - start)
    return covered


def _value_start(body: str, end: int) -> int:
    """Where the value before a marker at ``end`` starts: the run of digits, signs, dots, commas, dashes
    and brackets that the marker follows (``15.0-17.5``, ``2,280``, ``[43.7, 45.1]``)."""
    start = end
    while start > 0 and (body[start - 1].isdigit() or body[start - 1] in ".,-+[]x:"
                         or (body[start - 1] == " " and start > 1 and body[start - 2] == ",")):
        start -= 1
    return start


def check(registry: Registry, data_dir: str | Path, root: str | Path,
          load: Callable[[Path], Tables] | None = None) -> list[Difference]:
    """Every difference: recomputed against the registry, the prose against the registry, and each number in a
    findings section that carries no claim (``(no claim)``)."""
    root = Path(root)
    recomputed = recompute_all(registry, data_dir, load)
    out = [Difference(c.id, f"data/{c.data}", c.value, recomputed[c.id])
           for c in registry.claims if recomputed[c.id] != c.value]
    out += prose_differences(registry, prose_files(root), root)
    for path in prose_files(root):
        out += [Difference("(no claim)", str(path.relative_to(root)), found.split(" in: ")[0], "-")
                for found in unclaimed_numbers(path.read_text(), registry.parameters)]
    return out


def table(differences: list[Difference]) -> str:
    """The differences as an aligned text table (claim, where, stated, recomputed)."""
    rows = [("claim", "where", "stated", "recomputed")] + [(d.claim, d.where, d.stated, d.recomputed)
                                                           for d in differences]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)
