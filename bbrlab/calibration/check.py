"""Does the sender's calibrated CPU ceiling bound what the runs carried?

A ceiling (``ceiling_mbit``, ``bbrlab calibrate``, docs/calibration.md) is meant to be what the contended
sender can carry at all at its timeslice, share and RTT; the fidelity report sets aside every point whose
link rate is at or above it. A shaped run that carries MORE than its point's ceiling shows that the ceiling
does not bound it (too few or too short calibration runs, or a calibration made under other load), and
then the set-aside decisions made with it are unreliable too. :func:`above_ceiling` judges one run (the
``runs`` table's ``above_ceiling`` column); :func:`ceiling_exceeded` lists the points with such runs, for
the fidelity report and for a notebook.
"""

from __future__ import annotations

import math

import pandas as pd

#: The columns that make one point here: the ceiling's own (timeslice, share, RTT) and what the runs differ in.
POINT = ["variant", "timeslice_ms", "cpu_share_pct", "rtt_ms", "rate_mbit"]
#: Columns added to :data:`POINT` when a table has them (a deep queue changes what a run carries).
OPTIONAL_POINT = ["queue_mode"]


def _number(x) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def above_ceiling(throughput_mbit, ceiling_mbit) -> bool | None:
    """Whether a run's throughput (Mbit/s) exceeds its ceiling (Mbit/s); None when either is unknown."""
    thr, ceiling = _number(throughput_mbit), _number(ceiling_mbit)
    if thr is None or ceiling is None:
        return None
    return thr > ceiling


def ceiling_exceeded(runs: pd.DataFrame) -> pd.DataFrame:
    """The points with at least one run (status ok) above its ceiling.

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table (:mod:`bbrlab.analysis.tables`) with ``throughput_mbit`` and ``ceiling_mbit``.

    Returns
    -------
    pandas.DataFrame
        One row per flagged point: :data:`POINT` (and :data:`OPTIONAL_POINT` present in ``runs``),
        ``ceiling_mbit`` (the median of its runs' ceilings), ``n`` (runs with a ceiling), ``n_above``,
        ``max_throughput_mbit``, ``median_throughput_mbit`` and ``reason`` (one line for people); empty when
        every run stayed at or below its ceiling, or none has one.
    """
    keys = POINT + [c for c in OPTIONAL_POINT if c in runs.columns]
    columns = [*keys, "ceiling_mbit", "n", "n_above", "max_throughput_mbit", "median_throughput_mbit", "reason"]
    if runs.empty or "ceiling_mbit" not in runs.columns:
        return pd.DataFrame(columns=columns)
    ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    have = ok[ok["ceiling_mbit"].notna() & ok["throughput_mbit"].notna()]
    if have.empty:
        return pd.DataFrame(columns=columns)
    have = have.assign(_above=(have["throughput_mbit"] > have["ceiling_mbit"]).astype(int))
    per_point = have.groupby(keys, dropna=False).agg(
        ceiling_mbit=("ceiling_mbit", "median"), n=("run_id", "count"), n_above=("_above", "sum"),
        max_throughput_mbit=("throughput_mbit", "max"), median_throughput_mbit=("throughput_mbit", "median"),
    ).reset_index()
    flagged = per_point[per_point["n_above"] > 0]
    return flagged.assign(reason=[_reason(r) for r in flagged.itertuples()]).reset_index(drop=True)[columns]


def _reason(r) -> str:
    share = "100 %" if r.cpu_share_pct >= 100 else f"{r.timeslice_ms:g} ms / {r.cpu_share_pct:g} %"
    queue = f", {r.queue_mode} queue" if isinstance(getattr(r, "queue_mode", None), str) else ""
    return (f"{r.variant} at {share}, RTT {r.rtt_ms:g} ms, {r.rate_mbit:g} Mbit/s{queue}: {r.n_above} of {r.n} "
            f"run(s) above the CPU ceiling {r.ceiling_mbit:.1f} Mbit/s (highest {r.max_throughput_mbit:.1f}, "
            f"median {r.median_throughput_mbit:.1f})")


def report_lines(runs: pd.DataFrame) -> list[str]:
    """The fidelity report's section on runs above their ceiling (Markdown lines)."""
    lines = ["", "## Runs above their CPU ceiling", "",
             "The ceiling is meant to bound what the contended sender can carry at its timeslice, share and RTT. "
             "Where shaped runs carried more, it does not bound them, and setting points aside by it (above) is "
             "unreliable there: calibrate with more and longer runs (docs/calibration.md)."]
    flagged = ceiling_exceeded(runs)
    if flagged.empty:
        return [*lines, "", "None: every run with a ceiling stayed at or below it."]
    return [*lines, "", *[f"- {reason}" for reason in flagged["reason"]]]
