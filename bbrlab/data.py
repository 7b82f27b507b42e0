"""Data directories -> tidy tables (pandas), for notebooks and the CLI.

:func:`load` accepts a directory holding one bbrlab campaign, several campaigns, or the paper authors'
published dataset (see :mod:`bbrlab.authors`), or a folder of these, and returns their :class:`Tables`
concatenated: ``runs`` (one row per run), ``intervals`` (one row per iperf3 interval) and ``ss`` (one
row per socket-state sample); the columns, units and dtypes are in :mod:`bbrlab.tables`. Each source is
cached as parquet under ``SOURCE/tables/`` and re-read only where its files changed
(:mod:`bbrlab.table_cache`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from . import authors, records_reader
from .errors import BbrlabError
from .records_reader import iperf_intervals, iperf_summary, is_campaign, run_row  # noqa: F401 - API
from .table_cache import IngestResult, Layout
from .table_cache import ingest as _ingest
from .tables import (  # noqa: F401 - the tables' API, re-exported for notebooks
    INTERVAL_COLUMNS,
    POINT_COLUMNS,
    RUN_COLUMNS,
    SS_COLUMNS,
    RunRows,
    Tables,
    build_tables,
    concat,
    normalise,
)

LAYOUTS: dict[str, Layout] = {"bbrlab": records_reader.LAYOUT, "authors": authors.LAYOUT}


def layout_of(path: Path) -> str | None:
    """``"bbrlab"`` for a campaign directory, ``"authors"`` for the authors' layout, else None."""
    if is_campaign(path):
        return "bbrlab"
    if authors.is_authors_layout(path):
        return "authors"
    return None


def ingest(source_dir: str | Path, *, force: bool = False, cache: bool = True,
           workers: int | None = None) -> IngestResult:
    """Read one source (a campaign or an authors' dataset), reusing its cache where nothing changed."""
    source_dir = Path(source_dir)
    kind = layout_of(source_dir) if source_dir.is_dir() else None
    if kind is None:
        raise BbrlabError(f"{source_dir}: no such campaign or authors' dataset")
    return _ingest(source_dir, LAYOUTS[kind], force=force, cache=cache, workers=workers)


def read_campaign(campaign_dir: str | Path, *, force: bool = False, cache: bool = True,
                  workers: int | None = None) -> Tables:
    """The tables of one source (see :func:`ingest`)."""
    return ingest(campaign_dir, force=force, cache=cache, workers=workers).tables


def find_sources(data_dir: str | Path) -> list[tuple[str, Path]]:
    """(kind, path) of every campaign (``bbrlab``) or authors' dataset (``authors``) in ``data_dir``:
    the directory itself, or its direct subdirectories."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return []
    own = layout_of(data_dir)
    if own:
        return [(own, data_dir)]
    return [(k, p) for p in sorted(data_dir.iterdir()) if p.is_dir() and (k := layout_of(p))]


def load(data_dir: str | Path, *, force: bool = False, cache: bool = True, workers: int | None = None) -> Tables:
    """All tables under ``data_dir`` (bbrlab campaigns and authors' datasets), concatenated."""
    sources = find_sources(data_dir)
    parts = [ingest(path, force=force, cache=cache, workers=workers).tables for _, path in sources]
    if not parts:
        return Tables.empty()
    if _ids_collide(parts):
        parts = [qualify_run_ids(t, path.name) for t, (_, path) in zip(parts, sources, strict=True)]
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


def qualify_run_ids(t: Tables, prefix: str) -> Tables:
    """Prefix every run id with ``<prefix>/`` so runs of different sources stay apart after concat."""
    def q(df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(run_id=prefix + "/" + df["run_id"].astype("string")) if len(df) else df

    return Tables(q(t.runs), q(t.intervals), q(t.ss), [*t.notes, f"run ids prefixed with {prefix}/ (shared ids)"],
                  t.sources)


# -- selections and summaries ------------------------------------------------------------------

def apply_filters(t: Tables, filters: Mapping[str, object] | None, *, ok_only: bool = True) -> Tables:
    """Keep runs whose columns match ``filters`` ({column: value or list of values}); intervals and
    ss follow the kept runs. Unknown columns raise, naming the columns that exist."""
    runs = t.runs
    if ok_only and len(runs):
        runs = runs[runs["status"] == "ok"]
    for col, wanted in (filters or {}).items():
        if col not in runs.columns:
            raise BbrlabError(f"filter on unknown column {col!r}; columns: {', '.join(runs.columns)}")
        values = list(wanted) if isinstance(wanted, list | tuple | set) else [wanted]
        runs = runs[runs[col].isin(values)]
    ids = set(runs["run_id"])
    return Tables(runs, t.intervals[t.intervals["run_id"].isin(ids)], t.ss[t.ss["run_id"].isin(ids)], t.notes)


def summarise(runs: pd.DataFrame, by: list[str], value: str = "throughput_mbit") -> pd.DataFrame:
    """Per group: n, median, 25th/75th percentile, mean and sample std of ``value`` over repetitions."""
    cols = [c for c in by if c in runs.columns]
    if runs.empty:
        return pd.DataFrame(columns=[*cols, "n", "median", "q25", "q75", "mean", "std"])
    g = runs.groupby(cols, dropna=False, observed=True)[value]
    out = pd.DataFrame({"n": g.count(), "median": g.median(), "q25": g.quantile(0.25), "q75": g.quantile(0.75),
                        "mean": g.mean(), "std": g.std()})
    return out.reset_index()


def select(runs: pd.DataFrame, **wanted) -> tuple[pd.DataFrame, list[str]]:
    """Keep runs whose column equals the wanted value (or is in the wanted list), one column at a time.

    When the data has none of the wanted values for a column, that column is left unfiltered and a
    note says what was asked and what the data has, so a figure still renders what exists.
    """
    notes = []
    for col, want in wanted.items():
        if want is None:
            continue
        values = list(want) if isinstance(want, list | tuple | set) else [want]
        if col not in runs.columns or runs[col].isna().all():
            notes.append(f"the data does not record {col}; wanted {values}, using every run")
            continue
        hit = runs[runs[col].isin(values)]
        if hit.empty:
            have = sorted(runs[col].dropna().unique().tolist())
            notes.append(f"no runs with {col} in {values} (the data has {have}); using every value")
            continue
        runs = hit
    return runs, notes


def unsampled(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Runs measured without ss sampling, for throughput figures: sampling costs CPU on the contended
    sender, so (as in the paper) sampled runs are kept apart. When only sampled runs exist they are used,
    with a note saying so."""
    if "ss_sampled" not in runs.columns or runs.empty:
        return runs, []
    sampled = runs["ss_sampled"].fillna(False).astype(bool)
    if sampled.all():
        return runs, ["only ss-sampled runs in the data: their throughput includes the sampler's CPU cost"]
    if sampled.any():
        return runs[~sampled], [f"left out {int(sampled.sum())} ss-sampled runs (sampling costs the sender CPU)"]
    return runs, []


def missing_dimensions(runs: pd.DataFrame, needs: Mapping[str, int]) -> list[str]:
    """Notes for each column that has fewer distinct values than a figure needs (e.g. a sweep)."""
    notes = []
    for col, at_least in needs.items():
        have = sorted(runs[col].dropna().unique().tolist()) if col in runs.columns else []
        if len(have) < at_least:
            notes.append(f"{col}: the figure varies it over {at_least}+ values, the data has {have or 'none'}")
    return notes
