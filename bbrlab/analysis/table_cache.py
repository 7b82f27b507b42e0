"""Read a data source once, then reuse its tables: parquet files plus a manifest of what was read.

A source is a folder in one :class:`Layout` (a bbrlab campaign, or an authors' dataset). Its *units*
are what is read as a whole: a bbrlab run directory, an authors' measurement point or socket log. The
tables are written to ``SOURCE/tables/{runs,intervals,ss,vcpu,bottleneck,streams,flows}.parquet`` with ``manifest.json``, which lists
each unit's files (size, mtime) and notes. The next read reuses the parquet files when nothing changed
and re-reads only the units that did; many units are read by a process pool.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bbrlab.core.errors import BbrlabError

from . import heap
from .tables import SCHEMAS, RunRows, Tables, build_tables, normalise

#: Bump when the table columns or their meaning change: older caches are then rebuilt.
TABLES_SCHEMA = "bbrlab.tables/20"
#: Below this many units a process pool costs more than it saves.
PARALLEL_MIN_UNITS = 400


@dataclass(frozen=True)
class Layout:
    """How one kind of source is read (module-level functions, so a process pool can pickle them).

    ``discover(dir) -> [unit]``, ``signature(dir, unit) -> list`` (changes when a file of the unit
    does), ``read_units(dir_str, [unit]) -> [(unit, [RunRows])]``, ``unit_of_path(path) -> unit``
    (which unit a ``runs`` row's ``path`` came from).
    """

    kind: str
    discover: Callable[[Path], list[str]]
    signature: Callable[[Path, str], list]
    read_units: Callable[[str, list[str]], list[tuple[str, list[RunRows]]]]
    unit_of_path: Callable[[str], str]


@dataclass
class IngestResult:
    """Tables plus how they were obtained: units re-read and units reused from the cache."""

    tables: Tables
    read: int
    reused: int
    cached: bool


def ingest(source_dir: str | Path, layout: Layout, *, force: bool = False, cache: bool = True,
           workers: int | None = None) -> IngestResult:
    """Read ``source_dir`` in ``layout``, reusing ``tables/`` for every unit that did not change."""
    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        raise BbrlabError(f"{source_dir}: no such directory")
    units = layout.discover(source_dir)
    signatures = {u: layout.signature(source_dir, u) for u in units}
    cached = None if (force or not cache) else _read_cache(source_dir, layout.kind)
    if cached and cached[0].get("units") == signatures:
        return IngestResult(_with_source(cached[1], layout, source_dir, 0, len(units)), 0, len(units), True)
    keep: set[str] = set()
    old_notes: dict[str, list[str]] = {}
    if cached:
        old = cached[0].get("units", {})
        keep = {u for u in units if old.get(u) == signatures[u]}
        old_notes = {u: n for u, n in cached[0].get("notes", {}).items() if u in keep}
    fresh_units = read_units(layout, source_dir, [u for u in units if u not in keep], workers)
    notes = dict(old_notes)
    for unit, rows in fresh_units:
        unit_notes = [n for r in rows for n in r.notes]
        if unit_notes:
            notes[unit] = unit_notes
    fresh = build_tables(r for _, rows in fresh_units for r in rows)
    del fresh_units
    heap.give_back()  # the runs' rows are in the tables now
    tables = _merge(cached[1], keep, fresh, layout) if cached and keep else fresh
    tables.notes = [n for u in sorted(notes) for n in notes[u]]
    if cache:
        manifest = {"schema": TABLES_SCHEMA, "layout": layout.kind, "units": signatures, "notes": notes}
        try:
            _write_cache(source_dir, manifest, tables)
        except OSError as e:
            tables.notes.append(f"could not write the table cache under {source_dir}/tables: {e}")
    read = len(units) - len(keep)
    return IngestResult(_with_source(tables, layout, source_dir, read, len(keep)), read, len(keep), False)


def _with_source(t: Tables, layout: Layout, path: Path, read: int, reused: int) -> Tables:
    t.sources = [{"kind": layout.kind, "path": str(path), "read": read, "reused": reused}]
    return t


def read_units(layout: Layout, source_dir: Path, units: list[str],
               workers: int | None = None) -> list[tuple[str, list[RunRows]]]:
    """Read many units, in a process pool when there are enough of them to pay for it."""
    workers = workers if workers is not None else (os.cpu_count() or 1)
    if workers <= 1 or len(units) < PARALLEL_MIN_UNITS:
        return layout.read_units(str(source_dir), units)
    n_chunks = workers * 4
    chunks = [units[i::n_chunks] for i in range(n_chunks) if units[i::n_chunks]]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        parts = pool.map(layout.read_units, [str(source_dir)] * len(chunks), chunks)
        return [r for part in parts for r in part]


def _merge(old: Tables, keep: set[str], fresh: Tables, layout: Layout) -> Tables:
    runs_kept = old.runs[old.runs["path"].map(layout.unit_of_path).isin(keep)]
    ok_ids = set(runs_kept.loc[runs_kept["status"] == "ok", "run_id"])
    parts = {name: (runs_kept if name == "runs" else old_df[old_df["run_id"].isin(ok_ids)], getattr(fresh, name))
             for name, old_df in old.frames().items()}
    merged = {name: pd.concat([a, b], ignore_index=True) if len(a) and len(b) else (a if len(a) else b)
              for name, (a, b) in parts.items()}
    return normalise(Tables.of_frames(merged, [], []))


def _tables_dir(source_dir: Path) -> Path:
    return source_dir / "tables"


def _read_cache(source_dir: Path, kind: str) -> tuple[dict, Tables] | None:
    tdir = _tables_dir(source_dir)
    try:
        manifest = json.loads((tdir / "manifest.json").read_text())
        if manifest.get("schema") != TABLES_SCHEMA or manifest.get("layout") != kind:
            return None
        t = normalise(Tables.of_frames({name: pd.read_parquet(tdir / f"{name}.parquet") for name in SCHEMAS}, [], []))
        t.notes = [n for u in sorted(manifest.get("notes", {})) for n in manifest["notes"][u]]
        return manifest, t
    except (OSError, ValueError, KeyError, TypeError):
        return None


#: Rows converted to Arrow and written at a time: a large table is never copied whole into Arrow's memory.
PARQUET_SLICE_ROWS = 1 << 16


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as a parquet file (no index), :data:`PARQUET_SLICE_ROWS` rows at a time; it reads back as
    ``to_parquet`` would have written it."""
    if len(frame) <= PARQUET_SLICE_ROWS:
        frame.to_parquet(path, index=False)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = pa.Table.from_pandas(frame.iloc[:PARQUET_SLICE_ROWS], preserve_index=False)
    with pq.ParquetWriter(path, first.schema) as writer:
        writer.write_table(first)
        del first
        for lo in range(PARQUET_SLICE_ROWS, len(frame), PARQUET_SLICE_ROWS):
            writer.write_table(pa.Table.from_pandas(frame.iloc[lo:lo + PARQUET_SLICE_ROWS], schema=writer.schema,
                                                    preserve_index=False))


def _write_cache(source_dir: Path, manifest: dict, t: Tables) -> None:
    """Write the parquet files, then the manifest: a reader trusts the files only via the manifest,
    which is removed first, so an interrupted write is rebuilt rather than half reused."""
    tdir = _tables_dir(source_dir)
    tdir.mkdir(exist_ok=True)
    (tdir / "manifest.json").unlink(missing_ok=True)
    for name in SCHEMAS:
        _write_parquet(getattr(t, name), tdir / f"{name}.parquet.tmp")
        heap.give_back()  # the Arrow copy of the table is written
        os.replace(tdir / f"{name}.parquet.tmp", tdir / f"{name}.parquet")
    (tdir / "manifest.json.tmp").write_text(json.dumps(manifest))
    os.replace(tdir / "manifest.json.tmp", tdir / "manifest.json")
