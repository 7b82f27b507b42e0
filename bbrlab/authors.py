"""Read the 2BRobust authors' published data layout into bbrlab's tables.

Their dataset is a folder of measurement points::

    <dataset>/logs/<timestamp>/meta.json            the point's parameters
    <dataset>/logs/<timestamp>/sender/iperf_<N>.json iperf3 JSON of repetition N (run on the sender)

``meta.json`` keys and how they map (every key may be missing; a missing one becomes NaN/None):

==================== =========================================================================
``cca``              congestion control -> ``cca``
``kernel``           the sender's kernel -> ``sender_kernel``
``rate``             bottleneck rate, ``"100mbit"`` or a number of Mbit/s -> ``rate_mbit``
``delay_rtt``        round-trip time, ``"10ms"`` or a number of ms -> ``rtt_ms``
``buffer_size_bytes`` bottleneck queue in bytes -> ``buffer_bytes``; ``buffer_bdp`` = bytes / BDP
``parallel``         iperf3 ``-P`` -> ``streams``
``deadline_run``     SCHED_DEADLINE runtime of the vCPU threads = the paper's *timeslice*
``deadline_period``  SCHED_DEADLINE period; CPU share = run / period (unit-free), timeslice = run
``loss``             ``{"mode": ..., "params": [...]}`` as given to netem: mode none/""
                     -> no loss; random/uniform/loss -> ``uniform`` with ``loss_pct`` = params[0];
                     gemodel/gilbert -> ``gemodel`` with ``loss_pct`` = p = params[0]
``hypervisor``       (if present; the poster's kvm/virtualbox) -> ``hypervisor``
==================== =========================================================================

Units of ``deadline_run`` / ``deadline_period``: the paper never prints them. SCHED_DEADLINE's own
interface (``sched_setattr``, ``chrt -d --sched-runtime``) takes nanoseconds, so that is the default
reading; the unit is inferred per value from the runtime's magnitude so that the timeslice lands in
the paper's range: runtime >= 100,000 -> ns (1 ms = 1,000,000), 100 <= runtime < 100,000 -> us
(1 ms = 1,000), runtime < 100 -> ms. ``meta["deadline_unit"]`` or ``read_authors(..., deadline_unit=)``
overrides the inference. No policy (keys absent, zero, or run >= period) means a 100 % share.
The CPU share does not depend on the unit. Each ``iperf_N.json`` is one run with repetition N; the
sender ran the iperf3 client, so throughput is the receiver sum as in bbrlab's own runs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

from .data import RunRows, Tables, build_tables, iperf_intervals, iperf_summary
from .errors import BbrlabError, ValidationError
from .units import parse_percent, parse_rate_mbit, parse_time_ms

_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0}
_IPERF_NAME = re.compile(r"iperf_(\d+)\.json")


def logs_dir(path: Path) -> Path | None:
    """The ``logs`` folder of a dataset given as the dataset root or as the logs folder itself."""
    for candidate in (path / "logs", path):
        if candidate.is_dir() and any(candidate.glob("*/meta.json")):
            return candidate
    return None


def is_authors_layout(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and logs_dir(path) is not None


def deadline_unit_of(runtime: float) -> str:
    """Infer ``ns``/``us``/``ms`` from a runtime's magnitude (see the module docstring)."""
    if runtime >= 100_000:
        return "ns"
    if runtime >= 100:
        return "us"
    return "ms"


def contention_of(meta: Mapping, unit: str = "auto") -> tuple[float, float]:
    """(timeslice_ms, cpu_share_pct) from deadline_run/deadline_period; (NaN, 100) without a policy."""
    run, period = _number(meta.get("deadline_run")), _number(meta.get("deadline_period"))
    if not run or not period or run >= period or math.isnan(run) or math.isnan(period):
        return float("nan"), 100.0
    unit = meta.get("deadline_unit", unit)
    if unit == "auto":
        unit = deadline_unit_of(run)
    if unit not in _TO_MS:
        raise ValidationError("deadline_unit", unit, "one of auto, ns, us, ms")
    return run * _TO_MS[unit], round(100.0 * run / period, 6)


def loss_of(meta: Mapping) -> tuple[str, float]:
    """(loss_model, loss_pct) from ``loss: {mode, params}``."""
    loss = meta.get("loss")
    if not isinstance(loss, Mapping):
        return "none", 0.0
    mode = str(loss.get("mode") or "none").lower()
    params = loss.get("params")
    if isinstance(params, str):
        params = params.replace(",", " ").split()
    first = params[0] if isinstance(params, list | tuple) and params else params
    if mode in ("none", "off", "no"):
        return "none", 0.0
    pct = parse_percent(first, "loss.params") if first is not None else float("nan")
    if mode in ("gemodel", "gilbert", "gilbert-elliott", "ge"):
        return "gemodel", pct
    return "uniform", pct


def _number(value) -> float:
    if value is None or isinstance(value, bool):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _parsed(meta: Mapping, key: str, parse) -> float:
    value = meta.get(key)
    if value is None or value == "":
        return float("nan")
    return parse(value, key)


def point_params(meta: Mapping, deadline_unit: str = "auto") -> dict:
    """The parameter columns of one measurement point (shared by its repetitions)."""
    rate = _parsed(meta, "rate", parse_rate_mbit)
    rtt = _parsed(meta, "delay_rtt", parse_time_ms)
    timeslice, share = contention_of(meta, deadline_unit)
    model, loss_pct = loss_of(meta)
    buffer_bytes = _number(meta.get("buffer_size_bytes"))
    bdp_bytes = rate * 1e6 / 8 * rtt / 1e3
    streams = _number(meta.get("parallel"))
    return {
        "cca": meta.get("cca"), "sender_kernel": meta.get("kernel"), "rate_mbit": rate, "rtt_ms": rtt,
        "buffer_bytes": buffer_bytes, "buffer_bdp": buffer_bytes / bdp_bytes if bdp_bytes > 0 else float("nan"),
        "streams": 1.0 if math.isnan(streams) else streams, "timeslice_ms": timeslice, "cpu_share_pct": share,
        "loss_model": model, "loss_pct": loss_pct, "hypervisor": meta.get("hypervisor"),
        "patched": bool(meta.get("patched", False)) or str(meta.get("cca") or "").endswith("2b"),
        "ss_sampled": False,  # the authors sampled ss in separate runs of their own layout
    }


def read_point(point_dir: Path, dataset: str, deadline_unit: str = "auto") -> list[RunRows]:
    """All repetitions of one ``logs/<timestamp>/`` folder."""
    meta = json.loads((point_dir / "meta.json").read_text())
    params = point_params(meta, deadline_unit)
    out = []
    for path in sorted((point_dir / "sender").glob("iperf_*.json")):
        m = _IPERF_NAME.fullmatch(path.name)
        if not m:
            continue
        out.append(_read_repetition(path, point_dir.name, int(m.group(1)), dataset, params))
    return out


def _read_repetition(path: Path, point: str, repetition: int, dataset: str, params: dict) -> RunRows:
    run_id = f"{point}/iperf_{repetition}"
    rel = f"logs/{point}/sender/{path.name}"
    try:
        report = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        report = {"error": f"unreadable iperf3 JSON: {e}"}
    summary = iperf_summary(report)
    failed = "error" in report or not report.get("end")
    thr = summary["throughput_mbit"]
    row = {
        "run_id": run_id, "campaign": dataset, "status": "failed" if failed else "ok",
        "reason": report.get("error") if failed else None, **params, "repetition": float(repetition),
        "duration_s": _number((report.get("start") or {}).get("test_start", {}).get("duration")),
        "throughput_mbit": thr, "sender_throughput_mbit": summary["sender_throughput_mbit"],
        "retransmits": summary["retransmits"], "cpu_sender_pct": summary["cpu_sender_pct"],
        "link_utilisation": thr / params["rate_mbit"] if params["rate_mbit"] else float("nan"),
        "accelerator": None, "testbed_kind": "authors", "started_at": None, "source": "authors", "path": rel,
    }
    intervals = [] if failed else iperf_intervals(run_id, report)
    return RunRows(row, intervals, [])


def read_authors(path: str | Path, deadline_unit: str = "auto") -> Tables:
    """The tables of an authors' dataset (``source = 'authors'``; no ss samples in their layout)."""
    path = Path(path)
    logs = logs_dir(path)
    if logs is None:
        raise BbrlabError(f"{path}: not the authors' layout (expected logs/<timestamp>/meta.json)")
    dataset = (logs.parent if logs.name == "logs" else logs).name
    rows: list[RunRows] = []
    notes: list[str] = []
    for point in sorted(p for p in logs.iterdir() if (p / "meta.json").is_file()):
        try:
            rows.extend(read_point(point, dataset, deadline_unit))
        except (OSError, json.JSONDecodeError, ValidationError) as e:
            notes.append(f"{point.name}: skipped ({e})")
    t = build_tables(rows)
    t.notes.extend(notes)
    return t
