"""Whether a run's socket samples and vCPU trace are whole: the ``runs`` table's quality columns and the filter the
figures that draw those samples apply by default (docs/run-record.md, "When the evidence is partial").

A run whose sampler was cut short fails (:func:`bbrlab.run.checks.samples`); what is left is partial evidence that
does not make the run's throughput wrong, and a retry would not make whole: the BPF ring buffer dropped samples,
the samples stop short of the transfer's ends, the vCPU trace hit its cap or lost events, its on-CPU time is not
within 2 % of schedstat's. Each is a column; :func:`sampling_complete` and :func:`trace_complete` combine them,
as three-valued booleans: False when any part is known to be partial, <NA> when a part is unknown (the authors'
layout records none of them), True otherwise. A figure keeps a run unless its evidence is known to be partial.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

#: The samples may stop this many sample intervals short of the transfer's length in all (one at each end: the
#: BPF sampler records a socket at its first ACK in a slot, so each end may fall up to one interval inside).
COVER_INTERVALS = 2


class SpanTracker:
    """Each data stream's first and last sample time, as ``ss`` rows go by (:meth:`add`); :meth:`span_s`."""

    def __init__(self):
        self.first: dict = {}
        self.last: dict = {}

    def add(self, row: dict) -> None:
        """Count one sample row (its ``port`` and ``t_s``) in its stream's span."""
        port, t = row.get("port"), row.get("t_s")
        if t is not None:
            self.first[port] = min(self.first.get(port, t), t)
            self.last[port] = max(self.last.get(port, t), t)

    def span_s(self) -> float | None:
        """From the first to the last sample of the data stream sampled least long, in s; None without rows."""
        return min(self.last[p] - self.first[p] for p in self.first) if self.first else None


def samples_span_s(rows: Iterable[dict]) -> float | None:
    """From the first to the last sample of the data stream sampled least long (``t_s`` of the ``ss`` rows), in
    s; None without rows."""
    spans = SpanTracker()
    for r in rows:
        spans.add(r)
    return spans.span_s()


def covers_transfer(span_s: float | None, transfer_s: float | None, sample_ms: float | None) -> bool | None:
    """The samples reach from the transfer's start to its end, to within :data:`COVER_INTERVALS` sample intervals;
    None when a value is unknown."""
    if span_s is None or not transfer_s or not sample_ms or (isinstance(span_s, float) and math.isnan(span_s)):
        return None
    return span_s >= transfer_s - COVER_INTERVALS * sample_ms / 1000


def sampling_complete(ended: str | None, dropped: int | None, covers: bool | None) -> bool | None:
    """The socket samples are whole: the sampler ended by its stop file, its ring buffer dropped none (a sampler
    without one, netlink or ss, drops none), and they cover the transfer. None for an unsampled run (``ended``
    None) or when coverage is unknown and nothing else is partial."""
    if ended is None:
        return None
    if ended != "stop_file" or (dropped or 0) > 0 or covers is False:
        return False
    return None if covers is None else True


def trace_complete(capped: bool | None, lost_events: int | None, schedstat_agrees: bool | None) -> bool | None:
    """The vCPU trace is whole: not capped, no event lost, its on-CPU time within 2 % of schedstat's. None for an
    untraced run (``capped`` None) or when the schedstat comparison was not made and nothing else is partial."""
    if capped is None:
        return None
    if capped or (lost_events or 0) > 0 or schedstat_agrees is False:
        return False
    return None if schedstat_agrees is None else True


def _known_partial(runs: pd.DataFrame, column: str) -> set[str]:
    if column not in runs or runs.empty:
        return set()
    return set(runs.loc[runs[column].eq(False).fillna(False).astype(bool), "run_id"])


def partial_samples(runs: pd.DataFrame) -> set[str]:
    """Run ids whose socket samples are known to be partial (``sampling_complete`` False)."""
    return _known_partial(runs, "sampling_complete")


def partial_trace(runs: pd.DataFrame) -> set[str]:
    """Run ids whose vCPU trace is known to be partial (``trace_complete`` False)."""
    return _known_partial(runs, "trace_complete")


def without(frame: pd.DataFrame, run_ids: set[str]) -> pd.DataFrame:
    """``frame``'s rows of the runs not in ``run_ids``."""
    return frame[~frame["run_id"].isin(run_ids)] if run_ids and len(frame) else frame
