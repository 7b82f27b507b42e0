"""Do the guest's socket samples and the host's vCPU trace share one time axis? A check that needs no trust.

The guest samples its sockets from a program running on a vCPU, so a sample can only be taken while some
vCPU thread of the sender is on a host CPU. Put the samples' guest CLOCK_REALTIME onto the host's
CLOCK_REALTIME with a measured offset (:class:`ClockOffset`: ``host = guest + offset_ns``, give or take
``uncertainty_ns``) and (nearly) every sample must fall inside an on-CPU interval of the trace
(:meth:`bbrlab.sampling.vcputrace.VcpuTrace.on_intervals_realtime`). :func:`check` counts them; a low fraction
means the offset is wrong (or the clocks drift), whatever its stated uncertainty says.

The offset is measured elsewhere (timestamp exchanges with the guest); without one the run records the
check as not done (``aligned: false``), never with an assumed offset.
"""

from __future__ import annotations

import bisect
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bbrlab.core import recordjson
from bbrlab.core.errors import ValidationError

from . import sockdiag

#: Fraction of samples that must fall inside an on-CPU interval for the alignment to be believed.
MIN_INSIDE = 0.99


@dataclass(frozen=True)
class ClockOffset:
    """The guest's CLOCK_REALTIME against the host's: ``host_ns = guest_ns + offset_ns`` at guest time
    ``reference_ns``, changing by ``drift_ppm`` (ns per ms of guest time) away from it, within ``uncertainty_ns``
    (half-width), as measured by ``method``."""

    offset_ns: int
    uncertainty_ns: int
    method: str = "given"
    drift_ppm: float = 0.0
    reference_ns: int = 0

    @classmethod
    def of_remote_minus_local(cls, offset_s: float, uncertainty_s: float, *, drift_ppm: float = 0.0,
                              measured_at_s: float = 0.0, method: str = "exchange") -> ClockOffset:
        """From a measurement of the guest's clock minus the host's in seconds (as timestamp exchanges give it),
        taken at host time ``measured_at_s``; the drift is the guest's against the host's."""
        offset_ns = -round(offset_s * 1e9)
        return cls(offset_ns, math.ceil(uncertainty_s * 1e9), method, -drift_ppm,
                   round(measured_at_s * 1e9) - offset_ns)

    def to_host_ns(self, guest_ns: int) -> int:
        """A guest CLOCK_REALTIME reading on the host's clock."""
        return guest_ns + self.offset_ns + round((guest_ns - self.reference_ns) * self.drift_ppm * 1e-6)

    def __post_init__(self):
        for name in ("offset_ns", "uncertainty_ns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValidationError(f"clock offset {name}", value, "a whole number of ns")
        if self.uncertainty_ns < 0:
            raise ValidationError("clock offset uncertainty_ns", self.uncertainty_ns, ">= 0 ns")


@dataclass(frozen=True)
class AlignmentCheck:
    """How many guest samples fall inside an on-CPU interval once shifted by the offset: exactly
    (``inside``) and allowing the offset's uncertainty (``inside_within_uncertainty``). ``samples`` counts those
    inside the trace's window; ``outside_window`` those before or after it (a sampler that runs longer than the
    traced transfer), which say nothing either way (None in records made before it was counted).

    ``metadata.alignment`` of the run record: the fields, then ``fraction_inside`` (rounded to 5 digits)."""

    aligned: bool
    samples: int
    inside: int | None = None
    inside_within_uncertainty: int | None = None
    offset_ns: int | None = None
    uncertainty_ns: int | None = None
    sample_interval_ms: int | float | None = None
    warning: str | None = None
    outside_window: int | None = recordjson.left_out_when_none()

    @property
    def fraction_inside(self) -> float | None:
        """``inside`` / ``samples`` (None when not aligned or without samples)."""
        return None if self.inside is None or not self.samples else self.inside / self.samples

    def to_dict(self) -> dict:
        """``metadata.alignment`` of a run record (:func:`bbrlab.core.recordjson.to_json`)."""
        return recordjson.to_json(self)

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The fields, ``fraction_inside`` after them (computed: dropped when read)."""
        return recordjson.record_layout(source, handler, read=_without_fraction, write=_with_fraction)


def _without_fraction(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "fraction_inside"}


def _with_fraction(d: dict) -> dict:
    inside, samples = d["inside"], d["samples"]
    return d | {"fraction_inside": None if inside is None or not samples else round(inside / samples, 5)}


#: How many earlier on-CPU intervals (by start) a sample is compared with: those of other threads overlap.
LOOK_BACK = 63


def _inside(t_ns: int, starts: list[int], ends: list[int], slack_ns: int) -> bool:
    """Whether ``t_ns`` lies in some interval widened by ``slack_ns`` (intervals sorted by start)."""
    i = bisect.bisect_right(starts, t_ns + slack_ns)
    # Intervals of several threads overlap: look back while an earlier one could still reach t_ns.
    for j in range(i - 1, max(-1, i - LOOK_BACK - 1), -1):
        if ends[j] + slack_ns >= t_ns:
            return True
    return False


def _inside_count(times_ns: np.ndarray, starts: np.ndarray, ends: np.ndarray, slack_ns: int) -> int:
    """How many of ``times_ns`` :func:`_inside` finds inside, for all of them at once (numpy)."""
    if not len(times_ns) or not len(starts):
        return 0
    after = np.searchsorted(starts, times_ns + slack_ns, side="right")
    hit = np.zeros(len(times_ns), dtype=bool)
    for back in range(1, LOOK_BACK + 1):
        j = after - back
        hit |= (j >= 0) & (ends[np.maximum(j, 0)] + slack_ns >= times_ns)
    return int(hit.sum())


def _spans(on) -> tuple[np.ndarray, np.ndarray]:
    """On-CPU intervals given as (start, end) pairs, or as a pair of arrays of starts and ends, as two numpy arrays
    sorted by start (then end)."""
    if isinstance(on, tuple) and len(on) == 2 and isinstance(on[0], np.ndarray):
        start, end = np.asarray(on[0], dtype=np.int64), np.asarray(on[1], dtype=np.int64)
    else:
        pairs = np.array(list(on), dtype=np.int64).reshape(-1, 2)
        start, end = pairs[:, 0], pairs[:, 1]
    order = np.lexsort((end, start))
    return start[order], end[order]


def check(guest_sample_ns: Sequence[int], on_intervals_host_ns, offset: ClockOffset | None,
          sample_interval_ms: float | None = None, window_host_ns: tuple[int, int] | None = None) -> AlignmentCheck:
    """The alignment check of one run. Without an ``offset`` the run is recorded as not aligned. With one,
    the samples inside the trace's ``window_host_ns`` (all of them without a window) are checked: when fewer
    than :data:`MIN_INSIDE` of them fall inside an on-CPU interval (allowing the offset's uncertainty), or the
    uncertainty exceeds one sample interval, the check carries a ``warning`` (also printed on stderr): the
    alignment is worse than the samples' own spacing. ``on_intervals_host_ns``: (start, end) pairs, or a pair of
    numpy arrays of starts and ends (:meth:`bbrlab.sampling.vcputrace.VcpuTrace.on_spans_realtime`)."""
    if offset is None:
        return AlignmentCheck(False, len(guest_sample_ns), sample_interval_ms=sample_interval_ms,
                              warning=None, outside_window=0)
    starts, ends = _spans(on_intervals_host_ns)
    shifted = [offset.to_host_ns(t) for t in guest_sample_ns]
    total = len(shifted)
    if window_host_ns is not None:
        shifted = [t for t in shifted if window_host_ns[0] <= t <= window_host_ns[1]]
    times = np.array(shifted, dtype=np.int64)
    exact = _inside_count(times, starts, ends, 0)
    loose = _inside_count(times, starts, ends, offset.uncertainty_ns)
    problems = []
    if shifted and loose / len(shifted) < MIN_INSIDE:
        problems.append(f"only {loose} of {len(shifted)} guest samples ({100 * loose / len(shifted):.1f} %) fall "
                        f"inside an on-CPU interval of the vCPU trace (expected >= {100 * MIN_INSIDE:.0f} %)")
    if sample_interval_ms is not None and offset.uncertainty_ns > sample_interval_ms * 1e6:
        problems.append(f"the clock offset's uncertainty ({offset.uncertainty_ns / 1e6:.3f} ms) exceeds one sample "
                        f"interval ({sample_interval_ms} ms)")
    warning = "alignment worse than one sample interval: " + "; ".join(problems) if problems else None
    if warning:
        print(f"bbrlab: WARNING: {warning}", file=sys.stderr, flush=True)
    return AlignmentCheck(True, len(shifted), exact, loose, offset.offset_ns, offset.uncertainty_ns,
                          sample_interval_ms, warning, total - len(shifted))


def guest_sample_times_ns(log_text: str, kind: str) -> list[int]:
    """The guest CLOCK_REALTIME (ns) of each sample in a sampler's log: the netlink sampler writes it per tick;
    the BPF sampler's records carry CLOCK_MONOTONIC, and its header realtime minus monotonic; the ss loop writes
    ``# t=<unix seconds>`` (bash's ``$EPOCHREALTIME``, microseconds)."""
    if kind == "ss":
        return [int(sec) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
                for sec, frac in re.findall(r"^# t=(\d+)[.,](\d+)\s*$", log_text, re.M)]
    if kind == "bpf":
        log = sockdiag.bpf.parse_log(log_text)
        return sorted({r["mono_ns"] + log.realtime_offset_ns for r in log.records})
    return [s.realtime_ns for s in sockdiag.parse_log(log_text).samples]
