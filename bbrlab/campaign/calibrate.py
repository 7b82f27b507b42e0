"""Measure the sender's CPU ceiling (``bbrlab calibrate``): what the contended sender can carry at all.

For each timeslice x CPU share x RTT of a campaign (or a grid given directly), the least CPU-limited
configuration is run a few times with the contention applied exactly as in a measurement: Cubic, one
stream and several, over an *unshaped* link (the point's RTT as netem delay, no token bucket, no
bottleneck queue: :meth:`bbrlab.core.scenario.Link.unshaped`), each run as long as the campaign's runs
(:meth:`CalibrationSpec.covering`). Each run is a normal run of :class:`bbrlab.run.runner.Runner`, planned and
recorded by the campaign engine, opened the one way a campaign is opened on one testbed
(:func:`bbrlab.campaign.single.run_on_testbed`), in ``DIR/calibration/<key>/``, so a calibration resumes after a
crash and every number in ``DIR/calibration.json`` can be traced to its runs. How
the runs become ceilings (the highest throughput of any run, an upper bound) and which limit each point
measured is :mod:`bbrlab.campaign.ceilings`.

Another contention model than deadline (cfs-quota, cfs-burst, credit, competing-load) is calibrated at its own
points (``model_contentions``, keyed by the model and its parameters: ``cfs100ms-sh25-rtt20ms``), applied as the
campaign applies it, so each model's runs are checked against the ceiling of their own contention.

At 100 % share there is no policy and the timeslice does not matter: that point is run once per RTT
(key ``sh100-rtt20ms``) and stands for every timeslice. A *bridge reference* is run there too: the same
transfer with no qdisc at all on the emulator (RTT 0), to tell what netem itself costs.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.scenario import Contention, DelaySplit, Flow, IperfParams, Link, Scenario
from bbrlab.run import record as rec
from bbrlab.run.ceiling import FILE_NAME, Calibration, PointKey
from bbrlab.run.runner import Runner

from .ceilings import (  # noqa: F401 - the summary's API, also reached through this module
    BUSY_PCT,
    CCA,
    REFERENCE_KEY,
    SENDER_BOUND_DEMAND_PCT,
    SHARE_BOUND_FRACTION,
    classify_limit,
    emulator_busy,
    host_busy,
    point_of,
    read_records,
    sender_usage,
    summarise,
    summarise_point,
)
from .sameness import testbed_differences
from .single import run_on_testbed

DEFAULT_STREAMS = (1, 4)
DEFAULT_REPETITIONS = 3
DEFAULT_DURATION_S = 5
#: Folder of the calibration runs inside the campaign directory (one sub-folder per testbed and grid).
RUNS_FOLDER = "calibration"
#: Seconds a calibration run costs beyond its transfer (probe, link, server, contention, verify, record),
#: measured on the local TCG testbed; for the estimate printed before anything runs.
ESTIMATED_OVERHEAD_S = 5.0


@dataclass(frozen=True)
class CalibrationSpec:
    """The calibration's plan, run by :func:`bbrlab.campaign.loop.run_campaign` like a campaign spec.

    ``points()`` are the timeslice x share x RTT points (100 % once per RTT) and each of ``model_contentions``
    (other models' contentions, as their ``to_dict``) x RTT; ``plan()`` is every point x stream count x
    repetition, each repetition block in a seeded random order. ``timeslices_ms`` may be empty when only other
    models are calibrated.
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
    model_contentions: tuple[dict, ...] = ()

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check every field on construction, each value through the ``Contention``, ``Link`` or ``Flow`` it
        makes; raises :class:`~bbrlab.core.errors.ValidationError` naming the first bad field."""
        for key in ("timeslices_ms", "cpu_shares_pct", "rtts_ms", "streams"):
            values = getattr(self, key)
            if not isinstance(values, tuple) or not (values or key == "timeslices_ms" and self.model_contentions):
                raise ValidationError(key, values, "a non-empty list")
            if len(set(values)) != len(values):
                raise ValidationError(key, list(values), "distinct values")
        self._check_model_contentions()
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
                IperfParams(streams=n)
            except ValidationError as e:
                raise ValidationError(f"streams[{i}]", n, e.allowed) from None
        if isinstance(self.repetitions, bool) or not isinstance(self.repetitions, int) \
                or not 1 <= self.repetitions <= 100:
            raise ValidationError("repetitions", self.repetitions, "a whole number from 1 to 100")
        try:
            IperfParams(duration_s=self.duration_s)
        except ValidationError as e:
            raise ValidationError("duration_s", self.duration_s, e.allowed) from None

    def _check_model_contentions(self) -> None:
        for i, d in enumerate(self.model_contentions):
            try:
                c = Contention(**d) if isinstance(d, dict) else None
            except (TypeError, ValidationError) as e:
                raise ValidationError(f"model_contentions[{i}]", d, getattr(e, "allowed", "a contention's fields")) from None
            if c is None or c.model == "deadline" or c.unlimited:
                raise ValidationError(f"model_contentions[{i}]", d, "a contention of another model than deadline, "
                                      "below 100 % (deadline is calibrated by timeslices_ms)")

    def contentions(self) -> list[Contention]:
        """The other models' contentions to calibrate."""
        return [Contention(**d) for d in self.model_contentions]

    @classmethod
    def for_campaign(cls, spec, **overrides) -> CalibrationSpec:
        """The calibration of a :class:`~bbrlab.campaign.spec.CampaignSpec`'s timeslices, shares and RTTs."""
        return cls.covering([spec], f"{spec.name}-calibration", **overrides)

    @classmethod
    def covering(cls, specs, name: str, **overrides) -> CalibrationSpec:
        """One calibration for every timeslice, share and RTT of several campaign specs (same delay split).

        Its runs last as long as the longest iperf3 duration of the specs (``duration_s`` overrides it): at a
        low share a transfer still speeds up after several seconds, so a shorter run cannot bound a longer one
        (docs/calibration.md)."""
        splits = {s.delay_split for s in specs}
        if len(splits) != 1:
            raise ValidationError("delay_split", sorted(splits), "the same in every spec calibrated together")

        def union(key: str, of=specs) -> tuple:
            return tuple(sorted({v for s in of for v in getattr(s, key)}))

        models = {json.dumps(c.to_dict(), sort_keys=True) for s in specs for c in s.contentions()
                  if c.model != "deadline" and not c.unlimited}
        deadline = [s for s in specs if "deadline" in s.contention_models]
        fields = {"name": name, "timeslices_ms": union("timeslices_ms", deadline) if deadline or not models else (),
                  "cpu_shares_pct": union("cpu_shares_pct"), "rtts_ms": union("rtts_ms"), "delay_split": splits.pop(),
                  "duration_s": max(s.duration_s for s in specs),
                  "model_contentions": tuple(json.loads(m) for m in sorted(models))}
        return cls(**{**fields, **overrides})

    # -- the points and the plan ------------------------------------------------------------------
    def points(self) -> list[PointKey]:
        """Contended points for every timeslice and every other model's contention, the 100 % point once per
        RTT; sorted."""
        keys = {PointKey.of(ts, share, rtt) for ts, share, rtt in
                itertools.product(self.timeslices_ms, self.cpu_shares_pct, self.rtts_ms)}
        keys |= {PointKey.of_contention(c, rtt) for c in self.contentions() for rtt in self.rtts_ms}
        keys |= {PointKey.of(0, 100, rtt) for rtt in self.rtts_ms if max(self.cpu_shares_pct) >= 100}
        return sorted(keys, key=lambda k: (k.rtt_ms, k.model_tag or "", k.timeslice_ms or 0.0, k.cpu_share_pct))

    def _contention(self, key: PointKey) -> Contention:
        """The contention of a point: its model's (found by tag and share), or deadline's timeslice x share."""
        if key.model_tag is not None:
            return next(c for c in self.contentions()
                        if PointKey.of_contention(c, key.rtt_ms) == key)
        ts = key.timeslice_ms if key.timeslice_ms is not None else min(self.timeslices_ms, default=1.0)
        return Contention(ts, key.cpu_share_pct)

    def _scenario(self, key: PointKey, streams: int, repetition: int, *, rtt_ms: float | None = None) -> Scenario:
        link = Link.unshaped(key.rtt_ms if rtt_ms is None else rtt_ms, delay_split=self.delay_split)
        return Scenario(link, self._contention(key), Flow(CCA, IperfParams(self.duration_s, streams)),
                        repetition)

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
        if not self.model_contentions:
            del d["model_contentions"]  # a deadline calibration keeps its digest (and its runs' folder)
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
        s, point = record["scenario"], point_of(record)
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
    ok, _ = read_records(runs_dir)
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
        ts = p.model_tag or ("any" if p.timeslice_ms is None else f"{p.timeslice_ms:g} ms")
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
