"""bbrlab run directories -> table rows.

A campaign directory holds one directory per run (``runs/<run_id>/`` and kept failures
``failed/<run_id>.a<N>/``; layout in docs/run-record.md). Each run's ``record.json`` and ``iperf.json``
are read once and only the needed keys are picked; ``ss.log`` (runs sampled by the ss loop) is parsed by
:mod:`bbrlab.sampling.sampler`, ``samples.log`` (the netlink or BPF sampler) by :mod:`bbrlab.sampling.sockdiag`, into the same
rows; an rsync run's ``transfer.json`` gives its progress series as intervals. The ``runs`` row is built column by column from :data:`bbrlab.analysis.tables.RUN_SCHEMA`.

Failed runs appear in ``runs`` with ``status = 'failed'`` and their ``reason``; only successful runs
contribute to ``intervals`` and ``ss`` (a failed attempt may share its run id with the later success).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

import pandas as pd

from bbrlab.run import clocks
from bbrlab.run.flowrecord import FlowOutcome
from bbrlab.run.runmeta import RunMetadata
from bbrlab.run.runrecord import metadata_of, scenario_of
from bbrlab.run.transferrecord import TransferSummary
from bbrlab.sampling import bottleneck, logscan, sockdiag
from bbrlab.sampling.ss import parse_ss_log
from bbrlab.scenario.scenario import Flow
from bbrlab.scenario.workloads import IperfParams, RsyncParams

from . import evidence, fairness, heap, identity
from .columns import VCPU_SCHEMA
from .frames import typed_frame
from .preallocated import Preallocated
from .streams import FlowReport, flow_summary, stream_rows
from .table_cache import Layout
from .tables import RUN_SCHEMA, SS_COLUMNS, SS_SCHEMA, RunRows

RUN_FILES = ("record.json", "iperf.json", "ss.log", "samples.log", "transfer.json", "bottleneck.log")


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
        "mean_rtt_ms": _mean_rtt_ms(end),
    }


def _mean_rtt_ms(end: Mapping) -> float | None:
    """The sender's smoothed RTT averaged over the transfer, in ms: iperf3's per-stream ``mean_rtt`` (in
    microseconds), averaged over the streams; None when iperf3 reported none (a reversed or UDP test)."""
    rtts = [_get(s, "sender", "mean_rtt") for s in end.get("streams") or ()]
    rtts = [r for r in rtts if isinstance(r, (int, float)) and r > 0]
    return sum(rtts) / len(rtts) / 1000 if rtts else None


def iperf_intervals(run_id: str, report: Mapping) -> list[tuple]:
    """One tuple per reporting interval, from the per-interval ``sum`` (all streams together)."""
    rows = []
    for interval in report.get("intervals") or ():
        s = interval.get("sum") or {}
        rows.append((run_id, s.get("start"), s.get("end"), _mbit(s.get("bits_per_second")), s.get("retransmits")))
    return rows


class RunView:
    """One bbrlab record and its iperf3 summary, with the parts the column readers use: ``meta`` is the record's
    :class:`~bbrlab.run.runmeta.RunMetadata` (typed and upgraded; a part in a form older than its type is left
    out, its columns missing), ``scenario`` its :class:`~bbrlab.scenario.scenario.Scenario` and ``link``, ``cont``,
    ``flow`` that scenario's parts (a scenario that does not read typed makes the run unreadable)."""

    def __init__(self, record: Mapping, summary: Mapping, path: str, fair: Mapping | None = None,
                 samples_span_s: float | None = None, meta: RunMetadata | None = None):
        self.record, self.summary, self.path = record, summary, path
        self.samples_span_s = samples_span_s  # from the ss rows (bbrlab.analysis.evidence.samples_span_s)
        self.fair = fair or {}  # bbrlab.analysis.fairness.run_fairness's run part
        self.scenario = scenario_of(record)  # typed (bbrlab.run.runrecord), as the record says the run had it
        self.link, self.cont, self.flow = self.scenario.link, self.scenario.contention, self.scenario.flow
        # typed, upgraded (bbrlab.run.runrecord); given when the caller has typed it already
        self.meta = metadata_of(record, drop_unreadable=True) if meta is None else meta
        self.testbed = self.meta.testbed

    @cached_property
    def identity(self) -> identity.Identity:
        """The run's congestion-control identity (CCA, BBR version, patched, kernel, variant), read once."""
        return identity.from_record(self.scenario, self.meta)

    @property
    def workload(self) -> str:
        """``iperf3`` or ``rsync`` (records older than the transfer workload: ``iperf3``)."""
        return self.flow.workload

    @property
    def transfer(self) -> TransferSummary | None:
        """``metadata.transfer`` of an rsync run (docs/transfer.md); None for iperf3."""
        return self.meta.transfer

    @property
    def goodput_mbit(self) -> float | None:
        """Goodput in Mbit/s: iperf3's receiver throughput, or an rsync copy's bytes over its wall time; None
        when unknown.
        """
        if self.workload == IperfParams.name:
            return self.summary.get("throughput_mbit")
        return self.transfer.goodput_mbit if self.transfer else None

    @property
    def utilisation(self) -> float:
        """Throughput over the link rate (0..1, a fraction); NaN without a rate or a throughput."""
        rate = self.link.rate_mbit
        return self.summary.get("throughput_mbit", float("nan")) / rate if rate else float("nan")

    @property
    def transfer_s(self) -> float | None:
        """How long the transfer lasted: iperf3's asked duration, an rsync copy's wall time; None when unknown."""
        if self.workload == RsyncParams.name:
            return self.transfer.elapsed_s if self.transfer else None
        return self.duration_s

    @property
    def duration_s(self) -> float | None:
        """iperf3's asked transfer time [s]; None for a workload that asks none (rsync)."""
        return asked_duration_s(self.flow)

    @property
    def samples_cover_transfer(self) -> bool | None:
        """The socket samples span the transfer (:func:`bbrlab.analysis.evidence.covers_transfer`)."""
        return evidence.covers_transfer(self.samples_span_s, self.transfer_s,
                                        self.flow.sample_ms)

    def sender_sysctl(self, name: str):
        """The sender's ``name`` sysctl as the run recorded it (``metadata.sysctls.sender``); None when not
        recorded.
        """
        return self.meta.sysctls.sender_value(name) if self.meta.sysctls else None


def asked_duration_s(flow: Flow) -> float | None:
    """The transfer time ``flow`` asks for [s] (iperf3's ``duration_s``); None for rsync, which asks none."""
    return flow.params.duration_s if isinstance(flow.params, IperfParams) else None


def run_row(record: Mapping, summary: Mapping, path: str, fair: Mapping | None = None,
            samples_span_s: float | None = None, meta: RunMetadata | None = None) -> dict:
    """The ``runs`` row of one bbrlab record (scenario + metadata), its iperf3 summary, its flows' fairness and
    its socket samples' span (``meta``: the record's metadata typed, when the caller has it already)."""
    view = RunView(record, summary, path, fair, samples_span_s, meta)
    return {col.name: col.of_record(view) for col in RUN_SCHEMA}


def progress_intervals(run_id: str, transfer_json: Mapping) -> list[tuple]:
    """An rsync copy's progress series (``[t_s, bytes]`` on the receiver) as interval rows: the bytes that
    arrived between two samples, as Mbit/s."""
    points = transfer_json.get("progress") or []
    rows = []
    for (t0, b0), (t1, b1) in zip(points, points[1:], strict=False):
        if t1 > t0:
            rows.append((run_id, t0, t1, (b1 - b0) * 8 / (t1 - t0) / 1e6, None))
    return rows


def ss_rows(run_id: str, text: str, data_ports: set[int], *, log: str = "ss.log",
            sender_clock: clocks.ClockDrift | None = None) -> list[dict]:
    """Socket samples of one run as ``ss`` rows: ``ss.log`` parsed by :func:`bbrlab.sampling.ss.parse_ss_log`,
    ``samples.log`` (the netlink or BPF sampler) by :func:`bbrlab.sampling.sockdiag.rows`, into the same columns.

    Only the data connections are kept; ``t_s`` counts from the first sample (the sampler starts with the
    transfer). The parsers derive inflight_bytes (sent - retransmitted - acked), bdp_bytes (BBR's bw x min
    RTT) and inflight_bdp. ``t_host_s`` is the sample's guest time on this machine's clock, by the sender's
    measured offset (``metadata.clocks.sender``; missing without it).
    """
    parse = parse_ss_log if log == "ss.log" else sockdiag.rows
    out = []
    for s in parse(text, ports=sorted(data_ports) or None):
        row = {k: s.get(k) for k in SS_COLUMNS}
        row["run_id"] = run_id
        row["t_host_s"] = (sender_clock.to_local(s["t_unix_s"]) if sender_clock and s.get("t_unix_s") is not None
                           else None)
        out.append(row)
    return out


#: Rows of vcpu.csv read at a time.
VCPU_CHUNK_ROWS = 1 << 13


class _SsSink:
    """``ss`` rows of one run as they stream from its log (:mod:`bbrlab.sampling.logscan`), put straight into the
    table's columns (allocated once: :class:`Preallocated`), and the data streams' span
    (:class:`evidence.SpanTracker`)."""

    def __init__(self, run_id: str, drift: clocks.ClockDrift | None, capacity: int):
        self.run_id, self.drift = run_id, drift
        self.columns = Preallocated(SS_SCHEMA, capacity)
        self.spans = evidence.SpanTracker()

    def add(self, s: dict) -> None:
        row = {k: s.get(k) for k in SS_COLUMNS}
        row["run_id"] = self.run_id
        row["t_host_s"] = self.drift.to_local(s["t_unix_s"]) if self.drift and s.get("t_unix_s") is not None else None
        self.spans.add(row)
        self.columns.add(row)


def _compact(frame: pd.DataFrame, capacity: int) -> pd.DataFrame:
    """The frame on arrays of its own size when it fills less than half of what was allocated."""
    return frame.copy(deep=True) if len(frame) < capacity // 2 else frame


def ss_frame(run_id: str, path: Path, data_ports: set[int], *, log: str = "ss.log",
             sender_clock: clocks.ClockDrift | None = None) -> tuple[pd.DataFrame, float | None]:
    """:func:`ss_rows` as a typed DataFrame, the log read from ``path`` a line at a time (never whole), and the
    data streams' span (:func:`bbrlab.analysis.evidence.samples_span_s`)."""
    kind = "ss" if log == "ss.log" else logscan.log_kind(path)
    capacity = logscan.row_bound(kind, path)
    sink = _SsSink(run_id, sender_clock, capacity)
    logscan.scan(kind, path, sorted(data_ports) or None, sink.add, numbers=False)
    if capacity >= heap.LARGE_ROWS:  # the scan's row objects are freed: give them back before the frame is made
        heap.give_back()
    return _compact(sink.columns.frame(), capacity), sink.spans.span_s()


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
    meta = metadata_of(record, drop_unreadable=True)
    if record.get("status") != "ok":
        return RunRows(run_row(record, iperf_summary(report), rel, meta=meta), [], [], notes)
    measured = meta.clocks or clocks.RunClocks()
    flows = flow_reports(run_dir, record, report, notes, meta.flows) if report else []
    streams = [r for f in flows for r in stream_rows(record.get("run_id"), f)]
    fair, shares = fairness.run_fairness(streams)
    fair["flows"] = len(flows)
    ss, span_s = [], None
    for log in ("ss.log", "samples.log"):
        ss_path = run_dir / log
        if not ss_path.exists():
            continue
        ports = {c.get("local_port") for c in _get(report, "start", "connected", default=[])} - {None}
        ports |= {_get(meta.transfer.socket if meta.transfer else None, "local_port")} - {None}
        try:
            ss, span_s = ss_frame(record.get("run_id"), ss_path, ports, log=log,
                                  sender_clock=measured.sender)
        except Exception as e:  # noqa: BLE001 - a bad log must not stop the other runs; it is reported
            notes.append(f"{rel}/{log} not parsed: {type(e).__name__}: {e}")
    row = run_row(record, iperf_summary(report), rel, fair if flows else None, span_s, meta)
    flow_rows = [{**flow_summary(row["run_id"], f), **shares.get(f.index, {})} for f in flows]
    intervals = iperf_intervals(row["run_id"], report)
    if row["workload"] == RsyncParams.name:
        try:
            intervals = progress_intervals(row["run_id"], json.loads((run_dir / "transfer.json").read_text()))
        except (OSError, json.JSONDecodeError) as e:
            notes.append(f"{rel}/transfer.json unreadable: {e}")
    queue: list[dict] = []
    if (run_dir / bottleneck.LOG_FILE).exists():
        try:
            queue = bottleneck_rows(row["run_id"], (run_dir / bottleneck.LOG_FILE).read_text(), measured.emulator)
        except Exception as e:  # noqa: BLE001 - a bad log must not stop the other runs; it is reported
            notes.append(f"{rel}/{bottleneck.LOG_FILE} not parsed: {type(e).__name__}: {e}")
    return RunRows(row, intervals, ss, notes, vcpu=vcpu_frame(row["run_id"], run_dir / "vcpu.csv", notes, rel),
                   bottleneck=queue, streams=streams, flows=flow_rows)


def bottleneck_rows(run_id: str, text: str, drift: clocks.ClockDrift | None) -> list[dict]:
    """The emulator's bottleneck samples of one run as ``bottleneck`` rows, their times put on this machine's
    clock with the emulator's measured offset (``metadata.clocks.emulator``; ``t_host_s`` missing without it)."""
    samples = bottleneck.parse_log(text)
    if not samples:
        return []
    queue_handle = bottleneck.bottleneck_handle(samples)
    uncertainty_ms = max(drift.start.uncertainty_s, drift.end.uncertainty_s) * 1e3 if drift else None
    t0_ns = samples[0].t_ns
    return [{"run_id": run_id, "t_host_s": drift.to_local(s.t_s) if drift else None, "t_s": (s.t_ns - t0_ns) / 1e9,
             "align_uncertainty_ms": uncertainty_ms, "kind": s.kind, "handle": s.handle,
             "bottleneck": s.handle == queue_handle, "backlog_bytes": s.backlog_bytes, "qlen_packets": s.qlen_packets,
             "drops": s.drops, "bytes": s.bytes, "packets": s.packets, "overlimits": s.overlimits} for s in samples]


def vcpu_rows(run_id: str, path: Path, notes: list[str], rel: str) -> list[dict]:
    """The ``vcpu`` table's rows of one run from its ``vcpu.csv`` (none when the run was not traced)."""
    if not path.exists():
        return []
    try:
        with open(path, newline="") as f:
            return [{"run_id": run_id, "tid": int(r["tid"]), "on_cpu": r["state"] == "on",
                     "start_ns": int(r["start_ns"]), "end_ns": int(r["end_ns"]), "length_ms": int(r["length_ns"]) / 1e6,
                     "cpu": int(r["cpu"]) if r["cpu"] else None, "left_state": r["left_state"] or None,
                     "woken_ns": int(r["woken_ns"]) if r["woken_ns"] else None, "clipped": r["clipped"] == "1",
                     "inferred": r.get("inferred") or None}
                    for r in csv.DictReader(f)]
    except (OSError, ValueError, KeyError) as e:
        notes.append(f"{rel}/vcpu.csv not parsed: {type(e).__name__}: {e}")
        return []


_VCPU_CSV_TYPES = {"tid": "int64", "state": "category", "start_ns": "int64", "end_ns": "int64", "length_ns": "int64",
                   "cpu": "Int64", "left_state": "category", "woken_ns": "Int64", "clipped": "int64",
                   "inferred": "category"}


def _text_or_na(column: pd.Series | None, index: pd.Index) -> pd.Series:
    """A CSV text column with its empty cells as <NA> (all <NA> when the file has no such column)."""
    if column is None:
        return pd.Series(pd.NA, index=index, dtype="string")
    text = column.astype("string")
    return text.mask(text == "")


def vcpu_frame(run_id: str, path: Path, notes: list[str], rel: str) -> pd.DataFrame | list:
    """:func:`vcpu_rows` as a typed DataFrame, read column by column (pandas' CSV reader, :data:`VCPU_CHUNK_ROWS`
    rows at a time) into columns allocated once for the file's lines, not a dict per row."""
    if not path.exists():
        return []
    try:
        columns = Preallocated(VCPU_SCHEMA, logscan.row_bound("ss", path))  # lines: at least the rows
        for raw in pd.read_csv(path, dtype=_VCPU_CSV_TYPES, keep_default_na=False,
                               na_values={"cpu": [""], "woken_ns": [""]}, chunksize=VCPU_CHUNK_ROWS):
            columns.put(_vcpu_chunk(run_id, raw))
    except (OSError, ValueError, KeyError) as e:
        notes.append(f"{rel}/vcpu.csv not parsed: {type(e).__name__}: {e}")
        return []
    return _compact(columns.frame(), columns.capacity) if columns.rows else []


def _vcpu_chunk(run_id: str, raw: pd.DataFrame) -> pd.DataFrame:
    return typed_frame(pd.DataFrame({
        "run_id": pd.Series(run_id, index=raw.index, dtype="string"), "tid": raw["tid"],
        "on_cpu": raw["state"] == "on", "start_ns": raw["start_ns"], "end_ns": raw["end_ns"],
        "length_ms": raw["length_ns"] / 1e6, "cpu": raw["cpu"], "left_state": _text_or_na(raw["left_state"], raw.index),
        "woken_ns": raw["woken_ns"], "clipped": raw["clipped"] == 1,
        "inferred": _text_or_na(raw.get("inferred"), raw.index)}), VCPU_SCHEMA)


def flow_reports(run_dir: Path, record: Mapping, report: Mapping, notes: list[str],
                 others: list[FlowOutcome] | None = None) -> list[FlowReport]:
    """The run's flows and their iperf3 JSON: flow 0 is the scenario's flow (``iperf.json``, from the
    sender, at 0 s); a run of several flows lists the others in ``metadata.flows`` (``others``, each a
    :class:`~bbrlab.run.flowrecord.FlowOutcome`: docs/run-record.md). A flow file that cannot be read is a
    note, and the flow is left out."""
    flow = scenario_of(record).flow
    out = [FlowReport(0, "sender", flow.cca, flow.params.connections, 0.0, asked_duration_s(flow), report)]
    for f in others or []:
        try:
            with open(run_dir / f.file, "rb") as fh:
                other = json.load(fh)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            notes.append(f"{run_dir.name}: flow {f.index} unreadable: {e}")
            continue
        out.append(FlowReport(f.index, f.origin, f.cca, f.streams, float(f.start_s or 0.0), f.duration_s, other))
    return out


# -- the layout, as the table cache sees it ----------------------------------------------------------

def is_campaign(path: Path) -> bool:
    """A bbrlab campaign directory: it has ``runs/``, ``failed/`` or ``plan.json``."""
    return (path / "runs").is_dir() or (path / "failed").is_dir() or (path / "plan.json").is_file()


def discover(campaign_dir: Path) -> list[str]:
    """Run directories (relative paths) under ``runs/`` and ``failed/``; ``.tmp/`` is never read."""
    out = []
    for sub in ("runs", "failed"):
        base = campaign_dir / sub
        if not base.is_dir():
            continue
        with os.scandir(base) as it:
            out.extend(f"{sub}/{e.name}" for e in it if e.is_dir() and not e.name.startswith("."))
    return sorted(out)


def signature(campaign_dir: Path, rel: str) -> list:
    """(name, size, mtime_ns) of each run file present: changes whenever a file does."""
    sig = []
    extra = sorted(e.name for e in os.scandir(campaign_dir / rel) if e.name.startswith("iperf-flow")) \
        if (campaign_dir / rel).is_dir() else []
    for name in (*RUN_FILES, *extra):
        try:
            st = os.stat(campaign_dir / rel / name)
        except FileNotFoundError:
            continue
        sig.append([name, st.st_size, st.st_mtime_ns])
    return sig


def read_units(campaign_dir: str, rels: list[str]) -> list[tuple[str, list[RunRows]]]:
    """Read run directories; an unreadable one (a record that is not JSON, or whose metadata does not read
    typed) becomes a note, not an exception."""
    base = Path(campaign_dir)
    out = []
    for rel in rels:
        try:
            out.append((rel, [read_run(base, rel)]))
        except (OSError, ValueError, UnicodeDecodeError) as e:  # ValueError: not JSON, or not a run record's
            out.append((rel, [RunRows({}, [], [], [f"{rel}: unreadable run ({e})"])]))
    return out


def unit_of_path(path: str) -> str:
    """The run directory a ``runs`` row's ``path`` belongs to (the path itself for bbrlab runs)."""
    return path


def _layout():
    return Layout("bbrlab", discover, signature, read_units, unit_of_path)


LAYOUT = _layout()
