"""The paper's figures from bbrlab's tables, in one publication style.

Every figure function takes :class:`~bbrlab.analysis.tables.Tables` (from :func:`bbrlab.analysis.data.load` and
:func:`bbrlab.analysis.data.select`) and returns ``(figure, table)``: the matplotlib Figure and the DataFrame it
plotted (medians with 25th/75th percentiles over repetitions, or the raw rows for time series), so a
notebook can show, save or check both. The panels, labels, colours and style come from the facet engine,
:mod:`bbrlab.analysis.facets`; this module re-exports its :func:`~bbrlab.analysis.facets.save`,
:func:`~bbrlab.analysis.facets.show`, :func:`~bbrlab.analysis.facets.style` and
:func:`~bbrlab.analysis.facets.plotted_points`, so a notebook needs ``from bbrlab.analysis import data, plots``
only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection

from bbrlab.scenario.workloads import RsyncParams

from . import evidence
from .data import summarise
from .explore import representative_runs
from .facets import (
    FALLBACK,
    LABELS,
    NOT_RECORDED,
    cell_rows,
    colour,
    empty_figure,
    facet_lines,
    figure_legend,
    fit_y,
    grid,
    label_edges,
    level_label,
    levels,
    panel_cells,
    panel_title,
    plotted_points,
    save,
    show,
    spread_full_share,
    style,
)
from .tables import Tables

__all__ = [
    "MANY_LINES", "SS_PANELS", "SS_YLABELS", "TIMED_OUT_LABEL", "goodput_vs_loss", "link_utilisation",
    "patched_versions", "patched_vs_original", "plotted_points", "representative_runs", "save", "show",
    "socket_state", "std_vs_share", "style", "sweep", "throughput_vs_share", "timeseries",
    "transfer_time_vs_loss",
]


def throughput_vs_share(tables: Tables, *, row: str | None = "timeslice_ms", col: str | None = "rtt_ms",
                        hue: str = "variant", value: str = "throughput_mbit", logy: bool = False,
                        title: str | None = None):
    """Figures 1 and 4: median throughput (IQR band) over the CPU share, a line per variant.

    Runs without a policy (100 % share) whose timeslice is not recorded appear in every timeslice panel.
    When the runs carry the sender's CPU ceiling (``ceiling_mbit``, ``bbrlab calibrate``), each panel also
    shows it as a dash-dotted line "CPU ceiling".

    Parameters
    ----------
    tables : Tables
        A selection (:func:`bbrlab.analysis.data.select`); its ``runs`` are drawn.
    row, col : str or None
        Columns that facet the figure into rows and columns of panels (None: one row/column).
    hue : str, default "variant"
        One line per value of this column.
    value : str, default "throughput_mbit"
        What the y axis shows (``link_utilisation`` for utilisation).
    logy : bool, default False
    title : str, optional
        Shown above the legend.
    Returns
    -------
    matplotlib.figure.Figure
        The figure (a figure that says "Nothing to plot: ..." when the selection is empty).
    pandas.DataFrame
        What it drew: per line and x, ``n``, ``median``, ``q25``, ``q75``, ``mean``, ``std`` over repetitions.

    Examples
    --------
    >>> fig, table = plots.throughput_vs_share(data.select(tables, rate_mbit=100))  # doctest: +SKIP
    >>> plots.save(fig, "build/figures", "fig04_throughput_vs_share")               # doctest: +SKIP
    """
    return facet_lines(spread_full_share(tables.runs), x="cpu_share_pct", value=value, hue=hue, row=row, col=col,
                       logy=logy, title=title, ceiling=True)


def sweep(tables: Tables, *, over: str = "rate_mbit", row: str | None = "variant",
          col: str | None = "timeslice_ms", logy: bool = True, value: str = "throughput_mbit",
          title: str | None = None):
    """Figures 7/13 (``over="rate_mbit"``, log y) and 8/14 (``over="rtt_ms"``): a line per swept value.

    The sender's CPU ceiling, when the runs carry one, is drawn per panel (one line per RTT, in its
    colour, in an RTT sweep).

    Parameters
    ----------
    tables : Tables
        A selection; its ``runs`` are drawn over the CPU share.
    over : str, default "rate_mbit"
        The swept column: one line per value.
    row, col : str or None
        Facets (default: a row per variant, a column per timeslice).
    logy : bool, default True
    value : str, default "throughput_mbit"
    title : str, optional
    Returns
    -------
    matplotlib.figure.Figure
        The figure (a figure that says "Nothing to plot: ..." when the selection is empty).
    pandas.DataFrame
        What it drew: per line and x, ``n``, ``median``, ``q25``, ``q75``, ``mean``, ``std`` over repetitions.

    Examples
    --------
    >>> fig, _ = plots.sweep(data.select(tables, rtt_ms=10), over="rate_mbit")  # doctest: +SKIP
    """
    return facet_lines(spread_full_share(tables.runs), x="cpu_share_pct", value=value, hue=over, row=row, col=col,
                       logy=logy, title=title, hue_label=lambda v: level_label(over, v), ceiling=True)


def vs_queue(tables: Tables, *, value: str = "throughput_mbit", row: str | None = "timeslice_ms",
             col: str | None = "cpu_share_pct", title: str | None = None):
    """``value`` (throughput by default; ``mean_rtt_ms`` for the standing queue) against the bottleneck queue in
    force, in BDP on a log axis, one line per variant (median, interquartile band), a panel per timeslice and CPU
    share. The queue in force is ``buffer_bdp``: the buffer asked in bbrlab's tree, netem's 100000 packets in the
    authors' tree whatever was asked (:mod:`bbrlab.link.bottleneck`), so the authors' runs sit far right.

    Parameters
    ----------
    tables : Tables
        A selection of runs over several queues (e.g. ``data/buffer-queue-local``).
    value : str, default "throughput_mbit"
    row, col : str or None
        Facets (default: a row per timeslice, a column per CPU share; 100 % share appears in every row).
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
    pandas.DataFrame
        What it drew: per variant and queue, ``n``, ``median``, ``q25``, ``q75``, ``mean``, ``std``.
    """
    return facet_lines(spread_full_share(tables.runs), x="buffer_bdp", value=value, hue="variant", row=row, col=col,
                       logx=True, title=title, ceiling=value == "throughput_mbit")


def std_vs_share(tables: Tables, *, row: str | None = "timeslice_ms", col: str | None = "rtt_ms",
                 hue: str = "variant", title: str | None = None):
    """Figure 12: the standard deviation of the per-run throughputs over the CPU share.

    Parameters
    ----------
    tables : Tables
        A selection; repetitions of a point are its runs.
    row, col : str or None
    hue : str, default "variant"
    title : str, optional
    Returns
    -------
    matplotlib.figure.Figure
        The figure (a figure that says "Nothing to plot: ..." when the selection is empty).
    pandas.DataFrame
        What it drew: per line and x, ``n``, ``median``, ``q25``, ``q75``, ``mean``, ``std`` over repetitions.
    """
    return facet_lines(spread_full_share(tables.runs), x="cpu_share_pct", value="throughput_mbit", hue=hue, row=row,
                       col=col, stat="std", band=False, ylabel=LABELS["std"], title=title)


def patched_versions(runs: pd.DataFrame) -> pd.DataFrame:
    """BBR runs of every BBR version that has patched runs: the patched and the stock ones.

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table.

    Returns
    -------
    pandas.DataFrame
        The rows of BBR versions with patched runs (e.g. BBRv3 and BBRv3 patched); none without.
    """
    if runs.empty or "bbr_version" not in runs:
        return runs.iloc[0:0]
    bbr = runs[runs["bbr_version"].notna()]
    versions = set(bbr.loc[bbr["patched"].astype(bool), "bbr_version"])
    return bbr[bbr["bbr_version"].isin(versions)]


def patched_vs_original(tables: Tables, *, row: str | None = "timeslice_ms", col: str | None = "rtt_ms",
                        title: str | None = None):
    """Figures 10/15: medians of patched and stock BBR of the same version side by side.

    Figure 10 is BBRv3 vs BBRv3 patched, figure 15 BBRv1; versions without patched runs (and CCAs that
    are not BBR) are left out (:func:`patched_versions`).

    Parameters
    ----------
    tables : Tables
        A selection.
    row, col : str or None
    title : str, optional
    Returns
    -------
    matplotlib.figure.Figure
        The figure (a figure that says "Nothing to plot: ..." when the selection is empty).
    pandas.DataFrame
        What it drew: per line and x, ``n``, ``median``, ``q25``, ``q75``, ``mean``, ``std`` over repetitions.
    """
    return facet_lines(spread_full_share(patched_versions(tables.runs)), x="cpu_share_pct", value="throughput_mbit",
                       hue="variant", row=row, col=col, title=title, ceiling=True)


def timeseries(tables: Tables, *, row: str | None = "variant", col: str | None = "timeslice_ms",
               alpha: float = 0.5, title: str | None = None):
    """Figure 5: throughput over time, one thin line per run, facets variant x timeslice.

    Parameters
    ----------
    tables : Tables
        A selection; its ``intervals`` (iperf3's per-interval receiver throughput summed over streams)
        are drawn, one line per run of its ``runs``.
    row, col : str or None
    alpha : float, default 0.5
        Line opacity (many runs overlap).
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
    pandas.DataFrame
        The intervals drawn, with the run columns the facets use. Lines are labelled with run ids
        (see ``points.json``); above :data:`MANY_LINES` runs per panel one line collection per variant.
    """
    runs, intervals = tables.runs, tables.intervals
    keep = [c for c in ("run_id", "variant", "timeslice_ms", "cpu_share_pct", "rtt_ms", "rate_mbit") if c in runs]
    table = intervals.merge(runs[keep], on="run_id", how="inner") if len(intervals) else intervals
    if table.empty:
        return empty_figure("Nothing to plot: no iperf3 intervals for the selected runs."), table
    rows, cols = levels(table, row), levels(table, col)
    with style():
        fig, axes = grid(len(rows), len(cols))
        for i, rv in enumerate(rows):
            for j, cv in enumerate(cols):
                ax = axes[i][j]
                _run_lines(ax, cell_rows(table, row, rv, col, cv), alpha)
                ax.set_title(panel_title(row, rv, col, cv))
        fit_y(axes)  # after the last panel: the shared y axis covers every panel's runs
        label_edges(axes, LABELS["t_s"], LABELS["throughput_mbit"])
        fig.tight_layout()  # lines are labelled with their run ids (see points.json), too many for a legend
        if title:
            fig.suptitle(title, y=1.02)
    return fig, table


#: Above this many runs in one panel, a panel's runs are drawn as one LineCollection per CCA (fast).
MANY_LINES = 200


def _run_lines(ax, cell: pd.DataFrame, alpha: float) -> None:
    """One line per run (throughput at each interval's end), coloured by variant."""
    if cell.empty:
        return
    cell = cell.sort_values(["run_id", "t_end_s"], kind="stable")
    ids = cell["run_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    xs = np.split(cell["t_end_s"].to_numpy(dtype=float), starts[1:])
    ys = np.split(cell["throughput_mbit"].to_numpy(dtype=float), starts[1:])
    variants = cell["variant"].astype(str).to_numpy()[starts]
    if len(starts) <= MANY_LINES:
        for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
            ax.plot(x, y, alpha=alpha, linewidth=0.8, color=colour(variants[k], k), label=str(ids[starts[k]]))
        return
    for k, variant in enumerate(sorted(set(variants))):
        segs = [np.column_stack((x, y)) for x, y, c in zip(xs, ys, variants, strict=True) if c == variant]
        ax.add_collection(LineCollection(segs, colors=colour(variant, k), alpha=alpha, linewidths=0.5, label=variant))


SS_PANELS = {
    "rates": (("pacing_rate_mbit", "pacing rate"), ("delivery_rate_mbit", "delivery rate"),
              ("bw_mbit", "BBR bw estimate")),
    "inflight": (("inflight_bdp", "inflight [BDP]"),),
    "gains": (("pacing_gain", "pacing_gain"), ("cwnd_gain", "cwnd_gain")),
}
SS_YLABELS = {"rates": "rate [Mbit/s]", "inflight": "inflight [BBR BDP]", "gains": "gain"}


def socket_state(tables: Tables, *, run_ids: Sequence[str] | None = None, panels: Sequence[str] = ("rates",),
                 max_runs: int = 6, title: str | None = None, partial_samples: bool = False):
    """Figures 6 (rates), 9 (+ inflight in BBR's BDP, a line at 1 BDP) and 11 (+ gains) of single flows.

    One column per sampled run, one row per panel kind.

    Parameters
    ----------
    tables : Tables
        A selection; its ``ss`` samples are drawn.
    run_ids : sequence of str, optional
        The runs to show (e.g. picked with :func:`bbrlab.analysis.explore.pick_runs`); default: a representative
        run per variant x timeslice x share (:func:`representative_runs`), at most ``max_runs``.
    panels : sequence of str, default ("rates",)
        Among ``"rates"`` (pacing rate, delivery rate, BBR's bw estimate), ``"inflight"`` and ``"gains"``.
    max_runs : int, default 6
    title : str, optional
    partial_samples : bool, default False
        Also draw runs whose samples are known to be partial (``sampling_complete`` False: dropped samples, a
        sampler that did not end by its stop file, samples short of the transfer); left out by default.

    Returns
    -------
    matplotlib.figure.Figure
    pandas.DataFrame
        The ss rows drawn.

    Raises
    ------
    ValueError
        An unknown panel name.
    """
    ss, runs = tables.ss, tables.runs
    if not partial_samples:
        ss = evidence.without(ss, evidence.partial_samples(runs))
    unknown = set(panels) - set(SS_PANELS)
    if unknown:
        raise ValueError(f"panels must be among {', '.join(SS_PANELS)}; got {', '.join(sorted(unknown))}")
    sampled = set(ss["run_id"]) if len(ss) else set()
    ids = list(run_ids) if run_ids is not None else representative_runs(runs, have=sampled)[:max_runs]
    table = ss[ss["run_id"].isin(ids)] if len(ss) else ss
    if table.empty:
        return empty_figure("Nothing to plot: no ss samples for the selected runs (sample with flow.sample_ms)."), \
            table
    ids = [i for i in ids if i in set(table["run_id"])]
    info = runs.set_index("run_id")
    with style():
        fig, axes = grid(len(panels), len(ids), sharey=False)
        for j, run_id in enumerate(ids):
            part = table[table["run_id"] == run_id].sort_values("t_s")
            for i, panel in enumerate(panels):
                _ss_panel(axes[i][j], part, panel)
                if j == 0:
                    axes[i][j].set_ylabel(SS_YLABELS[panel])
            axes[0][j].set_title(_run_title(info, run_id))
            axes[-1][j].set_xlabel(LABELS["t_s"])
        fit_y(axes)
        figure_legend(fig, axes, title)
    return fig, table


def _ss_panel(ax, part: pd.DataFrame, panel: str) -> None:
    drawn = 0
    for k, (col, label) in enumerate(SS_PANELS[panel]):
        if col in part and part[col].notna().any():
            ax.plot(part["t_s"], part[col], label=label, color=FALLBACK[(k + 3 * list(SS_PANELS).index(panel))
                                                                        % len(FALLBACK)])
            drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "not in the samples\n(no BBR state for this CCA)", ha="center", va="center",
                transform=ax.transAxes, fontsize=7, color="gray")
        return
    if panel == "inflight":
        ax.axhline(1.0, color="green", linewidth=0.8, linestyle="--", label="_1 BDP")


def _run_title(info: pd.DataFrame, run_id: str) -> str:
    if run_id not in info.index:
        return str(run_id)
    r = info.loc[run_id]
    if isinstance(r, pd.DataFrame):
        r = r.iloc[0]
    return (f"{r['variant']} | {level_label('timeslice_ms', r['timeslice_ms'])}\n"
            f"{level_label('cpu_share_pct', r['cpu_share_pct'])}")


def link_utilisation(tables: Tables, *, x: str = "rate_mbit", hue: str = "kernel_variant",
                     row: str | None = "streams", col: str | None = "hypervisor", title: str | None = None):
    """Poster figure 2: link utilisation (median, IQR band, every run as a dot) over the bandwidth.

    Parameters
    ----------
    tables : Tables
        A selection (the poster: 0.1 % loss).
    x : str, default "rate_mbit"
    hue : str, default "kernel_variant"
        One line per sender kernel and variant (``"<kernel> / <variant>"``).
    row, col : str or None
        Default: a row per number of flows, a column per hypervisor.
    title : str, optional
    Returns
    -------
    matplotlib.figure.Figure
        The figure (a figure that says "Nothing to plot: ..." when the selection is empty).
    pandas.DataFrame
        What it drew: per line and x, ``n``, ``median``, ``q25``, ``q75``, ``mean``, ``std`` over repetitions.
    """
    runs = tables.runs
    if runs.empty:
        return facet_lines(runs, x=x, value="link_utilisation", hue="variant", row=row, col=col)
    kernel = runs["kernel"].astype("string").fillna(NOT_RECORDED)
    data = runs.assign(kernel_variant=kernel + " / " + runs["variant"].astype("string"))
    fig, table = facet_lines(data, x=x, value="link_utilisation", hue=hue, row=row, col=col, title=title)
    _add_run_dots(fig, data, x=x, row=row, col=col, table=table)
    return fig, table


def _add_run_dots(fig, data: pd.DataFrame, *, x: str, row, col, table: pd.DataFrame) -> None:
    """Every run's value as a faint unlabelled dot behind the medians (the spread the poster shows)."""
    if table.empty or not fig.axes:
        return
    for ax, rv, cv in panel_cells(fig, table, row, col):
        cell = cell_rows(data, row, rv, col, cv)
        ax.scatter(cell[x], cell["link_utilisation"], s=4, color="black", alpha=0.25, label="_runs", zorder=1)
    fit_y(fig.axes)  # a run may lie beyond its quartiles


# -- loss sweeps: goodput and transfer time of iperf3 and rsync ------------------------------------------

TIMED_OUT_LABEL = "timed out (each copy)"


def goodput_vs_loss(tables: Tables, *, row: str | None = "workload", col: str | None = "cpu_share_pct",
                    hue: str = "variant", logy: bool = True, title: str | None = None):
    """Goodput (median, IQR band) over the configured loss, a line per variant, facets workload x share.

    An iperf3 run's goodput is its throughput; an rsync copy's is the bytes that arrived over its wall time,
    copies that ran into ``transfer_timeout_s`` included: each of those is also marked ``x`` at the goodput
    it reached.

    Parameters
    ----------
    tables : Tables
        A selection (:func:`bbrlab.analysis.data.select`); its ``runs`` are drawn.
    row, col : str or None
        Facet columns (None: one row/column).
    hue : str, default "variant"
        One line per value of this column.
    logy : bool, default True
        Goodput falls by orders of magnitude between 0 and 30 % loss.
    title : str, optional
        Shown above the legend.

    Returns
    -------
    matplotlib.figure.Figure
        The figure ("Nothing to plot: ..." when the selection is empty).
    pandas.DataFrame
        What it drew: per line and loss, ``n``, ``median``, ``q25``, ``q75``, ``mean``, ``std``.

    Examples
    --------
    >>> fig, table = plots.goodput_vs_loss(data.select(tables, ss_sampled=False))  # doctest: +SKIP
    """
    runs = tables.runs
    fig, table = facet_lines(runs, x="loss_pct", value="goodput_mbit", hue=hue, row=row, col=col, logy=logy,
                             title=title)
    _mark_timed_out(fig, runs, table, y="goodput_mbit", row=row, col=col, title=title)
    return fig, table


def transfer_time_vs_loss(tables: Tables, *, row: str | None = None, col: str | None = "cpu_share_pct",
                          hue: str = "variant", title: str | None = None):
    """rsync copies: wall time (median, IQR band) over the configured loss, a line per variant (log y).

    A copy that timed out counts with the time it ran (its timeout), so where one did the median is a lower
    bound; each such copy is marked ``x``. Runs of other workloads are left out.

    Parameters
    ----------
    tables : Tables
        A selection; its rsync runs are drawn.
    row, col : str or None
        Facet columns.
    hue : str, default "variant"
        One line per value of this column.
    title : str, optional
        Shown above the legend.

    Returns
    -------
    matplotlib.figure.Figure
        The figure ("Nothing to plot: ..." without rsync copies).
    pandas.DataFrame
        What it drew: per line and loss, statistics of ``elapsed_s`` over the copies.

    Examples
    --------
    >>> fig, table = plots.transfer_time_vs_loss(data.select(tables, workload="rsync"))  # doctest: +SKIP
    """
    runs = tables.runs
    copies = runs[runs["workload"] == RsyncParams.name] if "workload" in runs.columns else runs.iloc[0:0]
    if copies.empty:
        return empty_figure("Nothing to plot: no rsync copies in the selection (workloads: [rsync])."), \
            summarise(copies, ["loss_pct"], "elapsed_s")
    fig, table = facet_lines(copies, x="loss_pct", value="elapsed_s", hue=hue, row=row, col=col, logy=True,
                             title=title)
    _mark_timed_out(fig, copies, table, y="elapsed_s", row=row, col=col, title=title)
    return fig, table


def _mark_timed_out(fig, runs: pd.DataFrame, table: pd.DataFrame, *, y: str, row, col, title) -> None:
    """Each timed-out run as an ``x`` at its loss and ``y``, in its facet; the legend says what ``x`` means."""
    if table.empty or "timed_out" not in runs.columns:
        return
    late = runs[runs["timed_out"].fillna(False).astype(bool)]
    if late.empty:
        return
    for ax, rv, cv in panel_cells(fig, table, row, col):
        cell = cell_rows(late, row, rv, col, cv)
        if len(cell):
            ax.plot(cell["loss_pct"], cell[y], linestyle="none", marker="x", markersize=5, color="black",
                    label=TIMED_OUT_LABEL)
    fit_y(fig.axes)
    for legend in list(fig.legends):
        legend.remove()
    figure_legend(fig, np.array(fig.axes), title)
