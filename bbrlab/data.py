"""Campaign directories -> tidy tables (pandas), cached as parquet.

A campaign directory holds one directory per run (``runs/<run_id>/`` and kept failures
``failed/<run_id>.a<N>/``; layout in docs/run-record.md). :func:`read_campaign` turns it into three
tidy tables, one observation per row:

- ``runs``: one row per run: every parameter, status, throughput from iperf3's receiver sum,
  retransmits, sender CPU, link utilisation (= throughput / rate), where and on what it ran;
- ``intervals``: one row per iperf3 reporting interval (summed over parallel streams);
- ``ss``: one row per ``ss`` sample and data connection (BBR's bw, gains, pacing/delivery rate, inflight).

Failed runs appear in ``runs`` with ``status = 'failed'`` and their ``reason``; only successful runs
contribute to ``intervals`` and ``ss`` (a failed attempt may share its run id with the later success).

Speed: each run's JSON is read once and only the needed keys are picked; rows are gathered in plain
lists and turned into a DataFrame once (never appended row by row); many runs are read by a process
pool. The result is written to ``DIR/tables/*.parquet`` together with a manifest of every run file's
size and modification time; the next call reuses the parquet files when nothing changed and re-reads
only the runs that did.

:func:`load` accepts a directory holding one campaign, several campaigns, or the paper authors'
published layout (see :mod:`bbrlab.authors`), and returns the concatenated tables.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .errors import BbrlabError

#: Bump when the table columns or their meaning change: older caches are then rebuilt.
TABLES_SCHEMA = "bbrlab.tables/3"

RUN_COLUMNS = (
    "run_id", "campaign", "status", "reason", "cca", "timeslice_ms", "cpu_share_pct", "rtt_ms", "rate_mbit",
    "buffer_bdp", "buffer_bytes", "loss_model", "loss_pct", "streams", "duration_s", "repetition",
    "throughput_mbit", "sender_throughput_mbit", "retransmits", "cpu_sender_pct", "link_utilisation",
    "ceiling_mbit", "accelerator", "hypervisor", "testbed_kind", "sender_kernel", "patched", "ss_sampled", "started_at", "source",
    "path",
)
INTERVAL_COLUMNS = ("run_id", "t_start_s", "t_end_s", "throughput_mbit", "retransmits")
SS_COLUMNS = (
    "run_id", "t_s", "port", "cca", "bw_mbit", "mrtt_ms", "pacing_gain", "cwnd_gain", "pacing_rate_mbit",
    "delivery_rate_mbit", "cwnd", "rtt_ms", "bytes_sent", "bytes_acked", "bytes_retrans", "unacked", "mss",
    "app_limited", "inflight_bytes", "bdp_bytes", "inflight_bdp",
)
#: Columns that identify one experimental point (everything but the repetition).
POINT_COLUMNS = ("source", "cca", "patched", "timeslice_ms", "cpu_share_pct", "rtt_ms", "rate_mbit",
                 "buffer_bdp", "loss_pct", "streams", "hypervisor", "sender_kernel")

#: Below this many runs a process pool costs more than it saves.
PARALLEL_MIN_RUNS = 400
RUN_FILES = ("record.json", "iperf.json", "ss.log")


@dataclass
class Tables:
    """The three tidy tables of one or more campaigns, plus notes on what could not be read."""

    runs: pd.DataFrame
    intervals: pd.DataFrame
    ss: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls) -> Tables:
        return cls(pd.DataFrame(columns=list(RUN_COLUMNS)), pd.DataFrame(columns=list(INTERVAL_COLUMNS)),
                   pd.DataFrame(columns=list(SS_COLUMNS)))

    def counts(self) -> dict[str, int]:
        return {"runs": len(self.runs), "ok": int((self.runs["status"] == "ok").sum()) if len(self.runs) else 0,
                "intervals": len(self.intervals), "ss": len(self.ss)}


@dataclass
class RunRows:
    """What one run directory contributes: its runs row and its interval and ss rows."""

    run: dict
    intervals: list[tuple]
    ss: list[dict]
    notes: list[str] = field(default_factory=list)


# -- one run ------------------------------------------------------------------------------------

def _get(d: Mapping | None, *keys, default=None):
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return default
        d = d[k]
    return d if d is not None else default


def _mbit(bits_per_second) -> float:
    return float(bits_per_second) / 1e6 if bits_per_second is not None else float("nan")


def iperf_summary(report: Mapping) -> dict:
    """Throughput (receiver sum), sender throughput, retransmits and sender CPU from iperf3 JSON.

    The client is the sender unless the test ran reversed (``-R``); the CPU figure is then the
    server's (remote) one.
    """
    end = report.get("end") or {}
    reverse = bool(_get(report, "start", "test_start", "reverse", default=0))
    received = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    cpu = end.get("cpu_utilization_percent") or {}
    return {
        "throughput_mbit": _mbit(received.get("bits_per_second")),
        "sender_throughput_mbit": _mbit(sent.get("bits_per_second")),
        "retransmits": sent.get("retransmits"),
        "cpu_sender_pct": cpu.get("remote_total" if reverse else "host_total"),
        "iperf_cca": end.get("sender_tcp_congestion"),
    }


def iperf_intervals(run_id: str, report: Mapping) -> list[tuple]:
    """One tuple per reporting interval, from the per-interval ``sum`` (all streams together)."""
    rows = []
    for interval in report.get("intervals") or ():
        s = interval.get("sum") or {}
        rows.append((run_id, s.get("start"), s.get("end"), _mbit(s.get("bits_per_second")), s.get("retransmits")))
    return rows


def _is_patched(cca: str | None, module: Mapping | None) -> bool:
    """A run used the paper's patch when its module carries a patch hash (or is named ``*2b``)."""
    if isinstance(module, Mapping) and module.get("patch_sha256"):
        return True
    return bool(cca) and cca.endswith("2b")


def run_row(record: Mapping, summary: Mapping, path: str) -> dict:
    """The ``runs`` row of one bbrlab record (scenario + metadata) and its iperf3 summary."""
    sc = record.get("scenario") or {}
    link, cont, flow = sc.get("link") or {}, sc.get("contention") or {}, sc.get("flow") or {}
    meta = record.get("metadata") or {}
    testbed = meta.get("testbed") or {}
    share = cont.get("cpu_share_pct")
    rate = link.get("rate_mbit")
    thr = summary.get("throughput_mbit", float("nan"))
    cca = flow.get("cca") or _get(meta, "cca", "requested")
    return {
        "run_id": record.get("run_id"), "campaign": record.get("campaign"), "status": record.get("status"),
        "reason": record.get("reason"), "cca": cca,
        "timeslice_ms": cont.get("timeslice_ms"), "cpu_share_pct": share,
        "rtt_ms": link.get("rtt_ms"), "rate_mbit": rate, "buffer_bdp": link.get("buffer_bdp"),
        "buffer_bytes": link.get("buffer_bytes"), "loss_model": link.get("loss_model", "none"),
        "loss_pct": link.get("loss_pct", 0.0), "streams": flow.get("streams"), "duration_s": flow.get("duration_s"),
        "repetition": sc.get("repetition"),
        "throughput_mbit": thr, "sender_throughput_mbit": summary.get("sender_throughput_mbit", float("nan")),
        "retransmits": summary.get("retransmits"), "cpu_sender_pct": summary.get("cpu_sender_pct"),
        "link_utilisation": thr / rate if rate else float("nan"),
        "ceiling_mbit": _get(meta, "ceiling", "value_mbit"),  # the sender's CPU ceiling (bbrlab.ceiling)
        "accelerator": testbed.get("accelerator"), "hypervisor": testbed.get("hypervisor"),
        "testbed_kind": testbed.get("kind"), "sender_kernel": testbed.get("sender_kernel"),
        "patched": _is_patched(cca, meta.get("module")), "ss_sampled": flow.get("sample_ss_ms") is not None,
        "started_at": record.get("started_at"),
        "source": "bbrlab", "path": path,
    }


def ss_rows(run_id: str, text: str, data_ports: set[int]) -> list[dict]:
    """ss samples of one run as ``ss`` rows, parsed by :func:`bbrlab.sampling.parse_ss_log`
    (imported only when a run has a log). Only iperf3's data connections are kept; ``t_s`` counts
    from the first sample (the sampler starts with the transfer). The parser derives inflight_bytes
    (sent - retransmitted - acked), bdp_bytes (BBR's bw x min RTT) and inflight_bdp.
    """
    from .sampling import parse_ss_log

    out = []
    for s in parse_ss_log(text, ports=sorted(data_ports) or None):
        row = {k: s.get(k) for k in SS_COLUMNS}
        row["run_id"] = run_id
        out.append(row)
    return out


def read_run(campaign_dir: Path, rel: str) -> RunRows:
    """Read one run directory (``rel`` relative to the campaign) into its table rows."""
    run_dir = campaign_dir / rel
    with open(run_dir / "record.json", "rb") as f:
        record = json.load(f)
    notes: list[str] = []
    report: dict = {}
    iperf_path = run_dir / "iperf.json"
    if iperf_path.exists():
        try:
            with open(iperf_path, "rb") as f:
                report = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            notes.append(f"{rel}/iperf.json unreadable: {e}")
    row = run_row(record, iperf_summary(report), rel)
    if row["status"] != "ok":
        return RunRows(row, [], [], notes)
    intervals = iperf_intervals(row["run_id"], report)
    ss: list[dict] = []
    ss_path = run_dir / "ss.log"
    if ss_path.exists():
        ports = {c.get("local_port") for c in _get(report, "start", "connected", default=[])} - {None}
        try:
            ss = ss_rows(row["run_id"], ss_path.read_text(), ports)
        except ImportError:
            notes.append("ss.log present but bbrlab.sampling is not available: ss table left empty")
        except Exception as e:  # noqa: BLE001 - a bad log must not stop the other runs; it is reported
            notes.append(f"{rel}/ss.log not parsed: {type(e).__name__}: {e}")
    return RunRows(row, intervals, ss, notes)


# -- many runs ----------------------------------------------------------------------------------

def discover_runs(campaign_dir: Path) -> list[str]:
    """Run directories (relative paths) under ``runs/`` and ``failed/``; ``.tmp/`` is never read."""
    out = []
    for sub in ("runs", "failed"):
        base = campaign_dir / sub
        if not base.is_dir():
            continue
        with os.scandir(base) as it:
            out.extend(f"{sub}/{e.name}" for e in it if e.is_dir() and not e.name.startswith("."))
    return sorted(out)


def run_signature(campaign_dir: Path, rel: str) -> list:
    """(name, size, mtime_ns) of each run file present: changes whenever a file does."""
    sig = []
    for name in RUN_FILES:
        try:
            st = os.stat(campaign_dir / rel / name)
        except FileNotFoundError:
            continue
        sig.append([name, st.st_size, st.st_mtime_ns])
    return sig


def _read_chunk(campaign_dir: str, rels: list[str]) -> list[RunRows]:
    base = Path(campaign_dir)
    return [_read_or_note(base, rel) for rel in rels]


def _read_or_note(base: Path, rel: str) -> RunRows | None:
    try:
        return read_run(base, rel)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        return RunRows({}, [], [], [f"{rel}: unreadable run ({e})"])


def read_runs(campaign_dir: Path, rels: list[str], workers: int | None = None) -> list[RunRows]:
    """Read many runs, in a process pool when there are enough of them to pay for it."""
    workers = workers if workers is not None else (os.cpu_count() or 1)
    if workers <= 1 or len(rels) < PARALLEL_MIN_RUNS:
        return _read_chunk(str(campaign_dir), rels)
    n_chunks = workers * 4
    chunks = [rels[i::n_chunks] for i in range(n_chunks) if rels[i::n_chunks]]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        parts = pool.map(_read_chunk, [str(campaign_dir)] * len(chunks), chunks)
        return [r for part in parts for r in part]


def build_tables(rows: Iterable[RunRows]) -> Tables:
    """Turn per-run rows into the three DataFrames in one go (no row-by-row appends)."""
    runs, intervals, ss, notes = [], [], [], []
    for r in rows:
        notes.extend(r.notes)
        if not r.run:
            continue
        runs.append(r.run)
        intervals.extend(r.intervals)
        ss.extend(r.ss)
    t = Tables(pd.DataFrame.from_records(runs, columns=list(RUN_COLUMNS)),
               pd.DataFrame.from_records(intervals, columns=list(INTERVAL_COLUMNS)),
               pd.DataFrame.from_records(ss, columns=list(SS_COLUMNS)), notes)
    return normalise(t)


_NUMERIC_RUN = ("timeslice_ms", "cpu_share_pct", "rtt_ms", "rate_mbit", "buffer_bdp", "buffer_bytes", "loss_pct",
                "streams", "duration_s", "repetition", "throughput_mbit", "sender_throughput_mbit", "retransmits",
                "cpu_sender_pct", "link_utilisation", "ceiling_mbit")


def normalise(t: Tables) -> Tables:
    """Give every column a stable dtype so parquet round-trips and concatenation behave."""
    for col in _NUMERIC_RUN:
        t.runs[col] = pd.to_numeric(t.runs[col], errors="coerce").astype("float64")
    for col in ("run_id", "campaign", "status", "reason", "cca", "loss_model", "accelerator", "hypervisor",
                "testbed_kind", "sender_kernel", "started_at", "source", "path"):
        t.runs[col] = t.runs[col].astype("string")
    t.runs["patched"] = t.runs["patched"].fillna(False).astype(bool)
    for col in INTERVAL_COLUMNS[1:]:
        t.intervals[col] = pd.to_numeric(t.intervals[col], errors="coerce").astype("float64")
    t.intervals["run_id"] = t.intervals["run_id"].astype("string")
    for col in SS_COLUMNS:
        if col in ("run_id", "cca"):
            t.ss[col] = t.ss[col].astype("string")
        elif col == "app_limited":
            t.ss[col] = t.ss[col].astype("boolean")
        else:
            t.ss[col] = pd.to_numeric(t.ss[col], errors="coerce").astype("float64")
    return t


# -- the parquet cache ------------------------------------------------------------------------

def _tables_dir(campaign_dir: Path) -> Path:
    return campaign_dir / "tables"


def _read_cache(campaign_dir: Path) -> tuple[dict, Tables] | None:
    tdir = _tables_dir(campaign_dir)
    try:
        manifest = json.loads((tdir / "manifest.json").read_text())
        if manifest.get("schema") != TABLES_SCHEMA:
            return None
        t = normalise(Tables(*(pd.read_parquet(tdir / f"{name}.parquet") for name in ("runs", "intervals", "ss"))))
        t.notes = list(manifest.get("notes", []))
        return manifest, t
    except (OSError, ValueError, KeyError):
        return None


def _write_cache(campaign_dir: Path, manifest: dict, t: Tables) -> None:
    """Write the parquet files, then the manifest: a reader trusts the files only via the manifest,
    which is removed first, so an interrupted write is rebuilt rather than half reused."""
    tdir = _tables_dir(campaign_dir)
    tdir.mkdir(exist_ok=True)
    (tdir / "manifest.json").unlink(missing_ok=True)
    for name in ("runs", "intervals", "ss"):
        getattr(t, name).to_parquet(tdir / f"{name}.parquet.tmp", index=False)
        os.replace(tdir / f"{name}.parquet.tmp", tdir / f"{name}.parquet")
    (tdir / "manifest.json.tmp").write_text(json.dumps({**manifest, "notes": t.notes}))
    os.replace(tdir / "manifest.json.tmp", tdir / "manifest.json")


@dataclass
class IngestResult:
    """Tables plus how they were obtained: runs re-read and runs reused from the cache."""

    tables: Tables
    read: int
    reused: int
    cached: bool


def ingest(campaign_dir: str | Path, *, force: bool = False, cache: bool = True,
           workers: int | None = None) -> IngestResult:
    """Read a bbrlab campaign directory, reusing ``tables/`` for every run that did not change."""
    campaign_dir = Path(campaign_dir)
    if not campaign_dir.is_dir():
        raise BbrlabError(f"{campaign_dir}: no such campaign directory")
    rels = discover_runs(campaign_dir)
    signatures = {rel: run_signature(campaign_dir, rel) for rel in rels}
    manifest = {"schema": TABLES_SCHEMA, "runs": signatures}
    cached = None if (force or not cache) else _read_cache(campaign_dir)
    if cached and cached[0].get("runs") == signatures:
        return IngestResult(cached[1], read=0, reused=len(rels), cached=True)
    keep: set[str] = set()
    if cached:
        old = cached[0].get("runs", {})
        keep = {rel for rel in rels if old.get(rel) == signatures[rel]}
    fresh = build_tables(read_runs(campaign_dir, [r for r in rels if r not in keep], workers))
    tables = _merge(cached[1], keep, fresh) if cached and keep else fresh
    if cache:
        try:
            _write_cache(campaign_dir, manifest, tables)
        except OSError as e:
            tables.notes.append(f"could not write the table cache under {campaign_dir}/tables: {e}")
    return IngestResult(tables, read=len(rels) - len(keep), reused=len(keep), cached=False)


def _merge(old: Tables, keep: set[str], fresh: Tables) -> Tables:
    runs_kept = old.runs[old.runs["path"].isin(keep)]
    ok_ids = set(runs_kept.loc[runs_kept["status"] == "ok", "run_id"])
    parts = [(runs_kept, fresh.runs), (old.intervals[old.intervals["run_id"].isin(ok_ids)], fresh.intervals),
             (old.ss[old.ss["run_id"].isin(ok_ids)], fresh.ss)]
    merged = [pd.concat([a, b], ignore_index=True) if len(a) else b for a, b in parts]
    return normalise(Tables(*merged, notes=fresh.notes))


def read_campaign(campaign_dir: str | Path, *, force: bool = False, cache: bool = True,
                  workers: int | None = None) -> Tables:
    """The tables of one bbrlab campaign directory (see :func:`ingest` for the cache)."""
    return ingest(campaign_dir, force=force, cache=cache, workers=workers).tables


# -- any data directory ------------------------------------------------------------------------

def is_campaign(path: Path) -> bool:
    return (path / "runs").is_dir() or (path / "failed").is_dir() or (path / "plan.json").is_file()


def find_sources(data_dir: str | Path) -> list[tuple[str, Path]]:
    """(kind, path) of every campaign (``bbrlab``) or authors' dataset (``authors``) in ``data_dir``:
    the directory itself, or its direct subdirectories."""
    from . import authors

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return []

    def kind_of(p: Path) -> str | None:
        if is_campaign(p):
            return "bbrlab"
        if authors.is_authors_layout(p):
            return "authors"
        return None

    own = kind_of(data_dir)
    if own:
        return [(own, data_dir)]
    return [(k, p) for p in sorted(data_dir.iterdir()) if p.is_dir() and (k := kind_of(p))]


def load(data_dir: str | Path, *, force: bool = False, cache: bool = True) -> Tables:
    """All tables under ``data_dir`` (bbrlab campaigns and authors' datasets), concatenated."""
    from . import authors

    sources = find_sources(data_dir)
    parts = [read_campaign(path, force=force, cache=cache) if kind == "bbrlab" else authors.read_authors(path)
             for kind, path in sources]
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

    return Tables(q(t.runs), q(t.intervals), q(t.ss), [*t.notes, f"run ids prefixed with {prefix}/ (shared ids)"])


def concat(parts: list[Tables]) -> Tables:
    """Concatenate tables of several sources (skipping empty frames to keep dtypes)."""
    def cat(name: str) -> pd.DataFrame:
        frames = [getattr(p, name) for p in parts if len(getattr(p, name))]
        return pd.concat(frames, ignore_index=True) if frames else getattr(parts[0], name)

    return normalise(Tables(cat("runs"), cat("intervals"), cat("ss"), [n for p in parts for n in p.notes]))


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
