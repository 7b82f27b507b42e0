"""Read the 2BRobust authors' published dataset (sys-uos/bbr-cpu-contention, ``results/data``).

Their layout, as their ``measure/run.sh`` writes it and their ``results/plots`` notebooks read it::

    <dataset>/<YYYYmmdd-HHMMSS>/meta.json           one measurement point (also accepted under logs/)
    <dataset>/<YYYYmmdd-HHMMSS>/sender/iperf_<i>.json repetition i = 1..n, iperf3 JSON of the sender
    <dataset>/<YYYYmmdd-HHMMSS>/emulator/            empty
    <dataset>/socket_data/ss_<scenario>_scheduling_bbr<v>[_<N>].log   socket samples, one file per scenario

``meta.json`` is one line written by ``jq --arg``: every value is a string. How its keys map:

===================== ==================================================================================
``cca``, ``kernel``   the run identity together (:func:`bbrlab.analysis.identity.from_authors`): ``bbr`` on a
                      ``BBRv3`` kernel is BBRv3, on ``kernel6-1`` BBRv1; ``bbr1`` on ``BBRv3`` is BBRv1;
                      a ``_fixed`` kernel carries the patched module -> ``patched``
``rate``              bottleneck rate [Mbit/s] -> ``rate_mbit``
``delay_rtt``         round-trip time [ms] -> ``rtt_ms``
``buffer_size_bytes`` the buffer ASKED for [bytes], their tbf's ``limit``; ``bdp`` the same in BDP ->
                      ``buffer_asked_bdp`` (computed from the bytes when ``bdp`` is absent). It was not the
                      queue in force: see "Their queue" below
``parallel``          iperf3 ``-P`` -> ``streams``
``deadline_run``,     SCHED_DEADLINE runtime and period of the vCPU threads in NANOSECONDS (they go to
``deadline_period``   ``chrt --sched-runtime``): ``timeslice_ms`` = run / 1e6, ``cpu_share_pct`` = 100 x
                      run / period, also at 100 % (run = period keeps its timeslice)
``chaos``             ``on_1`` (or any ``on...``): deadline scheduling -> ``contention_mode = deadline``,
                      ``deadline_mode = constrained`` (their ``measure/apply_sched_dead.sh`` passes
                      ``--sched-deadline`` = the runtime);
                      ``real_kvm``: real hypervisor load -> ``hypervisor_load`` with ``load_pct`` from
                      ``loadperc``; absent and no deadline keys -> ``none`` (100 % share)
``vm``                the hypervisor (``qemu_kvm``, ``qemu``, ``virtualbox``) -> ``hypervisor``;
                      ``qemu_kvm`` -> ``accelerator = kvm``
``qdisc``             the sender's qdisc when set (``fq``) -> ``sender_qdisc``
``loss``              ``{mode, params, seed1}``; ``params`` one string (``"0.1 25"``): ``random`` ->
                      ``uniform`` with ``loss_pct`` = its first number, ``gemodel`` -> ``gemodel``
``n``                 repetitions planned: a point with another number of iperf3 files gets a note
===================== ==================================================================================

Their queue: their ``measure/setup_emulator.sh`` put tbf at the root of both emulator ports and netem
(``limit 100000``) below it, with TSO, GSO and GRO on. tbf's limit only sizes the default child that netem
replaced (the comment at the top of Linux's ``net/sched/sch_tbf.c``), so the bottleneck queue of every run
was netem's 100000 packets, whatever ``buffer_size_bytes`` says. Each row therefore gets ``queue_mode =
authors``, ``queue_limit_qdisc = netem``, ``queue_limit_packets = 100000``, ``buffer_bytes`` = 100000 x 1514
bytes (full-size frames at their 1500-byte MTU: an approximation, since netem counts packets and their GRO
made aggregates of several frames) and ``buffer_bdp`` = that over the point's BDP (rate x RTT), and
``emulator_offloads = on`` (:func:`authors_queue`).

Cross-checks, as their parser makes them: reading a point's repetitions in order, an unreadable iperf3
JSON or one with ``error`` fails that repetition, and one whose ``sender_tcp_congestion`` or
``num_streams`` disagrees with meta.json's ``cca`` / ``parallel`` is ``excluded``; either way the
point's remaining repetitions are ``excluded`` too, and a note names the point and why. (Their parser
walks the files in lexical order, ``iperf_10`` before ``iperf_2``; this reader walks them by number.)

Socket logs: each line is an epoch timestamp in seconds, a comma, and what ``ss -ti`` printed for the
flow. The scenario is only in the file name (:func:`bbrlab.analysis.identity.from_socket_log_name`): CPU share
(``no`` = 100 %), patch and BBR version; the congestion control's name is what ss printed, the kernel
and timeslice are not recorded. Each file becomes one ``runs`` row (``ss_sampled``, no throughput)
with its samples in ``ss``; like their notebooks, only samples with BBR state and a delivery rate are
kept.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

from bbrlab.core.errors import ValidationError
from bbrlab.core.units import parse_percent, parse_rate_mbit, parse_time_ms
from bbrlab.sampling.ss import parse_ss_line
from bbrlab.scenario.linksizing import AUTHORS_NETEM_LIMIT_PACKETS, ETHERNET_HEADER_BYTES, authors_queue_bytes
from bbrlab.scenario.workloads import IperfParams

from . import identity
from .records_reader import iperf_intervals, iperf_summary
from .streams import FlowReport, flow_summary, stream_rows
from .table_cache import Layout
from .tables import SS_COLUMNS, RunRows

SOCKET_DIR = "socket_data"
_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0}
_IPERF_NAME = re.compile(r"iperf_(\d+)\.json")
_NOT_POINTS = {SOCKET_DIR, "tables", "logs"}


# -- where things are ---------------------------------------------------------------------------------

def points_dir(root: Path) -> Path | None:
    """The folder holding the measurement points: the dataset root, or its ``logs/`` (run.sh's name)."""
    for candidate in (root, root / "logs"):
        if candidate.is_dir() and any(_is_point(p) for p in _subdirs(candidate)):
            return candidate
    return None


def _subdirs(folder: Path) -> list[Path]:
    with os.scandir(folder) as it:
        return [Path(e.path) for e in it if e.is_dir() and not e.name.startswith(".") and e.name not in _NOT_POINTS]


def _is_point(path: Path) -> bool:
    return (path / "meta.json").is_file()


def is_authors_layout(path: str | Path) -> bool:
    """A dataset in the authors' layout: measurement points with meta.json, or a socket_data folder."""
    path = Path(path)
    return path.is_dir() and (points_dir(path) is not None or any((path / SOCKET_DIR).glob("ss_*.log")))


def discover(root: Path) -> list[str]:
    """Units of a dataset, relative to ``root``: point folders and socket logs."""
    units = []
    points = points_dir(root)
    if points is not None:
        prefix = "" if points == root else f"{points.name}/"
        units += [prefix + p.name for p in _subdirs(points) if _is_point(p)]
    sockets = root / SOCKET_DIR
    if sockets.is_dir():
        units += [f"{SOCKET_DIR}/{p.name}" for p in sockets.glob("*.log")]
    return sorted(units)


def signature(root: Path, unit: str) -> list:
    """(name, size, mtime_ns) of a point's meta.json and iperf3 files, or of a socket log."""
    path = root / unit
    if unit.startswith(f"{SOCKET_DIR}/"):
        st = os.stat(path)
        return [[path.name, st.st_size, st.st_mtime_ns]]
    st = os.stat(path / "meta.json")
    sig = [["meta.json", st.st_size, st.st_mtime_ns]]
    try:
        with os.scandir(path / "sender") as it:
            entries = sorted((e.name, e.stat()) for e in it if e.is_file())
    except FileNotFoundError:
        entries = []
    return sig + [[name, s.st_size, s.st_mtime_ns] for name, s in entries]


def unit_of_path(path: str) -> str:
    """``<point>/sender/iperf_3.json`` -> ``<point>``; a socket log is its own unit."""
    head, sep, _ = path.partition("/sender/")
    return head if sep else path


def read_units(root: str, units: list[str]) -> list[tuple[str, list[RunRows]]]:
    """Read points and socket logs; a unit that cannot be read becomes a note."""
    base = Path(root)
    dataset = base.name
    out = []
    for unit in units:
        try:
            rows = read_socket_log(base, unit, dataset) if unit.startswith(f"{SOCKET_DIR}/") else \
                read_point(base, unit, dataset)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, ValidationError, AttributeError) as e:
            rows = [RunRows({}, [], [], [f"{unit}: skipped ({type(e).__name__}: {e})"])]
        out.append((unit, rows))
    return out


LAYOUT = Layout("authors", discover, signature, read_units, unit_of_path)


# -- meta.json -------------------------------------------------------------------------------------

def _number(value) -> float:
    if value is None or isinstance(value, bool) or value == "":
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


def contention_of(meta: Mapping, deadline_unit: str = "ns") -> dict:
    """``contention_mode``, ``timeslice_ms``, ``deadline_mode``, ``cpu_share_pct`` and ``load_pct`` of a point.

    ``deadline_run``/``deadline_period`` are nanoseconds in run.sh; ``deadline_unit`` reads other
    datasets. A point without a policy (keys absent or zero) runs at a 100 % share, mode ``none``;
    ``chaos = real_kvm`` is real hypervisor load (``loadperc``), with no share set.
    """
    if deadline_unit not in _TO_MS:
        raise ValidationError("deadline_unit", deadline_unit, "one of ns, us, ms")
    chaos = str(meta.get("chaos") or "").lower()
    if chaos == "real_kvm":
        return {"contention_mode": "hypervisor_load", "timeslice_ms": float("nan"), "cpu_share_pct": float("nan"),
                "load_pct": _number(meta.get("loadperc"))}
    run, period = _number(meta.get("deadline_run")), _number(meta.get("deadline_period"))
    if math.isnan(run) or math.isnan(period) or run <= 0 or period <= 0:
        return {"contention_mode": "none", "timeslice_ms": float("nan"), "cpu_share_pct": 100.0,
                "load_pct": float("nan")}
    if run > period:
        raise ValidationError("deadline_run", meta.get("deadline_run"), f"at most deadline_period ({period:g})")
    return {"contention_mode": "deadline", "timeslice_ms": run * _TO_MS[deadline_unit], "deadline_mode": "constrained",
            "cpu_share_pct": round(100.0 * run / period, 6), "load_pct": float("nan")}


def loss_of(meta: Mapping) -> tuple[str, float]:
    """(loss_model, loss_pct) from ``loss: {mode, params}`` (params a string such as ``"0.1 25"``)."""
    loss = meta.get("loss")
    if not isinstance(loss, Mapping):
        return "none", 0.0
    mode = str(loss.get("mode") or "none").lower()
    params = loss.get("params")
    if isinstance(params, str):
        params = params.replace(",", " ").split()
    first = params[0] if isinstance(params, list | tuple) and params else params
    if mode in ("none", "off", "no", ""):
        return "none", 0.0
    pct = parse_percent(first, "loss.params") if first not in (None, []) else float("nan")
    if mode in ("gemodel", "gilbert", "gilbert-elliott", "ge"):
        return "gemodel", pct
    return "uniform", pct


#: The authors' path MTU (their emulator's defaults): full-size frames of 1514 bytes in the queue.
AUTHORS_MTU_BYTES = 1500


def authors_queue(bdp_bytes: float) -> dict:
    """The bottleneck queue in force in the authors' testbed (see "Their queue" in the module docstring):
    netem's packets, their bytes at full-size frames, and that in BDP for a point of ``bdp_bytes``."""
    queue_bytes = authors_queue_bytes(AUTHORS_MTU_BYTES + ETHERNET_HEADER_BYTES)
    return {"queue_mode": "authors", "queue_limit_qdisc": "netem", "queue_limit_packets": AUTHORS_NETEM_LIMIT_PACKETS,
            "buffer_bytes": float(queue_bytes), "buffer_bdp": queue_bytes / bdp_bytes if bdp_bytes > 0 else float("nan"),
            "emulator_offloads": "on"}


def point_params(meta: Mapping, deadline_unit: str = "ns") -> dict:
    """The ``runs`` columns one measurement point shares with all its repetitions."""
    rate = _parsed(meta, "rate", parse_rate_mbit)
    rtt = _parsed(meta, "delay_rtt", parse_time_ms)
    model, loss_pct = loss_of(meta)
    asked_bytes = _number(meta.get("buffer_size_bytes"))
    bdp_bytes = rate * 1e6 / 8 * rtt / 1e3
    asked_bdp = _number(meta.get("bdp"))
    if math.isnan(asked_bdp) and bdp_bytes > 0:
        asked_bdp = round(asked_bytes / bdp_bytes, 4)
    streams = _number(meta.get("parallel"))
    who = identity.from_authors(meta.get("cca"), meta.get("kernel"))
    vm = meta.get("vm") or None
    return {
        "cca": who.cca, "bbr_version": who.bbr_version, "patched": who.patched, "kernel": who.kernel,
        "variant": who.variant, **contention_of(meta, deadline_unit),
        "rate_mbit": rate, "rtt_ms": rtt, "buffer_asked_bdp": asked_bdp, **authors_queue(bdp_bytes),
        "streams": 1.0 if math.isnan(streams) else streams, "loss_model": model, "loss_pct": loss_pct,
        "hypervisor": vm, "accelerator": "kvm" if vm == "qemu_kvm" else None,
        "sender_qdisc": meta.get("qdisc") or None, "testbed_kind": "authors", "source": "authors",
        "ss_sampled": False, "sampler": None, "workload": IperfParams.name,
    }


# -- one measurement point -------------------------------------------------------------------------

def _repetitions(point: Path) -> list[tuple[int, Path]]:
    try:
        with os.scandir(point / "sender") as it:
            found = [(int(m.group(1)), Path(e.path)) for e in it if (m := _IPERF_NAME.fullmatch(e.name))]
    except FileNotFoundError:
        return []
    return sorted(found)


def _load_report(path: Path) -> tuple[dict, str | None]:
    """(report, why it cannot be used) for one iperf3 JSON."""
    try:
        with open(path, "rb") as f:
            report = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return {}, f"unreadable iperf3 JSON ({e})"
    if not isinstance(report, dict):
        return {}, "iperf3 JSON is not an object"
    if "error" in report:
        return report, f"iperf3 error: {report['error']}"
    return report, None


def _disagreement(report: Mapping, meta: Mapping) -> str | None:
    """Why a report does not belong to its point (their parser's "wrong classification"), or None."""
    said_cca = (report.get("end") or {}).get("sender_tcp_congestion")
    streams = ((report.get("start") or {}).get("test_start") or {}).get("num_streams")
    if said_cca != meta.get("cca"):
        return f"iperf3 ran {said_cca!r}, meta.json says cca {meta.get('cca')!r}"
    if _number(streams) != _number(meta.get("parallel")):
        return f"iperf3 ran {streams} streams, meta.json says parallel {meta.get('parallel')!r}"
    return None


def read_point(root: Path, unit: str, dataset: str, deadline_unit: str = "ns") -> list[RunRows]:
    """All repetitions of one measurement point, with their cross-checks (see the module docstring)."""
    point = root / unit
    meta = json.loads((point / "meta.json").read_text())
    params = point_params(meta, deadline_unit)
    reps = _repetitions(point)
    notes = []
    planned = _number(meta.get("n"))
    if not math.isnan(planned) and planned != len(reps):
        notes.append(f"{unit}: {len(reps)} iperf3 files, meta.json planned n = {meta.get('n')}")
    out: list[RunRows] = []
    stop: tuple[int, str] | None = None
    for number, path in reps:
        rel = f"{unit}/sender/{path.name}"
        run_id = f"{Path(unit).name}/iperf_{number}"
        if stop is not None:
            report, status = {}, "excluded"
            reason = f"after iperf_{stop[0]}.json ({stop[1]}): the authors' parser drops the rest of the point"
        else:
            report, reason = _load_report(path)
            status = "failed" if reason else "ok"
            if reason is None and (reason := _disagreement(report, meta)):
                status = "excluded"
            if reason:
                stop = (number, reason)
        out.append(_repetition_rows(report, run_id, rel, number, dataset, params, status, reason))
    if stop is not None:
        left = [n for n, _ in reps if n >= stop[0]]
        notes.append(f"{unit}: repetitions {', '.join(map(str, left))} left out as the authors' parser does: "
                     f"iperf_{stop[0]}.json: {stop[1]}")
    if out:
        out[0].notes.extend(notes)
    elif notes:
        out.append(RunRows({}, [], [], notes))
    return out


def _repetition_rows(report: Mapping, run_id: str, rel: str, number: int, dataset: str, params: dict,
                     status: str, reason: str | None) -> RunRows:
    summary = iperf_summary(report)
    start = report.get("start") or {}
    thr = summary["throughput_mbit"] if status == "ok" else float("nan")
    secs = (start.get("timestamp") or {}).get("timesecs")
    row = {
        **params, "run_id": run_id, "campaign": dataset, "status": status, "reason": reason, "path": rel,
        "repetition": float(number), "duration_s": _number((start.get("test_start") or {}).get("duration")),
        "throughput_mbit": thr, "goodput_mbit": thr, "sender_throughput_mbit": summary["sender_throughput_mbit"],
        "retransmits": summary["retransmits"], "cpu_sender_pct": summary["cpu_sender_pct"],
        "link_utilisation": thr / params["rate_mbit"] if params["rate_mbit"] else float("nan"),
        "started_at": _iso(secs),
    }
    if status != "ok":
        return RunRows(row, [], [])
    flow = FlowReport(0, "sender", params.get("cca"), _number((start.get("test_start") or {}).get("num_streams")),
                      0.0, row["duration_s"], report)
    row["flows"] = 1
    return RunRows(row, iperf_intervals(run_id, report), [], [], streams=stream_rows(run_id, flow),
                   flows=[flow_summary(run_id, flow)])


def _iso(secs) -> str | None:
    if secs is None:
        return None
    return dt.datetime.fromtimestamp(float(secs), dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- socket logs -----------------------------------------------------------------------------------

def parse_socket_line(line: str) -> dict | None:
    """One ``<epoch seconds>,<ss output>`` line -> an ss row (``t_unix_s`` + bbrlab's ss fields), or
    None when it is not a sample with BBR state and a delivery rate (as the authors' notebooks skip)."""

    stamp, sep, rest = line.partition(",")
    body = rest.strip()
    if not sep or not body:
        return None
    try:
        t_unix_s = float(stamp)
    except ValueError:
        return None
    first = body.split(None, 1)[0]
    # A line with only the info part starts with the CCA's name; ss's address line starts otherwise.
    text = "\t" + body if re.fullmatch(r"[a-z][a-z0-9_]*", first) else body
    try:
        row = parse_ss_line(text, check=False)
    except (ValueError, IndexError):
        return None
    if row.get("bw_mbit") is None or row.get("delivery_rate_mbit") is None:
        return None
    return {"t_unix_s": t_unix_s, **row}


def _one_connection(rows: list[dict]) -> tuple[list[dict], int]:
    """Keep the connection that moved the most data when a log holds several ports (iperf3's control
    connection is tiny); returns (rows, rows dropped)."""
    ports = {r["port"] for r in rows if r["port"] is not None}
    if len(ports) <= 1:
        return rows, 0
    acked = {p: max(r["bytes_acked"] or 0 for r in rows if r["port"] == p) for p in ports}
    main = max(acked, key=acked.get)
    kept = [r for r in rows if r["port"] == main]
    return kept, len(rows) - len(kept)


def read_socket_log(root: Path, unit: str, dataset: str) -> list[RunRows]:
    """One socket log as one ``runs`` row (the scenario from its name) and its ``ss`` rows."""
    stem = Path(unit).stem
    parsed = identity.from_socket_log_name(stem)
    if parsed is None:
        return [RunRows({}, [], [], [f"{unit}: not an ss_<scenario>_scheduling_bbr<v>[_N].log name; skipped"])]
    who, share, rep = parsed
    lines = (root / unit).read_text().splitlines()
    samples = [s for line in lines if (s := parse_socket_line(line)) is not None]
    samples, other_ports = _one_connection(samples)
    notes = []
    if len(samples) + other_ports < len(lines):
        notes.append(f"{unit}: {len(lines) - len(samples) - other_ports} of {len(lines)} lines without BBR state "
                     "or a delivery rate were skipped (as the authors' notebooks do)")
    if other_ports:
        notes.append(f"{unit}: {other_ports} samples of other connections left out")
    who = dataclasses.replace(who, cca=samples[0]["cca"] if samples else None)
    run_id = f"{SOCKET_DIR}/{stem}"
    t0 = samples[0]["t_unix_s"] if samples else 0.0
    ss = [{**{k: s.get(k) for k in SS_COLUMNS}, "run_id": run_id, "t_s": s["t_unix_s"] - t0} for s in samples]
    row = {
        "run_id": run_id, "campaign": dataset, "source": "authors", "status": "ok", "reason": None, "path": unit,
        "cca": who.cca, "bbr_version": who.bbr_version, "patched": who.patched, "kernel": None,
        "variant": who.variant, "contention_mode": "deadline" if share < 100 else "none",
        "deadline_mode": "constrained" if share < 100 else None,
        "cpu_share_pct": share, "repetition": float(rep), "ss_sampled": True, "sampler": "ss", "testbed_kind": "authors",
        "started_at": _iso(t0) if samples else None, "workload": IperfParams.name,
        **authors_queue(0.0),  # the queue in force; the log's name gives no rate x RTT, so no BDP
    }
    return [RunRows(row, [], ss, notes)]
