"""One run on one time axis: when the sender's vCPU ran, what BBR's socket said, and how full the bottleneck was.

Three recorders, three clocks: the host traces the sender's vCPU threads on its own CLOCK_REALTIME (the
``vcpu`` table), the guest samples its socket on the guest's clock (the ``ss`` table's ``t_host_s`` is that
time put on the host's clock with the sender's measured offset), and the emulator samples its bottleneck qdisc
on the emulator's clock (the ``bottleneck`` table's ``t_host_s``, likewise). :func:`of_run` puts all three on
one axis: seconds since the run's first socket sample on the host's clock (the sampler starts with the
transfer). :func:`figure` draws aligned panels for one or more runs over a zoom window; :func:`gap_effect`
measures what the socket's samples did across the vCPU's off-CPU gaps.

May import: ``bbrlab.core``, ``bbrlab.analysis``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bbrlab.core.errors import BbrlabError

from . import evidence
from .tables import Tables

#: The socket's rates drawn in the rates panel: column -> legend label.
RATES = {"pacing_rate_mbit": "pacing rate", "delivery_rate_mbit": "delivery rate", "bw_mbit": "BBR bw estimate"}


class TimelineError(BbrlabError):
    """A run cannot be put on one time axis (not traced, not sampled, or its clocks not measured)."""


@dataclass(frozen=True)
class Timeline:
    """One run's aligned series; every ``t_s``/``start_s``/``end_s`` is seconds since ``t0_host_s``.

    ``vcpu``: the sender's vCPU intervals (``tid``, ``on_cpu``, ``inferred``: an on-CPU interval whose switch-in
    the trace missed, its start inferred, docs/vcpu-trace.md; ``start_s``, ``end_s``); ``on``: the union of
    their on-CPU intervals (``start_s``, ``end_s``: some vCPU ran); ``socket``: the data connection's samples
    (``t_s`` and the ``ss`` columns, ``inflight_link_bdp`` added); ``backlog``: the bottleneck qdisc's samples
    (``t_s``, ``backlog_bytes``, ``backlog_link_bdp``, ``drops``). ``link_bdp_bytes`` is the link's rate x
    base RTT; ``align_uncertainty_ms`` the larger bound of the two guests' clock offsets.
    """

    run_id: str
    label: str
    t0_host_s: float
    link_bdp_bytes: float
    vcpu: pd.DataFrame
    on: pd.DataFrame
    socket: pd.DataFrame
    backlog: pd.DataFrame
    align_uncertainty_ms: float | None

    @property
    def duration_s(self) -> float:
        """The last socket sample's time (s since the origin)."""
        return float(self.socket["t_s"].max()) if len(self.socket) else 0.0


def traced_runs(tables: Tables, *, partial_evidence: bool = False) -> pd.DataFrame:
    """The ``runs`` rows that can be put on a timeline: a vCPU trace and socket samples on the host's clock; without
    ``partial_evidence``, not a run whose trace or samples are known to be partial (``trace_complete`` or
    ``sampling_complete`` False: :mod:`bbrlab.analysis.evidence`)."""
    traced = set(tables.vcpu["run_id"]) if len(tables.vcpu) else set()
    sampled = set(tables.ss.loc[tables.ss["t_host_s"].notna(), "run_id"]) if len(tables.ss) else set()
    usable = traced & sampled
    if not partial_evidence:
        usable -= evidence.partial_trace(tables.runs) | evidence.partial_samples(tables.runs)
    return tables.runs[tables.runs["run_id"].isin(usable)]


def pick(tables: Tables, *, cca: str, timeslice_ms: float, cpu_share_pct: float, repetition: int = 0) -> str:
    """The run id of the traced run of ``cca`` at this contention (its ``repetition``-th, by run id); a clear
    error naming what the data has when there is none."""
    runs = traced_runs(tables)
    hit = runs[(runs["cca"] == cca) & (runs["timeslice_ms"] == timeslice_ms) & (runs["cpu_share_pct"] == cpu_share_pct)]
    if len(hit) <= repetition:
        have = sorted({(r.cca, r.timeslice_ms, r.cpu_share_pct) for r in runs.itertuples()})
        raise TimelineError(f"no traced run #{repetition} of cca={cca!r} at timeslice_ms={timeslice_ms}, "
                            f"cpu_share_pct={cpu_share_pct}; traced runs (cca, timeslice_ms, cpu_share_pct): {have}")
    return str(sorted(hit["run_id"])[repetition])


def on_union(starts: np.ndarray, ends: np.ndarray) -> list[tuple[float, float]]:
    """The union of intervals (any vCPU on a CPU), sorted and merged."""
    merged: list[list[float]] = []
    for s, e in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _data_port(ss: pd.DataFrame) -> pd.DataFrame:
    """The one data connection's samples (the port that acknowledged the most bytes)."""
    if ss["port"].nunique() <= 1:
        return ss
    top = ss.groupby("port")["bytes_acked"].max().idxmax()
    return ss[ss["port"] == top]


def of_run(tables: Tables, run_id: str, *, partial_evidence: bool = False) -> Timeline:
    """The aligned series of one run (see :class:`Timeline`); :class:`TimelineError` when the run has no vCPU
    trace, no socket samples, or no measured clock offset for the sender, or (without ``partial_evidence``) when
    its trace or samples are known to be partial."""
    runs = tables.runs[tables.runs["run_id"] == run_id]
    if runs.empty:
        raise TimelineError(f"run_id {run_id!r}: no such run in these tables")
    partial = [what for what, ids in (("vCPU trace", evidence.partial_trace(runs)),
                                      ("socket samples", evidence.partial_samples(runs))) if run_id in ids]
    if partial and not partial_evidence:
        raise TimelineError(f"run {run_id}: its {' and '.join(partial)} are partial (trace_complete, sampling_complete "
                            "in the runs table); pass partial_evidence=True to draw it anyway")
    run = runs.iloc[0]
    ss = _data_port(tables.ss[tables.ss["run_id"] == run_id]).sort_values("t_host_s")
    vcpu = tables.vcpu[tables.vcpu["run_id"] == run_id]
    if vcpu.empty or ss.empty or ss["t_host_s"].isna().all():
        raise TimelineError(f"run {run_id}: a timeline needs its vCPU trace ({len(vcpu)} intervals) and socket "
                            f"samples on the host's clock ({int(ss['t_host_s'].notna().sum())} of {len(ss)})")
    t0 = float(ss["t_host_s"].min())
    link_bdp = float(run["rate_mbit"]) * 1e6 / 8 * float(run["rtt_ms"]) / 1e3
    socket = ss.assign(t_s=ss["t_host_s"] - t0, inflight_link_bdp=ss["inflight_bytes"] / link_bdp).reset_index(drop=True)
    intervals = pd.DataFrame({"tid": vcpu["tid"].to_numpy(), "on_cpu": vcpu["on_cpu"].to_numpy(dtype=bool),
                              "inferred": vcpu["inferred"].notna().to_numpy(dtype=bool),
                              "start_s": vcpu["start_ns"].to_numpy(dtype=float) / 1e9 - t0,
                              "end_s": vcpu["end_ns"].to_numpy(dtype=float) / 1e9 - t0}).sort_values("start_s")
    ons = intervals[intervals["on_cpu"]]
    on = pd.DataFrame(on_union(ons["start_s"].to_numpy(), ons["end_s"].to_numpy()), columns=["start_s", "end_s"])
    queue = tables.bottleneck[(tables.bottleneck["run_id"] == run_id) & tables.bottleneck["bottleneck"]
                              & tables.bottleneck["t_host_s"].notna()].sort_values("t_host_s")
    backlog = pd.DataFrame({"t_s": queue["t_host_s"].to_numpy(dtype=float) - t0,
                            "backlog_bytes": queue["backlog_bytes"].to_numpy(dtype=float),
                            "backlog_link_bdp": queue["backlog_bytes"].to_numpy(dtype=float) / link_bdp,
                            "drops": queue["drops"].to_numpy(dtype=float)})
    uncertainties = [float(queue["align_uncertainty_ms"].max())] if len(queue) else []
    if pd.notna(run.get("sender_clock_uncertainty_ms")):
        uncertainties.append(float(run["sender_clock_uncertainty_ms"]))
    return Timeline(run_id, _label(run), t0, link_bdp, intervals.reset_index(drop=True), on, socket, backlog,
                    max(uncertainties) if uncertainties else None)


def _label(run: pd.Series) -> str:
    return f"{run['cca']}, {run['timeslice_ms']:g} ms / {run['cpu_share_pct']:g} %"


def gaps(timeline: Timeline, min_ms: float = 0.0) -> pd.DataFrame:
    """The off-CPU gaps between consecutive on-CPU intervals (no vCPU ran), at least ``min_ms`` long:
    ``start_s``, ``end_s``, ``length_ms``."""
    on = timeline.on
    g = pd.DataFrame({"start_s": on["end_s"].to_numpy()[:-1], "end_s": on["start_s"].to_numpy()[1:]})
    g["length_ms"] = (g["end_s"] - g["start_s"]) * 1e3
    return g[g["length_ms"] >= min_ms].reset_index(drop=True)


def gap_effect(timeline: Timeline, column: str = "delivery_rate_mbit", min_gap_ms: float = 2.0) -> pd.DataFrame:
    """Per off-CPU gap of at least ``min_gap_ms`` inside the sampled span: the ``column`` of the last socket
    sample before the gap and of the first after it, and their ratio (``after / before``)."""
    sock = timeline.socket[["t_s", column]].dropna()
    t = sock["t_s"].to_numpy()
    v = sock[column].to_numpy(dtype=float)
    rows = []
    for g in gaps(timeline, min_gap_ms).itertuples():
        i = np.searchsorted(t, g.start_s, side="right") - 1  # last sample at or before the gap's start
        j = np.searchsorted(t, g.end_s, side="left")  # first sample at or after its end
        if i < 0 or j >= len(t):
            continue
        rows.append({"gap_start_s": g.start_s, "gap_ms": g.length_ms, "before": v[i], "after": v[j],
                     "ratio": v[j] / v[i] if v[i] > 0 else np.nan, "after_delay_ms": (t[j] - g.end_s) * 1e3})
    return pd.DataFrame(rows, columns=["gap_start_s", "gap_ms", "before", "after", "ratio", "after_delay_ms"])


def gap_summary(timelines: Sequence[Timeline], column: str = "delivery_rate_mbit", min_gap_ms: float = 2.0) -> pd.DataFrame:
    """Per run, :func:`gap_effect` summed up: gaps, median gap [ms], median ``column`` of the sample before and
    after a gap, the ratio after / before (10th, 50th, 90th percentile), and the share of gaps after which the value fell."""
    rows = []
    for tl in timelines:
        e = gap_effect(tl, column, min_gap_ms)
        rows.append({"run": tl.label, "gaps": len(e), "gap_p50_ms": e["gap_ms"].median(), "before_p50": e["before"].median(),
                     "after_p50": e["after"].median(), "ratio_p10": e["ratio"].quantile(0.1),
                     "ratio_p50": e["ratio"].median(), "ratio_p90": e["ratio"].quantile(0.9),
                     "fell_share": float((e["after"] < e["before"]).mean()) if len(e) else np.nan,
                     "after_delay_p50_ms": e["after_delay_ms"].median()})
    return pd.DataFrame(rows)


def window(frame: pd.DataFrame, start_s: float, length_s: float, t: str = "t_s") -> pd.DataFrame:
    """The rows of ``frame`` whose ``t`` lies in [start_s, start_s + length_s]."""
    return frame[(frame[t] >= start_s) & (frame[t] <= start_s + length_s)]


def clip_intervals(frame: pd.DataFrame, start_s: float, length_s: float) -> pd.DataFrame:
    """Intervals (``start_s``, ``end_s``) that overlap the window, cut to it."""
    end = start_s + length_s
    hit = frame[(frame["end_s"] > start_s) & (frame["start_s"] < end)]
    return hit.assign(start_s=hit["start_s"].clip(lower=start_s), end_s=hit["end_s"].clip(upper=end))


def check_window(start_s: float, length_s: float) -> None:
    """Refuse a zoom window that cannot be drawn, naming the field and the allowed range."""
    if not np.isfinite(start_s) or start_s < 0:
        raise TimelineError(f"zoom start_s={start_s}: must be a number >= 0 s (seconds since the transfer began)")
    if not np.isfinite(length_s) or not 0 < length_s <= 600:
        raise TimelineError(f"zoom length_s={length_s}: must be in (0, 600] s")


def figure(timelines: Sequence[Timeline], start_s: float, length_s: float):
    """Aligned panels per run (one column each), sharing the time axis over [start_s, start_s + length_s]:
    the vCPU threads' on-CPU bars; pacing rate, delivery rate and BBR's bandwidth estimate; inflight in link BDP;
    the bottleneck backlog in link BDP. Only points inside the window are drawn. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    check_window(start_s, length_s)
    if not timelines:
        raise TimelineError("figure: no runs to draw (timelines is empty)")
    fig, axes = plt.subplots(4, len(timelines), figsize=(5.2 * len(timelines), 8.4), sharex="col", squeeze=False,
                             gridspec_kw={"height_ratios": [0.7, 2, 1.3, 1.3]})
    ms = 1e3
    for k, tl in enumerate(timelines):
        bars, rates, inflight, queue = axes[:, k]
        tids = sorted(tl.vcpu["tid"].unique())
        on = clip_intervals(tl.vcpu[tl.vcpu["on_cpu"]], start_s, length_s)
        for y, tid in enumerate(tids):
            for inferred, color, note in ((False, "tab:green", ""), (True, "tab:olive", " (switch-in inferred)")):
                part = on[(on["tid"] == tid) & (on["inferred"] == inferred)]
                segs = [[[(s - start_s) * ms, y], [(e - start_s) * ms, y]]
                        for s, e in zip(part["start_s"], part["end_s"], strict=True)]
                if segs or not inferred:
                    bars.add_collection(LineCollection(segs, linewidths=9, colors=color,
                                                       label=f"vCPU {tid} on-CPU{note}"))
        bars.set_ylim(-0.6, len(tids) - 0.4)
        bars.set_yticks(range(len(tids)), [f"tid {t}" for t in tids])
        bars.set_title(f"{tl.label}\n{tl.run_id}", fontsize=9)
        sock = window(tl.socket, start_s, length_s)
        x = (sock["t_s"] - start_s) * ms
        for col, name in RATES.items():
            if sock[col].notna().any():
                rates.plot(x, sock[col], ".-", ms=3, lw=1, label=name)
        rates.set_ylabel("rate [Mbit/s]")
        rates.legend(fontsize=7, loc="upper right")
        inflight.plot(x, sock["inflight_link_bdp"], ".-", ms=3, lw=1, color="tab:purple", label="inflight")
        inflight.set_ylabel("inflight [link BDP]")
        q = window(tl.backlog, start_s, length_s)
        queue.plot((q["t_s"] - start_s) * ms, q["backlog_link_bdp"], "-", lw=1, color="tab:brown", label="backlog")
        queue.set_ylabel("bottleneck backlog [link BDP]")
        queue.set_xlabel(f"time since {start_s:g} s into the transfer [ms]")
        for ax in (rates, inflight, queue):
            ax.set_ylim(bottom=0)
            for g in clip_intervals(gaps(tl), start_s, length_s).itertuples():
                ax.axvspan((g.start_s - start_s) * ms, (g.end_s - start_s) * ms, color="0.9", lw=0, zorder=0)
            ax.autoscale(axis="y")
            ax.set_ylim(bottom=0)
        for ax in (bars, rates, inflight, queue):
            ax.set_xlim(0, length_s * ms)
    fig.suptitle("On the host's clock: the sender's vCPU on a CPU (bars; olive: switch-in inferred; grey bands: no "
                 "vCPU ran), its socket's samples, the bottleneck queue", fontsize=10)
    fig.tight_layout()
    return fig


#: CSS classes of the zoom widget's parts: the handles by which the browser test finds them in JupyterLab's page.
ZOOM_CSS = {"box": "bbrlab-timeline-zoom", "start": "bbrlab-timeline-start", "length": "bbrlab-timeline-length",
            "earlier": "bbrlab-timeline-earlier", "later": "bbrlab-timeline-later", "figure": "bbrlab-timeline-figure"}


def zoom_widget(timelines: Sequence[Timeline], start_s: float, length_s: float):
    """Interactive zoom in JupyterLab: sliders for the window's start [s] and length [ms], buttons that move it
    by one length, and the aligned panels redrawn for each window (only the window's points are drawn, so the
    figure never hides data outside its axes). Returns an ``ipywidgets.VBox``."""
    import ipywidgets as widgets

    from .facets import show

    check_window(start_s, length_s)
    end = max(tl.duration_s for tl in timelines)
    start = widgets.FloatSlider(value=start_s, min=0.0, max=max(end, start_s), step=0.01, readout_format=".2f",
                                description="start [s]", continuous_update=False, layout=widgets.Layout(width="60%"))
    length = widgets.FloatSlider(value=length_s * 1e3, min=10.0, max=2000.0, step=10.0, readout_format=".0f",
                                 description="length [ms]", continuous_update=False, layout=widgets.Layout(width="60%"))
    earlier, later = widgets.Button(description="< earlier"), widgets.Button(description="later >")
    out = widgets.Output()

    def redraw(change=None) -> None:
        with out:
            out.clear_output(wait=True)
            show(figure(timelines, start.value, length.value / 1e3))

    def move(sign: int) -> None:
        start.value = min(start.max, max(0.0, start.value + sign * length.value / 1e3))

    start.observe(redraw, names="value")
    length.observe(redraw, names="value")
    earlier.on_click(lambda _: move(-1))
    later.on_click(lambda _: move(+1))
    redraw()
    box = widgets.VBox([start, length, widgets.HBox([earlier, later]), out])
    for part, widget in (("box", box), ("start", start), ("length", length), ("earlier", earlier),
                         ("later", later), ("figure", out)):
        widget.add_class(ZOOM_CSS[part])
    return box
