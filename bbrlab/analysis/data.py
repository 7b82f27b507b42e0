"""Data for notebooks and the CLI: load any data directory into tidy tables, select runs, summarise.

The notebook-facing API (every function has a numpy-style docstring; ``docs/api.md`` lists them):

- :func:`load` is the one way in: a data directory -> :class:`Tables` (``runs``, ``intervals``, ``ss``,
  ``notes``). It accepts one bbrlab campaign, a folder of campaigns, the paper authors' published dataset
  (:mod:`bbrlab.analysis.authors`), or a folder of these; each source is cached as parquet under
  ``SOURCE/tables/`` and re-read only where its files changed (:mod:`bbrlab.analysis.table_cache`).
- :func:`select` takes :class:`Tables` and returns :class:`Tables`: strict (a value the data lacks gives
  an empty selection, never "everything"), and its ``notes`` say what it left out. Throughput figures
  leave ss-sampled runs out with ``select(tables, ss_sampled=False)``: sampling costs the sender CPU.
- :func:`summarise` and :func:`check_dimensions` summarise and check a selection;
  :func:`transfer_outcomes` counts rsync copies that completed and timed out.

Columns, units and dtypes are declared in :mod:`bbrlab.analysis.tables`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bbrlab.core.errors import BbrlabError
from bbrlab.scenario.workloads import RsyncParams

from . import authors, records_reader, runkey
from .stats import BlockedInterval, blocked_median_interval, median_interval
from .table_cache import Layout
from .table_cache import ingest as _ingest
from .tables import INTERVAL_COLUMNS, POINT_COLUMNS, RUN_COLUMNS, SS_COLUMNS, Tables, concat  # noqa: F401 - the tables' API, re-exported for notebooks

LAYOUTS: dict[str, Layout] = {"bbrlab": records_reader.LAYOUT, "authors": authors.LAYOUT}


def _layout_of(path: Path) -> str | None:
    if records_reader.is_campaign(path):
        return "bbrlab"
    if authors.is_authors_layout(path):
        return "authors"
    return None


def find_sources(data_dir: str | Path) -> list[tuple[str, Path]]:
    """The data sources in a directory: the directory itself, or its direct subdirectories.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        A bbrlab campaign, an authors' dataset, or a folder holding several of them.

    Returns
    -------
    list of (str, pathlib.Path)
        ``("bbrlab", path)`` for a campaign, ``("authors", path)`` for an authors' dataset.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return []
    own = _layout_of(data_dir)
    if own:
        return [(own, data_dir)]
    return [(k, p) for p in sorted(data_dir.iterdir()) if p.is_dir() and (k := _layout_of(p))]


def load(data_dir: str | Path, *, force: bool = False, cache: bool = True, workers: int | None = None) -> Tables:
    """Every run under ``data_dir`` as tidy tables: the one way to read data.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        A bbrlab campaign (``runs/``, ``failed/``, ``plan.json``), the paper authors' dataset
        (``<stamp>/meta.json``, ``socket_data/``), or a folder holding several of these.
    force : bool, default False
        Re-read every file even where the cache under ``SOURCE/tables/`` is current.
    cache : bool, default True
        Read and write that cache (False: read everything, write nothing).
    workers : int, optional
        Processes for reading many runs (default: one per CPU).

    Returns
    -------
    Tables
        ``runs`` (one row per run, failed and excluded runs included with their ``reason``),
        ``intervals`` and ``ss`` (of runs with status ok), ``notes`` (what each source left out and why),
        ``sources`` (per source: kind, path, units read now and reused from the cache). Empty tables
        when ``data_dir`` holds no source.

    Examples
    --------
    >>> from bbrlab.analysis import data
    >>> tables = data.load("data")                                  # doctest: +SKIP
    >>> tables.runs.groupby("variant")["throughput_mbit"].median()  # doctest: +SKIP
    """
    sources = find_sources(data_dir)
    parts = [_ingest(path, LAYOUTS[kind], force=force, cache=cache, workers=workers).tables for kind, path in sources]
    if not parts:
        return Tables.empty()
    if _ids_collide(parts):
        parts = [_qualify_run_ids(t, path.name) for t, (_, path) in zip(parts, sources, strict=True)]
    return concat(parts)


def _ids_collide(parts: list[Tables]) -> bool:
    """Run ids are hashes of the scenario, so two campaigns with the same grid share them."""
    seen: set[str] = set()
    for t in parts:
        ids = set(t.runs.loc[t.runs["status"] == "ok", "run_id"].dropna())
        if ids & seen:
            return True
        seen |= ids
    return False


def _qualify_run_ids(t: Tables, prefix: str) -> Tables:
    """Prefix every run id with ``<prefix>/`` so runs of different sources stay apart after concat."""
    def q(df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(run_id=prefix + "/" + df["run_id"].astype("string")) if len(df) else df

    return Tables.of_frames({name: q(df) for name, df in t.frames().items()},
                            [*t.notes, f"run ids prefixed with {prefix}/ (shared ids)"], t.sources)


# -- selections and summaries ------------------------------------------------------------------

def _values(want) -> list:
    return list(want) if isinstance(want, list | tuple | set | frozenset) else [want]


def _shown(values) -> str:
    return "[" + ", ".join(f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)
                           for v in values) + "]"


def select(tables: Tables, filters: Mapping[str, object] | None = None, /, *, ok_only: bool = True,
           vary: Sequence[str] | None = None, **columns) -> Tables:
    """The runs whose columns have the wanted values; intervals and ss follow. Strict, and says so.

    A value the data does not have gives an EMPTY selection with a note naming what the data has; it
    never falls back to every run. Each condition that leaves runs out adds a note saying which.

    Parameters
    ----------
    tables : Tables
        What to select from (e.g. what :func:`load` returned).
    filters : mapping, optional
        ``{column: value or list of values}``, e.g. a notebook's ``filters`` parameter.
    ok_only : bool, default True
        Keep only runs with status ``ok`` (failed and excluded runs have no throughput to plot).
    vary : sequence of str, optional
        The columns the caller compares over (e.g. ``["variant", "cpu_share_pct"]``): a note then names every
        column of the run-identity key (:data:`bbrlab.analysis.runkey.RUN_KEY`) on which the selected runs of one
        combination of them still differ, i.e. what else must be selected on (or split by) so that each point
        is one condition.
    **columns
        More conditions, ``column=value`` or ``column=[values]``; ``None`` means any value.

    Returns
    -------
    Tables
        The selected runs and their intervals and ss rows; ``notes`` are this selection's own.

    Raises
    ------
    BbrlabError
        A column that the tables do not have (the message lists the columns).

    Examples
    --------
    >>> sel = data.select(tables, {"variant": ["BBRv3", "BBRv3 patched"]}, rate_mbit=100)  # doctest: +SKIP
    >>> sel.notes                                                                          # doctest: +SKIP
    ['rate_mbit in [100]: kept 96 of 120 runs (left out rate_mbit [50])']
    """
    runs = tables.runs
    notes: list[str] = []
    if ok_only and len(runs):
        ok = runs["status"] == "ok"
        if not ok.all():
            counts = runs.loc[~ok, "status"].value_counts().to_dict()
            notes.append("left out runs that are not ok: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        runs = runs[ok]
    for col, want in {**(filters or {}), **columns}.items():
        if col not in runs.columns:
            raise BbrlabError(f"select: no column {col!r}; columns: {', '.join(runs.columns)}")
        if want is None:
            continue
        if runs.empty:  # an earlier condition emptied it; that note says why
            continue
        values = _values(want)
        match = runs[col].isin(values).fillna(False).astype(bool)
        if not match.any():
            have = sorted(runs[col].dropna().unique().tolist())
            notes.append(f"no runs with {col} in {_shown(values)} (the data has {_shown(have) if have else 'none'})"
                         ": the selection is empty")
        elif not match.all():
            other = sorted(runs.loc[~match, col].dropna().unique().tolist())
            missing = int(runs.loc[~match, col].isna().sum())
            left = (_shown(other) if other else "") + (f"{' and ' if other else ''}{missing} without a value"
                                                       if missing else "")
            notes.append(f"{col} in {_shown(values)}: kept {int(match.sum())} of {len(runs)} runs (left out {col} "
                         f"{left})")
        runs = runs[match]
    if vary is not None and len(runs):
        notes += conditions_note(runs, list(vary))
    return tables.with_runs(runs, notes)


def conditions_note(runs: pd.DataFrame, vary: list[str]) -> list[str]:
    """A note naming the key columns on which runs of one combination of ``vary`` differ (empty when none do)."""
    mixed = runkey.mixed(runs, vary)
    if not mixed:
        return []
    parts = [f"{col} {_shown(sorted(runkey.identity(runs)[col].dropna().unique().tolist()))}" for col in mixed]
    return [f"runs of one {' x '.join(vary)} differ in {', '.join(parts)}: more than one condition per point "
            "(select on them, or figures draw a line per condition)"]


def sweeps(tables: Tables, column: str, at_least: int = 2) -> Tables:
    """The runs of the campaigns that vary ``column`` over ``at_least`` values or more.

    A sweep figure (e.g. goodput vs loss) read from a folder of campaigns should not mix in campaigns that
    hold the column fixed (the demo's lossless grid beside a loss sweep); this keeps the sweeping ones and
    says which campaigns were left out.

    Parameters
    ----------
    tables : Tables
        A selection.
    column : str
        The swept column, e.g. ``"loss_pct"``.
    at_least : int, default 2
        Distinct values a campaign needs in ``column`` to count as sweeping it.

    Returns
    -------
    Tables
        The sweeping campaigns' runs; ``notes`` name the campaigns left out.

    Examples
    --------
    >>> swept = data.sweeps(data.load("data"), "loss_pct")  # doctest: +SKIP
    >>> swept.notes                                          # doctest: +SKIP
    ["campaigns that do not vary loss_pct left out: demo, demo-sampled"]
    """
    runs = tables.runs
    for col in (column, "campaign"):
        if col not in runs.columns:
            raise BbrlabError(f"sweeps: no column {col!r}; columns: {', '.join(runs.columns)}")
    counts = runs.groupby("campaign", dropna=False)[column].nunique()
    fixed = sorted(str(c) for c, n in counts.items() if n < at_least)
    keep = runs["campaign"].isin(counts[counts >= at_least].index)
    notes = [f"campaigns that do not vary {column} left out: {', '.join(fixed)}"] if fixed else []
    return tables.with_runs(runs[keep], notes)


def summarise(runs: pd.DataFrame, by: Sequence[str], value: str = "throughput_mbit") -> pd.DataFrame:
    """Statistics of ``value`` over the repetitions of each group.

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table (``tables.runs``).
    by : sequence of str
        Grouping columns (those absent from ``runs`` are ignored); missing values form their own group.
    value : str, default "throughput_mbit"

    Returns
    -------
    pandas.DataFrame
        One row per group: the ``by`` columns, ``n``, ``median``, ``ci_low`` and ``ci_high`` (the
        order-statistic confidence interval of the median, :func:`bbrlab.analysis.stats.median_interval`; NaN
        for a single run), ``ci_level`` (the coverage that interval reaches: 95 % or more from 6 runs, 50 % at
        2), ``unit`` (``block`` where every run of the group carries a block and there are two or more: the
        interval is then over the blocks' medians and its level counts blocks,
        :func:`bbrlab.core.confidence.blocked_median_interval`; else ``run``), ``blocks`` (how many), the spread
        ``within_block_sd`` (pooled within the blocks) and ``between_block_sd`` (of the blocks' medians), NaN
        without blocks, ``q25``, ``q75`` (the interquartile range), ``mean``, ``std`` (sample standard deviation).

    Examples
    --------
    >>> data.summarise(tables.runs, ["variant", "cpu_share_pct"])  # doctest: +SKIP
    """
    cols = [c for c in by if c in runs.columns]
    if runs.empty:
        return pd.DataFrame(columns=[*cols, *SUMMARY_COLUMNS])
    g = runs.groupby(cols, dropna=False, observed=True)[value]
    units = block_units(runs)
    ci = runs.assign(_unit=units).groupby(cols, dropna=False, observed=True)[[value, "_unit"]].apply(
        lambda part: _interval(part[value].to_numpy(dtype=float), part["_unit"]))
    out = pd.DataFrame({"n": g.count(), "median": g.median(), "ci_low": ci.map(lambda b: b.interval.low),
                        "ci_high": ci.map(lambda b: b.interval.high), "ci_level": ci.map(lambda b: b.interval.level),
                        "unit": ci.map(lambda b: b.unit),
                        "blocks": ci.map(lambda b: b.interval.n if b.unit == "block" else pd.NA).astype("Int64"),
                        "within_block_sd": ci.map(lambda b: b.within_sd), "between_block_sd": ci.map(lambda b: b.between_sd),
                        "q25": g.quantile(0.25), "q75": g.quantile(0.75), "mean": g.mean(), "std": g.std()})
    return out.reset_index()


def block_units(runs: pd.DataFrame) -> pd.Series:
    """Each run's unit of replication where the run carries a block (a campaign with ``blocks``: each block ran
    on a boot of its own): its campaign, block and sender boot (``"demo/1/<boot id>"``), else <NA> (the run is its
    own unit). The boot is part of it because two recordings of one spec share the campaign's name and block
    numbers (data/demo and data/demo-second): their block 0s ran on two boots, two units."""
    if "block" not in runs.columns:
        return pd.Series(pd.NA, index=runs.index, dtype="string")
    campaign = runs["campaign"].astype("string") if "campaign" in runs.columns else pd.Series("", index=runs.index)
    units = campaign.fillna("") + "/" + runs["block"].astype("string")
    if "sender_boot_id" in runs.columns:
        units = units + "/" + runs["sender_boot_id"].astype("string").fillna("")
    return units.where(runs["block"].notna())


def _spans_blocks(units: pd.Series) -> bool:
    """Whether a group's runs are replicated in blocks: every run carries a block, and there are two or more."""
    return bool(units.notna().all() and units.nunique() > 1)


def replication_values(runs: pd.DataFrame, value: str = "throughput_mbit") -> tuple[np.ndarray, str]:
    """A group's values at its unit of replication and the unit's name: each block's median (``block``; a block
    whose runs all lack the value is left out) when its runs span blocks (:func:`block_units`), else each run's
    value (``run``). The one rule :func:`summarise`, ``bbrlab compare`` and the patch comparison share."""
    units = block_units(runs)
    if _spans_blocks(units):
        return runs[value].astype(float).groupby(units).median().dropna().to_numpy(dtype=float), "block"
    return runs[value].to_numpy(dtype=float), "run"


def _interval(values: np.ndarray, units: pd.Series) -> BlockedInterval:
    """A group's interval: over its blocks' medians when every run of it carries a block and there are two
    blocks or more; else over its runs (unit ``run``, no spreads)."""
    if _spans_blocks(units):
        return blocked_median_interval(values, units.to_numpy())
    return BlockedInterval(median_interval(values), len(values), math.nan, math.nan, unit="run")


#: The statistics :func:`summarise` gives per group, in order.
SUMMARY_COLUMNS = ("n", "median", "ci_low", "ci_high", "ci_level", "unit", "blocks", "within_block_sd",
                   "between_block_sd", "q25", "q75", "mean", "std")


def check_dimensions(tables: Tables, varies: Mapping[str, int] | None = None,
                     fixed: Sequence[str] = ()) -> list[str]:
    """Notes on what a figure needs and the selection lacks.

    Parameters
    ----------
    tables : Tables
        A selection.
    varies : mapping of str to int, optional
        Columns the figure varies and how many distinct values it needs at least (e.g. a sweep).
    fixed : sequence of str
        Columns the figure assumes constant: more than one value in the selection gets a note.

    Returns
    -------
    list of str
        One note per unmet need (empty when the selection fits the figure).

    Examples
    --------
    >>> data.check_dimensions(sel, varies={"cpu_share_pct": 2}, fixed=["rtt_ms"])  # doctest: +SKIP
    ['rtt_ms: the figure assumes one value, the selection has [10, 20]']
    """
    runs = tables.runs
    notes = []
    for col, at_least in (varies or {}).items():
        have = sorted(runs[col].dropna().unique().tolist()) if col in runs.columns else []
        if len(have) < at_least:
            notes.append(f"{col}: the figure varies it over {at_least}+ values, the data has "
                         f"{_shown(have) if have else 'none'}")
    for col in fixed:
        have = sorted(runs[col].dropna().unique().tolist()) if col in runs.columns else []
        if len(have) > 1:
            notes.append(f"{col}: the figure assumes one value, the selection has {_shown(have)}")
    return notes


def transfer_outcomes(tables: Tables, by: Sequence[str] = ("variant", "cpu_share_pct", "loss_pct")) -> pd.DataFrame:
    """rsync copies per group: how many, how many completed and timed out, median goodput and completion time.

    Parameters
    ----------
    tables : Tables
        A selection; runs of other workloads are left out.
    by : sequence of str, default ("variant", "cpu_share_pct", "loss_pct")
        Grouping columns (those absent are ignored).

    Returns
    -------
    pandas.DataFrame
        One row per group: the ``by`` columns, ``copies``, ``completed``, ``timed_out``,
        ``goodput_mbit_median``, ``completion_s_median`` (over the completed copies),
        ``bytes_delivered_median``.

    Examples
    --------
    >>> data.transfer_outcomes(data.select(tables, workload="rsync"))  # doctest: +SKIP
    """
    runs = tables.runs
    copies = runs[runs["workload"] == RsyncParams.name]
    cols = [c for c in by if c in copies.columns]
    columns = [*cols, "copies", "completed", "timed_out", "goodput_mbit_median", "completion_s_median",
               "bytes_delivered_median"]
    if copies.empty:
        return pd.DataFrame(columns=columns)
    late = copies["timed_out"].fillna(False).astype(bool)
    g = copies.assign(timed_out=late, completed=copies["completion_s"].notna()).groupby(cols, dropna=False,
                                                                                       observed=True)
    out = pd.DataFrame({"copies": g.size(), "completed": g["completed"].sum(), "timed_out": g["timed_out"].sum(),
                        "goodput_mbit_median": g["goodput_mbit"].median(),
                        "completion_s_median": g["completion_s"].median(),
                        "bytes_delivered_median": g["bytes_delivered"].median()})
    return out.reset_index()[columns]
