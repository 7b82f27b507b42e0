"""Fairness of the flows of one run, and the harm a contended flow does to the others.

Every measure is taken over the *overlap window*: from the latest flow's first interval start to the
earliest flow's last interval end, i.e. the time when every flow of the run was sending. A flow's
throughput there is the time-weighted mean of its per-interval throughput (the receiver's bytes per
interval, summed over its streams; the sender's where the receiver's are missing) over the window: an
interval that lies partly inside counts for the part inside.

- **Jain's index** ``J = (sum x)^2 / (n * sum x^2)`` over the flows' throughputs ``x`` in the window:
  1 when all flows get the same, ``1/n`` when one takes everything. A run of one flow has none (<NA>).
- **Share**: a flow's throughput over the sum of all flows' throughputs in the window (0..1).
- **Convergence time**: the window is cut into bins of :data:`BIN_S` seconds from its start (a last bin
  shorter than half a bin is dropped); Jain's index is computed in each bin. The convergence time is the
  start of the first bin from which every later bin's index is at least :data:`CONVERGED_JAIN`, in seconds
  after the window's start: 0 when the flows share fairly from the moment they overlap, <NA> when the last
  bin is below the threshold (they never converged).
- **Harm** (:func:`harm`): a flow's throughput beside the contended flow (in the window) against its
  throughput alone at the same point: the mean throughput of the ok single-flow runs (the baseline runs)
  of the same link, CCA and sender qdisc, and of the same contention as the flow had: none for a
  ``competitor`` flow, the run's for a flow from the contended ``sender``. ``throughput_ratio = beside /
  alone`` and ``harm = 1 - ratio`` (0: the flow lost nothing; 1: it was starved).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import pandas as pd

#: Width of the bins convergence is judged in [s] (iperf3's reporting interval).
BIN_S = 1.0
#: Jain's index at or above which two or more flows count as sharing fairly (transperf's and Flent's habit
#: of 0.9 for "fair").
CONVERGED_JAIN = 0.9


def jain_index(throughputs: Sequence[float]) -> float | None:
    """Jain's index of ``throughputs`` (any unit); None for no flows or when they are all zero."""
    xs = [float(x) for x in throughputs]
    squares = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * squares) if xs and squares > 0 else None


def flow_series(stream_rows: Iterable[Sequence]) -> dict[int, list[tuple[float, float, float]]]:
    """``{flow: [(t_start_s, t_end_s, Mbit/s), ...]}``: each flow's intervals, its streams summed, from rows
    in the ``streams`` table's order (:data:`bbrlab.analysis.streams.STREAM_FIELDS`)."""
    sums: dict[tuple[int, float, float], float] = defaultdict(float)
    for row in stream_rows:
        _, flow, _, _, t0, t1, received, sent = row[:8]
        rate = received if _present(received) else sent
        if _present(t0) and _present(t1) and t1 > t0 and _present(rate):
            sums[(int(flow), float(t0), float(t1))] += float(rate)
    out: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for (flow, t0, t1), rate in sorted(sums.items()):
        out[flow].append((t0, t1, rate))
    return dict(out)


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v is not pd.NA


def overlap_window(series: dict[int, list[tuple[float, float, float]]]) -> tuple[float, float] | None:
    """``(start_s, end_s)`` when every flow was sending; None when they never overlap."""
    if not series or any(not s for s in series.values()):
        return None
    start = max(s[0][0] for s in series.values())
    end = min(s[-1][1] for s in series.values())
    return (start, end) if end > start else None


def mean_rate(intervals: list[tuple[float, float, float]], start_s: float, end_s: float) -> float:
    """Time-weighted mean of ``intervals`` over ``[start_s, end_s]`` (parts of intervals inside count)."""
    megabits = sum(rate * max(0.0, min(t1, end_s) - max(t0, start_s)) for t0, t1, rate in intervals)
    return megabits / (end_s - start_s)


def convergence_s(series: dict[int, list[tuple[float, float, float]]], window: tuple[float, float]) -> float | None:
    """Seconds from the window's start to the first :data:`BIN_S` bin from which Jain's index stays at or
    above :data:`CONVERGED_JAIN`; None when the last bin is below it (see the module docstring)."""
    start, end = window
    n_bins = int((end - start) / BIN_S + 0.5)
    bins = [(start + k * BIN_S, min(end, start + (k + 1) * BIN_S)) for k in range(n_bins)]
    fair = [(jain_index([mean_rate(s, b0, b1) for s in series.values()]) or 0) >= CONVERGED_JAIN for b0, b1 in bins]
    if not fair or not fair[-1]:
        return None
    first = len(fair) - 1
    while first > 0 and fair[first - 1]:
        first -= 1
    return bins[first][0] - start


def run_fairness(stream_rows: Iterable[Sequence]) -> tuple[dict, dict[int, dict]]:
    """One run's fairness: ``({flows, overlap_s, jain_index, convergence_s}, {flow: {overlap_throughput_mbit,
    share}})``. A single-flow run has ``flows = 1`` and no index, share or convergence."""
    series = flow_series(stream_rows)
    run = {"flows": len(series), "overlap_s": None, "jain_index": None, "convergence_s": None}
    window = overlap_window(series) if len(series) > 1 else None
    if window is None:
        return run, {}
    rates = {flow: mean_rate(s, *window) for flow, s in series.items()}
    total = sum(rates.values())
    run.update(overlap_s=window[1] - window[0], jain_index=jain_index(list(rates.values())),
               convergence_s=convergence_s(series, window))
    return run, {flow: {"overlap_throughput_mbit": r, "share": r / total if total > 0 else None}
                 for flow, r in rates.items()}


#: The columns that make two runs the same point for :func:`harm` (besides the flow's CCA).
HARM_POINT = ("rtt_ms", "rate_mbit", "buffer_bdp", "queue_mode", "loss_pct", "sender_qdisc")
#: ... and, for a flow from the contended sender, the contention it had.
CONTENTION_POINT = ("contention_mode", "timeslice_ms", "cpu_share_pct")


def harm(runs: pd.DataFrame, flows: pd.DataFrame) -> pd.DataFrame:
    """For each flow of a multi-flow run: its throughput beside the others (``beside_mbit``, in the overlap
    window), alone (``alone_mbit``: the mean throughput of the ok single-flow runs at the same
    :data:`HARM_POINT` with its CCA and its contention, see the module docstring; NaN without such runs,
    never guessed), their ratio and ``harm = 1 - ratio``, with ``baseline_runs`` counted."""
    ok = runs[runs["status"] == "ok"]
    multi = ok[ok["flows"] > 1]
    alone = ok[ok["flows"] == 1]
    rows = []
    for _, f in flows[flows["run_id"].isin(multi["run_id"])].iterrows():
        run = multi[multi["run_id"] == f["run_id"]].iloc[0]
        same = alone[alone["cca"] == f["cca"]]
        if f["origin"] == "competitor":
            same = same[same["contention_mode"] == "none"]
        for col in HARM_POINT + (() if f["origin"] == "competitor" else CONTENTION_POINT):
            same = same[same[col].isna()] if pd.isna(run[col]) else same[same[col] == run[col]]
        base = same["throughput_mbit"].mean() if len(same) else float("nan")
        ratio = f["overlap_throughput_mbit"] / base if base and not math.isnan(base) else float("nan")
        rows.append({"run_id": f["run_id"], "flow": f["flow"], "origin": f["origin"], "cca": f["cca"],
                     "beside_mbit": f["overlap_throughput_mbit"], "alone_mbit": base, "baseline_runs": len(same),
                     "throughput_ratio": ratio, "harm": 1 - ratio})
    return pd.DataFrame(rows, columns=["run_id", "flow", "origin", "cca", "beside_mbit", "alone_mbit",
                                       "baseline_runs", "throughput_ratio", "harm"])
