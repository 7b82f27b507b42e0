"""Measure the sender's CPU ceiling (``bbrlab calibrate``): what the contended sender can carry at all.

For each timeslice x CPU share x RTT of a campaign (or a grid given directly), the least CPU-limited
configuration is run a few times with the contention applied exactly as in a measurement: Cubic, one
stream and several, over an *unshaped* link (the point's RTT as netem delay, no token bucket, no
bottleneck queue: :meth:`bbrlab.core.scenario.Link.unshaped`). The point's ceiling is the median throughput of
the better stream count. Each run is a normal run of :class:`bbrlab.run.runner.Runner`, planned and recorded
by the campaign engine (:func:`bbrlab.campaign.loop.run_campaign`) in ``DIR/calibration/<key>/``, so a
calibration resumes after a crash and every number in ``DIR/calibration.json`` can be traced to its runs.

At 100 % share there is no policy and the timeslice does not matter: that point is run once per RTT
(key ``sh100-rtt20ms``) and stands for every timeslice. A *bridge reference* is run there too: the same
transfer with no qdisc at all on the emulator (RTT 0), to tell what netem itself costs.

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

API::

    from bbrlab.campaign import calibrate
    spec = calibrate.CalibrationSpec.for_campaign(load_spec("specs/demo.yaml"))
    cal = calibrate.calibrate(testbed, spec, "runs/demo")      # writes runs/demo/calibration.json
    cal.find(PointKey.of(10, 25, 20)).ceiling_mbit
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.scenario import Contention, DelaySplit, Flow, Link, Scenario
from bbrlab.run import record as rec
from bbrlab.run.ceiling import FILE_NAME, IDENTITY, Calibration, CalibrationMismatch, CeilingPoint, PointKey
from bbrlab.run.runner import Runner

from .sameness import testbed_differences
from .single import run_on_testbed

CCA = "cubic"
DEFAULT_STREAMS = (1, 4)
DEFAULT_REPETITIONS = 3
DEFAULT_DURATION_S = 5
#: Folder of the calibration runs inside the campaign directory (one sub-folder per testbed and grid).
RUNS_FOLDER = "calibration"
#: Above this share of the time wanting the CPU, the sender is the limit.
SENDER_BOUND_DEMAND_PCT = 90.0
#: Above this busy share (the emulator's busiest CPU, the hypervisor host's CPUs), that host is the limit.
BUSY_PCT = 90.0
#: A contended point whose ceiling is below this fraction of the full-share ceiling is limited by its share.
SHARE_BOUND_FRACTION = 0.9
#: Seconds a calibration run costs beyond its transfer (probe, link, server, contention, verify, record),
#: measured on the local TCG testbed; for the estimate printed before anything runs.
ESTIMATED_OVERHEAD_S = 5.0
#: The point key of the bridge reference (no qdisc at all, 100 % share).
REFERENCE_KEY = "bridge-sh100-rtt0ms"


@dataclass(frozen=True)
class CalibrationSpec:
    """The calibration's plan, run by :func:`bbrlab.campaign.loop.run_campaign` like a campaign spec.

    ``points()`` are the timeslice x share x RTT points (100 % once per RTT); ``plan()`` is every
    point x stream count x repetition, each repetition block in a seeded random order.
    """

    name: str
    timeslices_ms: tuple[float, ...]
    cpu_shares_pct: tuple[float, ...]
    rtts_ms: tuple[float, ...]
    streams: tuple[int, ...] = DEFAULT_STREAMS
    repetitions: int = DEFAULT_REPETITIONS
    duration_s: float = DEFAULT_DURATION_S
    delay_split: DelaySplit = "symmetric"
    bridge_reference: bool = True
    seed: int = 1
    max_attempts: int = 2

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check every field on construction, each value through the ``Contention``, ``Link`` or ``Flow`` it
        makes; raises :class:`~bbrlab.core.errors.ValidationError` naming the first bad field."""
        for key in ("timeslices_ms", "cpu_shares_pct", "rtts_ms", "streams"):
            values = getattr(self, key)
            if not isinstance(values, tuple) or not values:
                raise ValidationError(key, values, "a non-empty list")
            if len(set(values)) != len(values):
                raise ValidationError(key, list(values), "distinct values")
        for i, ts in enumerate(self.timeslices_ms):
            for j, share in enumerate(self.cpu_shares_pct):
                try:
                    Contention(ts, share)
                except ValidationError as e:
                    raise ValidationError(f"cpu_shares_pct[{j}] with timeslices_ms[{i}]", (share, ts),
                                          e.allowed) from None
        for i, rtt in enumerate(self.rtts_ms):
            try:
                Link.unshaped(rtt, delay_split=self.delay_split)
            except ValidationError as e:
                raise ValidationError(f"rtts_ms[{i}]", rtt, e.allowed) from None
        for i, n in enumerate(self.streams):
            try:
                Flow(CCA, streams=n)
            except ValidationError as e:
                raise ValidationError(f"streams[{i}]", n, e.allowed) from None
        if isinstance(self.repetitions, bool) or not isinstance(self.repetitions, int) \
                or not 1 <= self.repetitions <= 100:
            raise ValidationError("repetitions", self.repetitions, "a whole number from 1 to 100")
        try:
            Flow(CCA, duration_s=self.duration_s)
        except ValidationError as e:
            raise ValidationError("duration_s", self.duration_s, e.allowed) from None

    @classmethod
    def for_campaign(cls, spec, **overrides) -> CalibrationSpec:
        """The calibration of a :class:`~bbrlab.campaign.spec.CampaignSpec`'s timeslices, shares and RTTs."""
        return cls.covering([spec], f"{spec.name}-calibration", **overrides)

    @classmethod
    def covering(cls, specs, name: str, **overrides) -> CalibrationSpec:
        """One calibration for every timeslice, share and RTT of several campaign specs (same delay split)."""
        splits = {s.delay_split for s in specs}
        if len(splits) != 1:
            raise ValidationError("delay_split", sorted(splits), "the same in every spec calibrated together")

        def union(key: str) -> tuple:
            return tuple(sorted({v for s in specs for v in getattr(s, key)}))

        fields = {"name": name, "timeslices_ms": union("timeslices_ms"), "cpu_shares_pct": union("cpu_shares_pct"),
                  "rtts_ms": union("rtts_ms"), "delay_split": splits.pop()}
        return cls(**{**fields, **overrides})

    # -- the points and the plan ------------------------------------------------------------------
    def points(self) -> list[PointKey]:
        """Contended points for every timeslice, the 100 % point once per RTT; sorted."""
        keys = {PointKey.of(ts, share, rtt) for ts, share, rtt in
                itertools.product(self.timeslices_ms, self.cpu_shares_pct, self.rtts_ms)}
        return sorted(keys, key=lambda k: (k.rtt_ms, k.timeslice_ms or 0.0, k.cpu_share_pct))

    def _scenario(self, key: PointKey, streams: int, repetition: int, *, rtt_ms: float | None = None) -> Scenario:
        ts = key.timeslice_ms if key.timeslice_ms is not None else min(self.timeslices_ms)
        link = Link.unshaped(key.rtt_ms if rtt_ms is None else rtt_ms, delay_split=self.delay_split)
        return Scenario(link, Contention(ts, key.cpu_share_pct),
                        Flow(CCA, duration_s=self.duration_s, streams=streams), repetition)

    def reference_point(self) -> PointKey | None:
        """The bridge reference (no qdisc, 100 %), when asked for and some RTT is not already 0."""
        if not self.bridge_reference or all(r == 0 for r in self.rtts_ms):
            return None
        return PointKey(None, 100.0, 0.0)

    def scenarios_of(self, key: PointKey, repetition: int) -> list[Scenario]:
        """Repetition ``repetition`` of point ``key``: one scenario per stream count of ``streams``."""
        return [self._scenario(key, n, repetition) for n in self.streams]

    def plan(self) -> list[Scenario]:
        """Every scenario to run: the points (and the bridge reference) x stream counts, one block per
        repetition, each block shuffled with ``seed``."""
        keys = self.points() + ([self.reference_point()] if self.reference_point() else [])
        rng = random.Random(self.seed)
        out: list[Scenario] = []
        for r in range(self.repetitions):
            block = [s for k in keys for s in self.scenarios_of(k, r)]
            rng.shuffle(block)
            out.extend(block)
        return out

    def expected_duration_s(self, overhead_s: float = ESTIMATED_OVERHEAD_S) -> float:
        """Estimated wall time of the whole plan in seconds: each run's transfer plus ``overhead_s``
        (:data:`ESTIMATED_OVERHEAD_S` by default)."""
        return len(self.plan()) * (self.duration_s + overhead_s)

    def to_dict(self) -> dict:
        """The fields as plain YAML/JSON types (tuples as lists): the campaign directory's ``spec.yaml``."""
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> CalibrationSpec:
        """The spec back from :meth:`to_dict`'s dict; raises :class:`~bbrlab.core.errors.ValidationError` for
        an unknown key or a value :meth:`validate` refuses."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValidationError(unknown[0], d[unknown[0]], f"a known key: {', '.join(sorted(known))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def digest(self) -> str:
        """Identifies the grid and configuration (not the name): names the runs' folder."""
        d = {k: v for k, v in self.to_dict().items() if k != "name"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


# ---------------------------------------------------------------------------------------------
# Summarising the runs into ceilings
# ---------------------------------------------------------------------------------------------

def sender_usage(record: dict) -> tuple[float | None, float | None]:
    """(CPU used, CPU wanted) by the sender's vCPU threads in % of wall time, averaged over threads.

    Wanted = running + runnable but waiting (under SCHED_DEADLINE the throttled time counts as waiting).
    """
    threads = (((record.get("metadata") or {}).get("contention") or {}).get("evidence") or {}).get("threads") or []
    rows = [t for t in threads if t.get("wall_s")]
    if not rows:
        return None, None
    used = statistics.fmean(100.0 * t.get("cpu_s", 0.0) / t["wall_s"] for t in rows)
    wanted = statistics.fmean(100.0 * (t.get("cpu_s", 0.0) + t.get("wait_s", 0.0)) / t["wall_s"] for t in rows)
    return round(used, 2), round(min(wanted, 100.0), 2)


def cpu_load(record: dict, host: str) -> dict:
    """``metadata.cpu_load[host]`` (``emulator`` or ``sender_hypervisor``); empty when not recorded."""
    return (((record.get("metadata") or {}).get("cpu_load") or {}).get(host)) or {}


def emulator_busy(record: dict) -> float | None:
    """The emulator's busiest CPU during the transfer, in % (None when the run did not record it)."""
    load = cpu_load(record, "emulator")
    return load.get("busiest_cpu_pct", load.get("busy_pct"))


def host_busy(record: dict) -> float | None:
    """How busy the sender's hypervisor host was over all its CPUs during the transfer, in %."""
    return cpu_load(record, "sender_hypervisor").get("busy_pct")


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


def _identity(testbed: dict) -> dict:
    return {k: testbed.get(k) for k in IDENTITY}


def summarise_point(key: PointKey, records: list[dict], failed: dict[int, int], text: str | None = None) -> CeilingPoint:
    """The ceiling of one point from its ok run records (any stream counts); ``failed`` counts failed runs."""
    by_streams: dict[str, dict] = {}
    for n in sorted({r["scenario"]["flow"]["streams"] for r in records} | set(failed)):
        runs = sorted((r for r in records if r["scenario"]["flow"]["streams"] == n),
                      key=lambda r: r["scenario"]["repetition"])
        values = [round(r["metadata"]["iperf"]["receiver_mbit"], 3) for r in runs]
        by_streams[str(n)] = {"median_mbit": _median(values), "repetitions_mbit": values,
                              "run_ids": [r["run_id"] for r in runs], "failed": failed.get(n, 0)}
    measured = {n: v for n, v in by_streams.items() if v["median_mbit"] is not None}
    best = max(measured, key=lambda n: (measured[n]["median_mbit"], -int(n)), default=None)
    chosen = [r for r in records if best is not None and str(r["scenario"]["flow"]["streams"]) == best]
    usage = [sender_usage(r) for r in chosen]
    cpu = _median([u[0] for u in usage if u[0] is not None])
    demand = _median([u[1] for u in usage if u[1] is not None])
    emu = _median([b for r in chosen if (b := emulator_busy(r)) is not None])
    host = _median([b for r in chosen if (b := host_busy(r)) is not None])
    times = sorted(r["started_at"] for r in records)
    return CeilingPoint(
        key=text or key.text, timeslice_ms=key.timeslice_ms, cpu_share_pct=key.cpu_share_pct, rtt_ms=key.rtt_ms,
        ceiling_mbit=measured[best]["median_mbit"] if best else None, streams=int(best) if best else None,
        limit=classify_limit(demand, emu, host)[0] if best else "undetermined", sender_cpu_pct=cpu,
        sender_demand_pct=demand, emulator_busy_pct=emu, host_busy_pct=host, by_streams=by_streams,
        testbed=_identity((records[0].get("metadata") or {}).get("testbed") or {}) if records else {},
        measured_from=times[0] if times else None, measured_to=max(r["ended_at"] for r in records) if records else None)


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


def _read_records(runs_dir: Path) -> tuple[list[dict], list[dict]]:
    ok = [rec.load_record(p) for p in sorted((runs_dir / rec.RUNS).glob("*")) if p.is_dir()]
    failed = [rec.load_record(p) for p in sorted((runs_dir / rec.FAILED).glob("*")) if p.is_dir()]
    return ok, failed


def _point_of(record: dict) -> PointKey:
    s = Scenario.from_dict(record["scenario"])
    return PointKey.of_scenario(s)


def summarise(spec: CalibrationSpec, runs_dir: Path, testbed: dict, *, created_at: str | None = None,
              host_load: dict | None = None, runs_dir_text: str | None = None) -> Calibration:
    """The calibration from the runs in ``runs_dir``; refuses runs made on another testbed or kernel."""
    ok, failed = _read_records(runs_dir)
    strangers = [r["run_id"] for r in ok if _identity((r.get("metadata") or {}).get("testbed") or {})
                 != _identity(testbed)]
    if strangers:
        raise CalibrationMismatch(f"{runs_dir} holds runs made on another testbed or sender kernel "
                                  f"({strangers[0]} and {len(strangers) - 1} more); calibrate with --fresh")
    done = {r["run_id"] for r in ok}
    failures: dict[PointKey, dict[int, int]] = {}
    for r in failed:
        if r["run_id"] not in done:
            key, n = _point_of(r), r["scenario"]["flow"]["streams"]
            failures.setdefault(key, {}).setdefault(n, 0)
            failures[key][n] += 1
    ref = spec.reference_point()
    grouped: dict[PointKey, list[dict]] = {}
    for r in ok:
        grouped.setdefault(_point_of(r), []).append(r)
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
                     "ceiling": "median receiver throughput of the better stream count",
                     "spec": spec.to_dict()}
    return Calibration(created_at=created_at or rec.now_iso(), testbed=dict(testbed), configuration=configuration,
                       points=points, runs_dir=runs_dir_text or str(runs_dir), host_load=host_load or {},
                       reference=reference)


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------

def runs_key(testbed: dict, spec: CalibrationSpec) -> str:
    """The runs' folder name: testbed, accelerator, sender kernel and grid, so a calibration on another
    testbed or kernel never resumes (or mixes with) this one."""
    parts = [testbed.get("name"), testbed.get("accelerator"), testbed.get("sender_kernel"), spec.digest()]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(p) for p in parts))


def host_load() -> dict:
    """The load of the machine bbrlab runs on (for a local testbed, the machine that runs the VMs)."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1_5_15": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": os.cpu_count(),
            "at": rec.now_iso()}


def calibrate(testbed, spec: CalibrationSpec, out_dir: str | Path, *, runner=None, progress: bool = True,
              fresh: bool = False, say: Callable[[str], None] | None = None) -> Calibration:
    """Measure the ceilings of ``spec`` on ``testbed`` and write ``out_dir/calibration.json``.

    The runs go to ``out_dir/calibration/<testbed-accelerator-kernel-grid>/``; complete runs there are
    reused (a killed calibration resumes), and when all are complete and ``calibration.json`` already
    summarises them it is returned as it is (so runs that point to it stay valid). ``fresh`` moves that
    folder aside first and measures anew.
    ``runner`` (a :class:`~bbrlab.run.runner.Runner` without a calibration) may be shared with a campaign;
    the caller holds the testbed lock and closes the runner. ``say`` gets one line per finished run. A CPU
    partition a killed campaign left is removed first (one whose campaign still runs is refused,
    :func:`bbrlab.run.recovery.clear_partitions`).
    """

    out = Path(out_dir)
    described = testbed.describe()
    runs_dir = out / RUNS_FOLDER / runs_key(described, spec)
    if fresh and runs_dir.exists():
        os.replace(runs_dir, runs_dir.with_name(f"{runs_dir.name}.replaced-{rec.now_iso().replace(':', '')}"))
    differences = testbed_differences(runs_dir, [described])
    if differences:  # the folder's name holds testbed, accelerator and kernel, not e.g. the sender's vCPUs
        raise ValidationError("--testbed", described.get("name"), f"the testbed these calibration runs were made on: "
                              f"{'; '.join(differences)}. Bring that testbed back, or calibrate with --fresh to "
                              f"measure anew (the runs in {runs_dir} are moved aside)")
    existing = _complete_calibration(out, runs_dir)
    if existing is not None:
        return existing
    runner = runner or Runner(testbed)
    if getattr(runner, "calibration", None) is not None:
        raise BbrlabError("calibrate needs a Runner without a calibration (its runs define the ceilings)")
    load_before = host_load()

    def on_run(record: dict) -> None:
        if say is None:
            return
        s, point = record["scenario"], _point_of(record)
        key = REFERENCE_KEY if point == spec.reference_point() else point.text
        thr = ((record.get("metadata") or {}).get("iperf") or {}).get("receiver_mbit")
        used, wanted = sender_usage(record) if record["status"] == "ok" else (None, None)
        emu, host = (emulator_busy(record), host_busy(record)) if record["status"] == "ok" else (None, None)
        what = f"{thr:.1f} Mbit/s" if thr is not None else f"failed: {record['reason']}"
        say(f"  {key} {s['flow']['streams']} stream(s) rep {s['repetition']}: {what}"
            + (f" (sender vCPU used {_pct(used)}, wanted {_pct(wanted)}; emulator busiest CPU {_pct(emu)}; "
               f"host {_pct(host)})" if record["status"] == "ok" else ""))

    # the one way a campaign is opened on one testbed; it removes a CPU partition a killed campaign left first
    # (ceilings measured on a partition's few CPUs would be wrong)
    run_on_testbed(spec, runs_dir, testbed, runner=runner, progress=progress, on_run=on_run)
    testbed_now = dict(described)
    ok, _ = _read_records(runs_dir)
    if ok:  # the sender's kernel as the runs' own probes read it
        testbed_now["sender_kernel"] = ok[-1]["metadata"]["testbed"].get("sender_kernel")
    cal = summarise(spec, runs_dir, testbed_now, host_load={"before": load_before, "after": host_load()},
                    runs_dir_text=os.path.relpath(runs_dir, out))
    cal.save(out / FILE_NAME)
    return cal


def _complete_calibration(out: Path, runs_dir: Path) -> Calibration | None:
    """The calibration file in ``out`` when it summarises ``runs_dir`` and nothing is left to run there."""
    from bbrlab.run.ceiling import load

    from .directory import status

    path = out / FILE_NAME
    if not path.is_file() or not (runs_dir / "plan.json").is_file():
        return None
    st = status(runs_dir)
    if st.remaining or st.running:
        return None
    cal = load(path)
    return cal if cal.runs_dir == os.path.relpath(runs_dir, out) else None


def grid_table(cal: Calibration) -> list[list[str]]:
    """The ceilings as rows ``[key, rtt, timeslice, share, ceiling, streams, limit, sender used/wanted,
    emulator, host]``."""
    rows = []
    for p in cal.points:
        ts = "any" if p.timeslice_ms is None else f"{p.timeslice_ms:g} ms"
        rows.append([p.key, f"{p.rtt_ms:g} ms", ts, f"{p.cpu_share_pct:g} %",
                     "-" if p.ceiling_mbit is None else f"{p.ceiling_mbit:.1f}", str(p.streams or "-"), p.limit,
                     _pct_pair(p.sender_cpu_pct, p.sender_demand_pct), _pct(p.emulator_busy_pct),
                     _pct(p.host_busy_pct)])
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} %"


def _pct_pair(a: float | None, b: float | None) -> str:
    return f"{_pct(a)} / {_pct(b)}"


def format_grid(cal: Calibration) -> str:
    """The ceiling grid as aligned text (what ``bbrlab calibrate`` prints)."""
    head = ["point", "RTT", "timeslice", "share", "ceiling Mbit/s", "streams", "limit", "sender CPU used / wanted",
            "emulator busiest CPU", "host CPUs"]
    rows = [head, *grid_table(cal)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if cal.reference:
        r = cal.reference
        bridge = "-" if r.get("bridge_only_mbit") is None else f"{r['bridge_only_mbit']:.1f} Mbit/s"
        lines.append(f"bridge reference (100 %, no qdisc on the emulator): {bridge}, {r.get('streams') or '-'} "
                     f"stream(s), sender wanted {_pct(r.get('sender_demand_pct'))}, emulator busiest CPU "
                     f"{_pct(r.get('emulator_busy_pct'))}, host {_pct(r.get('host_busy_pct'))}; {r.get('reading')}")
    t = cal.testbed
    load = (cal.host_load.get("before") or {}).get("loadavg_1_5_15")
    lines.append(f"testbed {t.get('name')} ({t.get('kind')}, {t.get('accelerator')}), sender kernel "
                 f"{t.get('sender_kernel')}, {t.get('sender_vcpus') or '?'} vCPU; measured {cal.created_at}"
                 + (f"; host load average before {load}" if load else ""))
    return "\n".join(lines)
