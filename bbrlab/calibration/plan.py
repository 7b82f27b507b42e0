"""The plan of a calibration (:class:`CalibrationSpec`): which points (timeslice x share x RTT, and other
models' contentions x RTT) are run, how often, for how long, in which order. :mod:`bbrlab.calibration.calibrate`
runs it and :mod:`bbrlab.calibration.ceilings` turns its runs into ceilings; both read it from here.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import asdict, dataclass

from bbrlab.core.errors import ValidationError
from bbrlab.run.ceiling import PointKey, model_tag
from bbrlab.scenario.cpumodels import MODELS
from bbrlab.scenario.cpumodels.deadline import DEFAULT_DEADLINE_MODE
from bbrlab.scenario.link import DelaySplit
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

DEFAULT_STREAMS = (1, 4)
DEFAULT_REPETITIONS = 3
DEFAULT_DURATION_S = 5
#: The calibration's congestion control (the least CPU-limited one).
CCA = "cubic"
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
                c = Contention.from_dict(d) if isinstance(d, dict) else None
            except (TypeError, ValidationError) as e:
                raise ValidationError(f"model_contentions[{i}]", d, getattr(e, "allowed", "a contention's fields")) from None
            if c is None or model_tag(c) is None:
                raise ValidationError(f"model_contentions[{i}]", d, "a contention of another model than deadline, "
                                      "or deadline with an implicit deadline, below 100 % (deadline is calibrated by "
                                      "timeslices_ms)")

    def contentions(self) -> list[Contention]:
        """The other models' contentions to calibrate."""
        return [Contention.from_dict(d) for d in self.model_contentions]

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
                  if model_tag(c) is not None}
        deadline = [s for s in specs if any(MODELS[m].uses_timeslice for m in s.contention_models)
                    and DEFAULT_DEADLINE_MODE in s.deadline_modes]  # implicit deadlines are model contentions
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
