"""Turning calibration runs into ceilings (``calibration.json``): the statistic, and which limit each point measured.

The runs themselves are planned and measured by :mod:`bbrlab.calibration.calibrate`. Here they are summarised:

The ceiling of a point is an UPPER bound of what the contended sender carried: the highest receiver
throughput of any of its runs, of the stream count that reached it (:data:`CEILING_STATISTIC`). It used to be
the median of the better stream count, which shaped runs exceeded (in ``data/demo`` at 1 ms / 10 %: a
ceiling of 30.4 Mbit/s, the median of two runs of 48.1 and 12.7, against 32.5 Mbit/s carried over a shaped
100 Mbit/s link; docs/calibration.md). Each stream count keeps its median and maximum in ``by_streams``.

Which limit was measured (:func:`classify_limit`): every run records how much of its time the sender's
vCPU wanted the CPU (``(cpu + wait) / wall`` of the vCPU threads, from the contention evidence; time
throttled by the deadline policy counts as waiting), how busy the emulator and the sender's hypervisor
host were (``metadata.cpu_load``, :mod:`bbrlab.contention.hostcpu`). A point's ``limit`` names what was saturated:

- ``sender-cpu``: its ceiling is clearly below the full-share ceiling at the same RTT (below
  :data:`SHARE_BOUND_FRACTION` of it: the share, not the path, limits it), or the vCPU wanted the CPU at
  least :data:`SENDER_BOUND_DEMAND_PCT` of the time;
- ``emulator``: the emulator's busiest CPU was at least :data:`BUSY_PCT` busy;
- ``host-cpu``: the sender's hypervisor host was at least :data:`BUSY_PCT` busy over all its CPUs (on
  the local testbed: the two VMs, QEMU's I/O threads and everything else the machine runs);

joined with "and" when several were, ``undetermined`` when none was (the receiver, for instance).
Each point lists its ``evidence``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from bbrlab.contention.evidence import ContentionEvidence
from bbrlab.contention.hostcpu import HostBusy
from bbrlab.run import record as rec
from bbrlab.run.ceiling import IDENTITY, Calibration, CalibrationMismatch, CeilingPoint, PointKey
from bbrlab.run.runmeta import RunMetadata
from bbrlab.run.runrecord import RunRecord, metadata_of
from bbrlab.testbed.record import TestbedRecord

from .plan import CCA

if TYPE_CHECKING:
    from .plan import CalibrationSpec

#: Above this share of the time wanting the CPU, the sender is the limit.
SENDER_BOUND_DEMAND_PCT = 90.0
#: Above this busy share (the emulator's busiest CPU, the hypervisor host's CPUs), that host is the limit.
BUSY_PCT = 90.0
#: A contended point whose ceiling is below this fraction of the full-share ceiling is limited by its share.
SHARE_BOUND_FRACTION = 0.9
#: The point key of the bridge reference (no qdisc at all, 100 % share).
REFERENCE_KEY = "bridge-sh100-rtt0ms"
#: What a point's ``ceiling_mbit`` is, as ``calibration.json`` states it (``configuration.ceiling``).
CEILING_STATISTIC = ("highest receiver throughput of any repetition, of the stream count that reached it "
                     "(an upper bound of what the contended sender carried)")


def typed_record(record: Mapping | RunRecord) -> RunRecord:
    """A calibration run's record, typed: its envelope and scenario as :meth:`RunRecord.from_json` reads them, its
    metadata as :func:`~bbrlab.run.runrecord.metadata_of` with ``drop_unreadable`` (a part that does not read is
    None, not the record refused). A record already typed is returned as it is."""
    if isinstance(record, RunRecord):
        return record
    envelope = RunRecord.from_json({**record, "metadata": {}})
    return dataclasses.replace(envelope, metadata=metadata_of(record, drop_unreadable=True))


def sender_usage(meta: RunMetadata) -> tuple[float | None, float | None]:
    """(CPU used, CPU wanted) by the sender's vCPU threads in % of wall time, averaged over threads.

    Wanted = running + runnable but waiting (under SCHED_DEADLINE the throttled time counts as waiting).
    """
    evidence = meta.contention.evidence if meta.contention is not None else None
    threads = evidence.threads if isinstance(evidence, ContentionEvidence) else []
    rows = [t.usage for t in threads if t.usage is not None and t.usage.wall_s]
    if not rows:
        return None, None
    used = statistics.fmean(100.0 * u.cpu_s / u.wall_s for u in rows)
    wanted = statistics.fmean(100.0 * (u.cpu_s + u.wait_s) / u.wall_s for u in rows)
    return round(used, 2), round(min(wanted, 100.0), 2)


def cpu_load(meta: RunMetadata, host: str) -> HostBusy | None:
    """``metadata.cpu_load`` of ``host`` (``emulator`` or ``sender_hypervisor``); None when not recorded."""
    return getattr(meta.cpu_load, host) if meta.cpu_load is not None else None


def emulator_busy(meta: RunMetadata) -> float | None:
    """The emulator's busiest CPU during the transfer, in % (None when the run did not record it)."""
    load = cpu_load(meta, "emulator")
    return load.busiest_cpu_pct if load is not None else None


def host_busy(meta: RunMetadata) -> float | None:
    """How busy the sender's hypervisor host was over all its CPUs during the transfer, in %."""
    load = cpu_load(meta, "sender_hypervisor")
    return load.busy_pct if load is not None else None


def classify_limit(sender_demand_pct: float | None, emulator_busy_pct: float | None,
                   host_busy_pct: float | None = None, of_full_share: float | None = None) -> tuple[str, list[str]]:
    """The limit a point measured and the evidence for it (see the module docstring).

    ``of_full_share`` is the point's ceiling over the full-share ceiling at the same RTT (None at 100 %).
    """
    evidence = []
    if of_full_share is not None:
        evidence.append(f"ceiling {of_full_share:.0%} of the full-share ceiling")
    if sender_demand_pct is not None:
        evidence.append(f"sender vCPU wanted the CPU {sender_demand_pct:.0f} % of the time")
    if emulator_busy_pct is not None:
        evidence.append(f"emulator busiest CPU {emulator_busy_pct:.0f} % busy")
    if host_busy_pct is not None:
        evidence.append(f"sender's hypervisor host {host_busy_pct:.0f} % busy")
    saturated = {
        "sender-cpu": (of_full_share is not None and of_full_share < SHARE_BOUND_FRACTION)
        or (sender_demand_pct is not None and sender_demand_pct >= SENDER_BOUND_DEMAND_PCT),
        "emulator": emulator_busy_pct is not None and emulator_busy_pct >= BUSY_PCT,
        "host-cpu": host_busy_pct is not None and host_busy_pct >= BUSY_PCT,
    }
    return " and ".join(k for k, v in saturated.items() if v) or "undetermined", evidence


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _identity(testbed: TestbedRecord) -> dict:
    """The testbed identity a run recorded (:data:`~bbrlab.run.ceiling.IDENTITY`), as a calibration file keeps it."""
    return {k: getattr(testbed, k) for k in IDENTITY}


def _max(values: list[float]) -> float | None:
    return round(max(values), 3) if values else None


def summarise_point(key: PointKey, records: list[RunRecord], failed: dict[int, int], text: str | None = None) -> CeilingPoint:
    """The ceiling of one point from its ok run records (any stream counts); ``failed`` counts failed runs.

    Per stream count: the median and the maximum of its repetitions; the ceiling is the highest maximum
    (:data:`CEILING_STATISTIC`), its stream count the point's ``streams`` (fewer streams win a tie)."""
    by_streams: dict[str, dict] = {}
    for n in sorted({_streams(r) for r in records} | set(failed)):
        runs = sorted((r for r in records if _streams(r) == n), key=lambda r: r.scenario.repetition)
        values = [round(r.metadata.iperf.receiver_mbit, 3) for r in runs]
        by_streams[str(n)] = {"median_mbit": _median(values), "max_mbit": _max(values), "repetitions_mbit": values,
                              "run_ids": [r.run_id for r in runs], "failed": failed.get(n, 0)}
    measured = {n: v for n, v in by_streams.items() if v["max_mbit"] is not None}
    best = max(measured, key=lambda n: (measured[n]["max_mbit"], -int(n)), default=None)
    chosen = [r.metadata for r in records if best is not None and str(_streams(r)) == best]
    usage = [sender_usage(m) for m in chosen]
    cpu = _median([u[0] for u in usage if u[0] is not None])
    demand = _median([u[1] for u in usage if u[1] is not None])
    emu = _median([b for m in chosen if (b := emulator_busy(m)) is not None])
    host = _median([b for m in chosen if (b := host_busy(m)) is not None])
    times = sorted(r.started_at for r in records)
    return CeilingPoint(
        key=text or key.text, timeslice_ms=key.timeslice_ms, model_tag=key.model_tag, cpu_share_pct=key.cpu_share_pct,
        rtt_ms=key.rtt_ms,
        ceiling_mbit=measured[best]["max_mbit"] if best else None, streams=int(best) if best else None,
        limit=classify_limit(demand, emu, host)[0] if best else "undetermined", sender_cpu_pct=cpu,
        sender_demand_pct=demand, emulator_busy_pct=emu, host_busy_pct=host, by_streams=by_streams,
        testbed=_identity(records[0].metadata.testbed) if records else {},
        measured_from=times[0] if times else None, measured_to=max(r.ended_at for r in records) if records else None)


def _classify(points: list[CeilingPoint]) -> None:
    """Set each point's ``limit`` and ``evidence``, comparing contended points with full share at their RTT."""
    full = {p.rtt_ms: p.ceiling_mbit for p in points if p.timeslice_ms is None}
    for p in points:
        if p.ceiling_mbit is None:
            continue
        base = full.get(p.rtt_ms) if p.timeslice_ms is not None else None
        ratio = p.ceiling_mbit / base if base else None
        p.limit, p.evidence = classify_limit(p.sender_demand_pct, p.emulator_busy_pct, p.host_busy_pct, ratio)


def full_share_reading(full_mbit_by_rtt: dict[str, float | None], bridge_mbit: float | None) -> str:
    """What the bridge reference says about the full-share points, in words."""
    if bridge_mbit is None or not any(v is not None for v in full_mbit_by_rtt.values()):
        return "not measured"
    parts = []
    for rtt, v in full_mbit_by_rtt.items():
        if v is None:
            continue
        if v < SHARE_BOUND_FRACTION * bridge_mbit:
            parts.append(f"RTT {rtt} ms: {v:.0f} Mbit/s through netem against {bridge_mbit:.0f} bridging only: the "
                         "emulated delay path (the emulator and the longer RTT), not the sender alone, limits it")
        else:
            parts.append(f"RTT {rtt} ms: {v:.0f} Mbit/s through netem, {bridge_mbit:.0f} bridging only: netem "
                         "adds no limit of its own")
    return "; ".join(parts)


def read_records(runs_dir: Path) -> tuple[list[RunRecord], list[RunRecord]]:
    """The records of a calibration's runs folder, typed (:func:`typed_record`): ``(ok, failed)``."""
    ok = [typed_record(rec.load_record(p)) for p in sorted((runs_dir / rec.RUNS).glob("*")) if p.is_dir()]
    failed = [typed_record(rec.load_record(p)) for p in sorted((runs_dir / rec.FAILED).glob("*")) if p.is_dir()]
    return ok, failed


def point_of(record: RunRecord) -> PointKey:
    """The calibration point a run record belongs to."""
    return PointKey.of_scenario(record.scenario)


def _streams(record: RunRecord) -> int:
    """How many streams the run's transfer had (a calibration runs iperf3)."""
    return record.scenario.flow.params.streams


def summarise(spec: CalibrationSpec, runs_dir: Path, testbed: dict, *, created_at: str | None = None,
              host_load: dict | None = None, runs_dir_text: str | None = None) -> Calibration:
    """The calibration from the runs in ``runs_dir``; refuses runs made on another testbed or kernel."""
    ok, failed = read_records(runs_dir)
    expected = {k: testbed.get(k) for k in IDENTITY}  # the calibration file's own testbed (a dict)
    strangers = [r.run_id for r in ok if _identity(r.metadata.testbed) != expected]
    if strangers:
        raise CalibrationMismatch(f"{runs_dir} holds runs made on another testbed or sender kernel "
                                  f"({strangers[0]} and {len(strangers) - 1} more); calibrate with --fresh")
    done = {r.run_id for r in ok}
    failures: dict[PointKey, dict[int, int]] = {}
    for r in failed:
        if r.run_id not in done:
            key, n = point_of(r), _streams(r)
            failures.setdefault(key, {}).setdefault(n, 0)
            failures[key][n] += 1
    ref = spec.reference_point()
    grouped: dict[PointKey, list[RunRecord]] = {}
    for r in ok:
        grouped.setdefault(point_of(r), []).append(r)
    points = [summarise_point(k, grouped.get(k, []), failures.get(k, {})) for k in spec.points()]
    _classify(points)
    reference = None
    if ref is not None:
        p = summarise_point(ref, grouped.get(ref, []), failures.get(ref, {}), REFERENCE_KEY)
        full = {f"{q.rtt_ms:g}": q.ceiling_mbit for q in points if q.timeslice_ms is None}
        reference = {"key": REFERENCE_KEY, "bridge_only_mbit": p.ceiling_mbit, "streams": p.streams,
                     "limit": p.limit, "evidence": p.evidence, "sender_demand_pct": p.sender_demand_pct,
                     "emulator_busy_pct": p.emulator_busy_pct, "host_busy_pct": p.host_busy_pct,
                     "by_streams": p.by_streams,
                     "full_share_mbit_by_rtt_ms": full,
                     "reading": full_share_reading(full, p.ceiling_mbit),
                     "meaning": "100 % share, no qdisc on the emulator (bridging only, RTT 0): compare with the "
                                "full-share points to see whether the emulated delay path limits them"}
    configuration = {"cca": CCA, "streams": list(spec.streams), "repetitions": spec.repetitions,
                     "duration_s": spec.duration_s, "delay_split": spec.delay_split,
                     "link": "unshaped: netem delay only (the point's RTT), no rate limit, no bottleneck queue",
                     "ceiling": CEILING_STATISTIC,
                     "spec": spec.to_dict()}
    return Calibration(created_at=created_at or rec.now_iso(), testbed=dict(testbed), configuration=configuration,
                       points=points, runs_dir=runs_dir_text or str(runs_dir), host_load=host_load or {},
                       reference=reference)
