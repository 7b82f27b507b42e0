"""The calibration file (``calibration.json``): the sender's CPU ceiling per contention, CPU share and RTT.

A point is keyed by its deadline timeslice, or (another contention model) by the model and its parameters as in a
run id (``model_tag``: ``cfs100ms``, ``cfs100ms-burst5ms``, ``credit10s-cfs100ms``, ``load``; deadline with an
implicit deadline ``ts10ms-implicit``), so a cfs-quota run never takes a deadline ceiling, nor an implicit run a
constrained one; at 100 % share every model is the same uncontended point.

A ceiling is what the contended sender can carry at all: the median throughput of the least CPU-limited
configuration (Cubic, the better of one and several streams, an unshaped link with the point's RTT),
measured by :mod:`bbrlab.calibration.calibrate`. A run whose link rate is at or above the ceiling of its point
measures the sender's CPU, not its congestion control.

This module is the file and its use: the schema (:data:`SCHEMA`), reading and writing, finding the point
of a scenario, the pointer a run record keeps (``metadata.ceiling``), and the check that a calibration
belongs to the testbed it is used on (:data:`IDENTITY`: the same testbed, accelerator, sender kernel and
vCPU count). A calibration made elsewhere is refused, never used silently.

Schema ``bbrlab.calibration/1`` (docs/calibration.md)::

    {"schema": "bbrlab.calibration/1", "created_at": ISO, "testbed": {name, kind, accelerator,
     sender_kernel, sender_vcpus, hypervisor, ...}, "configuration": {cca, streams, repetitions,
     duration_s, link, delay_split}, "runs_dir": "calibration/<key>", "host_load": {...},
     "points": [{"key", "timeslice_ms" (null at 100 %), "model_tag" (other models than deadline only),
                 "cpu_share_pct", "rtt_ms", "ceiling_mbit",
                 "streams", "limit", "evidence", "sender_cpu_pct", "sender_demand_pct",
                 "emulator_busy_pct", "host_busy_pct", "by_streams": {"1": {"median_mbit", "repetitions_mbit", "run_ids", "failed"}, ...},
                 "testbed": {...as the runs recorded it}, "measured_from", "measured_to"}],
     "reference": {"bridge_only_mbit", ...} | null}
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.scenario.scenario import Contention, Scenario

from .record import write_json_atomic
from .runmeta import CeilingPointer

SCHEMA = "bbrlab.calibration/1"
FILE_NAME = "calibration.json"
#: The largest calibration file read, checked before reading: the demo's, of 12 link points, has 14 kB; a
#: calibration of a few thousand points fits.
MAX_FILE_BYTES = 16 << 20
#: What must be equal between the calibration's testbed and the one a run uses.
IDENTITY = ("name", "kind", "accelerator", "sender_kernel", "sender_vcpus")
#: What a point's ``limit`` names, joined with " and " when several were saturated, or "undetermined"
#: (see :func:`bbrlab.calibration.ceilings.classify_limit`).
LIMITS = ("sender-cpu", "emulator", "host-cpu")


class CalibrationMismatch(BbrlabError):
    """A calibration does not belong to this testbed, or lacks a point: it is not used."""


@dataclass(frozen=True)
class PointKey:
    """A calibration point: timeslice (None when the share is 100 %: no policy, any timeslice), share, RTT, and
    for a contention model other than deadline ``model_tag`` (the model and its parameters, :func:`model_tag`;
    None for deadline and at 100 %)."""

    timeslice_ms: float | None
    cpu_share_pct: float
    rtt_ms: float
    model_tag: str | None = None

    @classmethod
    def of(cls, timeslice_ms: float, cpu_share_pct: float, rtt_ms: float, model_tag: str | None = None) -> PointKey:
        """The key of a point; at 100 % share (no policy) the timeslice and the model are dropped (None), so
        any timeslice or model matches.
        """
        full = cpu_share_pct >= 100
        return cls(None if full else float(timeslice_ms), 100.0 if full else float(cpu_share_pct), float(rtt_ms),
                   None if full else model_tag)

    @classmethod
    def of_contention(cls, contention: Contention, rtt_ms: float) -> PointKey:
        """The key of a contention at an RTT (ms)."""
        c = contention
        return cls.of(c.timeslice_ms, 100.0 if c.unlimited else c.cpu_share_pct, rtt_ms, model_tag(c))

    @classmethod
    def of_scenario(cls, scenario: Scenario) -> PointKey:
        """The key of a scenario's contention (timeslice or model, CPU share) and RTT (ms)."""
        return cls.of_contention(scenario.contention, scenario.link.rtt_ms)

    @property
    def text(self) -> str:
        """``ts10ms-sh25-rtt20ms``; ``cfs100ms-sh25-rtt20ms`` for another model; ``sh100-rtt20ms`` at full share."""
        if self.model_tag is not None:
            head = f"{self.model_tag}-"
        else:
            head = "" if self.timeslice_ms is None else f"ts{self.timeslice_ms:g}ms-"
        return f"{head}sh{self.cpu_share_pct:g}-rtt{self.rtt_ms:g}ms"


def model_tag(contention: Contention) -> str | None:
    """A contention's model and parameters as a calibration key holds them: its run-id tag without the share
    (``cfs100ms``, ``load``, ``ts10ms-implicit``); None for deadline with its default, constrained deadline (its
    timeslice is the key) and without contention."""
    constrained = contention.kind.uses_timeslice and contention.deadline_mode == "constrained"
    if constrained or contention.unlimited:
        return None
    return contention.id_tag.rsplit("-sh", 1)[0]


@dataclass
class CeilingPoint:
    """One point of the calibration (see the module docstring for each field)."""

    key: str
    timeslice_ms: float | None
    cpu_share_pct: float
    rtt_ms: float
    ceiling_mbit: float | None
    streams: int | None
    limit: str
    model_tag: str | None = None
    sender_cpu_pct: float | None = None
    sender_demand_pct: float | None = None
    emulator_busy_pct: float | None = None
    host_busy_pct: float | None = None
    evidence: list[str] = field(default_factory=list)
    by_streams: dict[str, dict] = field(default_factory=dict)
    testbed: dict = field(default_factory=dict)
    measured_from: str | None = None
    measured_to: str | None = None

    @property
    def point(self) -> PointKey:
        """This point's :class:`PointKey` (a missing timeslice counts as 0 ms, dropped anyway at 100 %
        share).
        """
        return PointKey.of(self.timeslice_ms if self.timeslice_ms is not None else 0.0, self.cpu_share_pct,
                           self.rtt_ms, self.model_tag)


@dataclass
class Calibration:
    """A calibration file's content; ``path`` is where it was read from or written to (not stored)."""

    created_at: str
    testbed: dict
    configuration: dict
    points: list[CeilingPoint]
    runs_dir: str | None = None
    host_load: dict = field(default_factory=dict)
    reference: dict | None = None
    schema: str = SCHEMA
    path: Path | None = field(default=None, compare=False)

    # -- reading and writing ------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The file's JSON content: ``schema`` first, then every field but ``path``."""
        d = asdict(self)
        d.pop("path")
        for point in d["points"]:  # a deadline point keeps the keys it always had (and its file the same digest)
            if point["model_tag"] is None:
                del point["model_tag"]
        return {"schema": d.pop("schema"), **d}

    @classmethod
    def from_dict(cls, data: object, path: Path | None = None) -> Calibration:
        """Read a calibration file's JSON; raise :class:`~bbrlab.core.errors.ValidationError` naming the
        field (prefixed by ``path``) on a wrong schema or a missing field.
        """
        where = str(path or "calibration")
        if not isinstance(data, dict):
            raise ValidationError(where, type(data).__name__, f"a JSON object with schema {SCHEMA}")
        if data.get("schema") != SCHEMA:
            raise ValidationError(f"{where}: schema", data.get("schema"), SCHEMA)
        for key in ("created_at", "testbed", "configuration", "points"):
            if key not in data:
                raise ValidationError(f"{where}: {key}", None, "required")
        known = {f for f in CeilingPoint.__dataclass_fields__}
        points = []
        for i, p in enumerate(data["points"]):
            if not isinstance(p, dict) or not {"key", "cpu_share_pct", "rtt_ms", "ceiling_mbit", "limit"} <= set(p):
                raise ValidationError(f"{where}: points[{i}]", p, "an object with key, cpu_share_pct, rtt_ms, "
                                      "ceiling_mbit, limit")
            points.append(CeilingPoint(**{k: v for k, v in p.items() if k in known}))
        return cls(created_at=data["created_at"], testbed=dict(data["testbed"]),
                   configuration=dict(data["configuration"]), points=points, runs_dir=data.get("runs_dir"),
                   host_load=dict(data.get("host_load") or {}), reference=data.get("reference"), path=path)

    def save(self, path: str | Path) -> Path:
        """Write atomically (a reader never sees half a file); remembers ``path``."""

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, self.to_dict())
        self.path = path
        return path

    # -- using it -----------------------------------------------------------------------------
    def find(self, key: PointKey) -> CeilingPoint | None:
        """The calibrated point with this key, or None when the calibration did not measure it."""
        return next((p for p in self.points if p.point == key), None)

    def mismatches(self, testbed: dict) -> list[str]:
        """How ``testbed`` (``Testbed.describe()`` or a record's ``metadata.testbed``) differs in identity."""
        return [f"{k}: calibrated on {self.testbed.get(k)!r}, now {testbed.get(k)!r}" for k in IDENTITY
                if self.testbed.get(k) != testbed.get(k)]

    def check_testbed(self, testbed: dict) -> None:
        """Raise :class:`CalibrationMismatch` unless the calibration was made on this testbed, as it is now."""
        diffs = self.mismatches(testbed)
        if diffs:
            raise CalibrationMismatch(f"the calibration {self.path or ''} belongs to another testbed "
                                      f"({'; '.join(diffs)}): calibrate again (bbrlab calibrate)")

    def missing(self, scenarios) -> list[str]:
        """Keys of the scenarios' points that the calibration lacks (or could not measure)."""
        keys = {PointKey.of_scenario(s) for s in scenarios}
        return sorted(k.text for k in keys if (p := self.find(k)) is None or p.ceiling_mbit is None)

    def pointer(self, scenario: Scenario, testbed: dict, source: str | None = None) -> CeilingPointer:
        """``metadata.ceiling`` of a run of ``scenario`` on ``testbed``; raises if stale or missing."""
        self.check_testbed(testbed)
        key = PointKey.of_scenario(scenario)
        point = self.find(key)
        if point is None or point.ceiling_mbit is None:
            raise CalibrationMismatch(f"the calibration {self.path or ''} has no ceiling for {key.text}: "
                                      "calibrate this campaign's grid (bbrlab calibrate SPEC --out DIR)")
        return CeilingPointer(point.ceiling_mbit, source or (str(self.path) if self.path else None), point.key,
                              point.limit, point.streams, self.created_at, self.digest())

    def digest(self) -> str:
        """The first 16 hex digits of the SHA-256 of the content (what a run's pointer names)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load(path: str | Path) -> Calibration:
    """Read a calibration file, or ``DIR/calibration.json`` when ``path`` is a directory."""
    from bbrlab.core.yamlfile import read_capped

    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    try:
        data = json.loads(read_capped(path, "--calibration", "calibration file", MAX_FILE_BYTES))
    except FileNotFoundError:
        raise BbrlabError(f"no calibration at {path}: measure one with bbrlab calibrate SPEC --out DIR") from None
    except (OSError, ValueError) as e:  # ValueError: not JSON, or a number beyond Python's 4300 digits
        if isinstance(e, ValidationError):
            raise
        raise BbrlabError(f"cannot read the calibration {path}: {e}") from None
    return Calibration.from_dict(data, path)


def source_for(calibration: Calibration, campaign_dir: str | Path) -> str:
    """The calibration's path as a run record names it: relative to the campaign directory, so records and
    calibration can move together (``calibration.json``, ``../demo/calibration.json``)."""
    if calibration.path is None:
        raise BbrlabError("the calibration has no file: save it first")
    return os.path.relpath(Path(calibration.path).resolve(), Path(campaign_dir).resolve())


def for_campaign(testbed, campaign_dir: str | Path, scenarios, path: str | Path | None = None
                 ) -> tuple[Calibration | None, str | None]:
    """The calibration a campaign in ``campaign_dir`` uses, checked before anything runs, and its source text.

    ``path`` (a file, or a directory holding ``calibration.json``) when given; else
    ``campaign_dir/calibration.json`` when it exists; else none (``(None, None)``). Raises
    :class:`CalibrationMismatch` when it belongs to another testbed (``testbed.describe()``) or lacks a
    point of ``scenarios``.
    """
    if path is None:
        path = Path(campaign_dir) / FILE_NAME
        if not path.is_file():
            return None, None
    cal = load(path)
    cal.check_testbed(testbed.describe())
    missing = cal.missing(scenarios)
    if missing:
        raise CalibrationMismatch(f"the calibration {cal.path} has no ceiling for {', '.join(missing)}: calibrate "
                                  "this campaign's grid (bbrlab calibrate SPEC --out DIR)")
    return cal, source_for(cal, campaign_dir)
