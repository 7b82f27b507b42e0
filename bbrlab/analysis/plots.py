"""The paper's figures from bbrlab's tables, in one publication style.

Every figure function takes :class:`~bbrlab.analysis.tables.Tables` (from :func:`bbrlab.analysis.data.load` and
:func:`bbrlab.analysis.data.select`) and returns ``(figure, table)``: the matplotlib Figure and the DataFrame it
plotted (medians with 25th/75th percentiles over repetitions, or the raw rows for time series), so a
notebook can show, save or check both. :func:`save` writes PDF (for papers) and PNG (for a quick look)
plus ``<name>.points.json``, the coordinates read back from the figure's lines, so anyone can verify a
figure against the table without parsing an image.

Facet dimensions that the data lacks never raise: an empty selection gives a figure that says what is
missing, and a column with no values collapses to a single facet labelled "not recorded".
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection

from .data import summarise
from .tables import Tables

STYLE = {
    "figure.dpi": 110, "savefig.dpi": 200, "savefig.bbox": "tight", "font.size": 8, "axes.titlesize": 8,
    "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.2,
    "lines.markersize": 3.5, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
    "axes.spines.right": False, "pdf.fonttype": 42, "ps.fonttype": 42, "legend.frameon": False,
}
#: Fixed colours so a congestion control (its ``variant``, see :mod:`bbrlab.analysis.identity`) looks the same in
#: every figure; patched variants take a darker shade of their version's colour and are drawn dashed.
VARIANT_COLOURS = {"Cubic": "#4d4d4d", "Reno": "#999999", "BBRv1": "#1f77b4", "BBRv1 patched": "#0b3c6b",
                   "BBRv2": "#2ca02c", "BBRv2 patched": "#145214", "BBRv3": "#d62728", "BBRv3 patched": "#ff7f0e"}
FALLBACK = plt.rcParams["axes.prop_cycle"].by_key()["color"]
LABELS = {"throughput_mbit": "throughput [Mbit/s]", "cpu_share_pct": "CPU share [%]", "timeslice_ms": "timeslice",
          "rtt_ms": "RTT [ms]", "rate_mbit": "bandwidth [Mbit/s]", "link_utilisation": "link utilisation",
          "streams": "flows", "t_s": "time [s]", "std": "std. dev. of throughput [Mbit/s]",
          "loss_pct": "loss [%]", "goodput_mbit": "goodput [Mbit/s]", "elapsed_s": "transfer time [s]"}
#: Short names for facet titles ("RTT 10 ms", "share 25 %").
FACET_NAMES = {"cpu_share_pct": "share", "timeslice_ms": "timeslice", "rtt_ms": "RTT", "rate_mbit": "bandwidth",
               "streams": "flows", "loss_pct": "loss", "hypervisor": "hypervisor", "cca": "", "variant": "",
               "kernel": "kernel", "load_pct": "load", "workload": ""}
UNITS = {"timeslice_ms": "ms", "rtt_ms": "ms", "rate_mbit": "Mbit/s", "cpu_share_pct": "%", "loss_pct": "%",
         "load_pct": "%"}
NOT_RECORDED = "not recorded"
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 2.3, 1.8


@contextmanager
def style():
    """Apply the publication style (:data:`STYLE`) to the figures made inside the block.

    Examples
    --------
    >>> with plots.style():          # doctest: +SKIP
    ...     fig, ax = plt.subplots()
    """
    with plt.rc_context(STYLE):
        yield


def save(fig, out_dir: str | Path, name: str, formats: Sequence[str] = ("pdf", "png")) -> list[Path]:
    """Write a figure as ``name.pdf`` / ``name.png`` and ``name.points.json`` (what its lines show).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    out_dir : str or pathlib.Path
        Created if missing.
    name : str
        File name without suffix, e.g. ``"fig04_throughput_vs_share"``.
    formats : sequence of str, default ("pdf", "png")

    Returns
    -------
    list of pathlib.Path
        The files written; ``points.json`` is :func:`plotted_points` of the figure.

    Examples
    --------
    >>> plots.save(fig, "build/figures", "fig04_throughput_vs_share")  # doctest: +SKIP
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out / f"{name}.{fmt}"
        fig.savefig(path, bbox_inches="tight", dpi=STYLE["savefig.dpi"])
        paths.append(path)
    points = out / f"{name}.points.json"
    points.write_text(json.dumps(plotted_points(fig), indent=1))
    paths.append(points)
    return paths


def show(fig) -> None:
    """Display a figure once in a notebook, then close it (frees its memory; no second copy at the end).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    """
    try:
        from IPython.display import display

        display(fig)
    finally:
        plt.close(fig)


def plotted_points(fig) -> list[dict]:
    """What a figure shows, read back from its artists (to check a figure without parsing an image).

    Parameters
    ----------
    fig : matplotlib.figure.Figure

    Returns
    -------
    list of dict
        Per axes: ``title``, ``xlabel``, ``ylabel`` and ``lines``, each ``{"label", "x", "y"}`` (a
        collection of many run lines: ``{"label", "segments"}``, [[x, y], ...] per run).
    """
    out = []
    for ax in fig.axes:
        lines = [{"label": ln.get_label(), "x": _plain(ln.get_xdata()), "y": _plain(ln.get_ydata())}
                 for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        lines += [{"label": c.get_label(), "segments": [seg.tolist() for seg in c.get_segments()]}
                  for c in ax.collections if isinstance(c, LineCollection) and not c.get_label().startswith("_")]
        out.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "lines": lines})
    return out


def _plain(values) -> list:
    return [None if isinstance(v, float) and math.isnan(v) else v for v in np.asarray(values, dtype=float).tolist()]


# -- labels, levels and colours ----------------------------------------------------------------

def level_label(col: str, value) -> str:
    """``rtt_ms``, 10 -> ``"RTT 10 ms"``; a missing value -> ``"<name> not recorded"``."""
    name = FACET_NAMES.get(col, col)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return f"{name} {NOT_RECORDED}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    unit = UNITS.get(col, "")
    if col == "streams":
        return f"{value:g} flow{'s' if value != 1 else ''}" if isinstance(value, int | float) else str(value)
    return f"{name} {value}{(' ' + unit) if unit else ''}".strip()


def levels(df: pd.DataFrame, col: str | None) -> list:
    """Sorted distinct values of a facet column (NaN kept as one level); [None] for no facet."""
    if col is None or col not in df.columns or df.empty:
        return [None]
    values = df[col].drop_duplicates().tolist()
    present = sorted(v for v in values if not _missing(v))
    return present + ([float("nan")] if any(_missing(v) for v in values) else [])


def _missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _select(df: pd.DataFrame, col: str | None, value) -> pd.DataFrame:
    if col is None or col not in df.columns:
        return df
    return df[df[col].isna()] if _missing(value) else df[df[col] == value]


def _cell(df: pd.DataFrame, row: str | None, rv, col: str | None, cv) -> pd.DataFrame:
    """The rows of one panel: ``row`` == ``rv`` and ``col`` == ``cv`` (a None facet selects nothing out)."""
    return _select(_select(df, row, rv), col, cv)


def _panel_title(row: str | None, rv, col: str | None, cv) -> str:
    """``"timeslice 1 ms | RTT 10 ms"``: the panel's row and column levels."""
    return " | ".join(level_label(c, v) for c, v in ((row, rv), (col, cv)) if c is not None)


def _label_edges(axes, xlabel: str, ylabel: str) -> None:
    """The x label under the bottom row of a panel grid, the y label beside its left column."""
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)


def _panels(fig, table: pd.DataFrame, row: str | None, col: str | None):
    """The panels of a figure laid out from ``table`` by ``row`` x ``col``, each as (axes, rv, cv)."""
    rows, cols = levels(table, row), levels(table, col)
    for idx, ax in enumerate(fig.axes[: len(rows) * len(cols)]):
        yield ax, rows[idx // len(cols)], cols[idx % len(cols)]


def colour(key, index: int) -> str:
    """The fixed colour of a variant label, else the index-th colour of the default cycle."""
    return VARIANT_COLOURS.get(str(key), FALLBACK[index % len(FALLBACK)])


def _grid(n_rows: int, n_cols: int, sharey: bool = True):
    fig, axes = plt.subplots(n_rows, n_cols, squeeze=False, sharex=True, sharey=sharey,
                             figsize=(PANEL_WIDTH_IN * n_cols + 0.6, PANEL_HEIGHT_IN * n_rows + 0.4))
    return fig, axes


def empty_figure(message: str):
    """A figure that states what is missing instead of failing."""
    with style():
        fig, ax = plt.subplots(figsize=(4, 1.6))
        ax.axis("off")
        ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=9)
    return fig


def missing_columns(df: pd.DataFrame, needed: Sequence[str]) -> list[str]:
    """Columns absent or without a single value."""
    return [c for c in needed if c not in df.columns or df[c].isna().all()]


# -- full-share runs belong to every timeslice --------------------------------------------------

def spread_full_share(runs: pd.DataFrame, facet: str = "timeslice_ms") -> pd.DataFrame:
    """Runs without a policy (100 % share) whose timeslice is unknown appear in every timeslice facet."""
    if facet not in runs.columns or runs.empty:
        return runs
    loose = runs[(runs["cpu_share_pct"] >= 100) & runs[facet].isna()]
    slices = sorted(runs[facet].dropna().unique())
    if loose.empty or not slices:
        return runs
    copies = [loose.assign(**{facet: s}) for s in slices]
    return pd.concat([runs.drop(loose.index), *copies], ignore_index=True)


# -- the median-with-spread line figure all summary plots share ------------------------------------

def facet_lines(runs: pd.DataFrame, *, x: str, value: str, hue: str, row: str | None, col: str | None,
                stat: str = "median", band: bool = True, logy: bool = False, ylabel: str | None = None,
                title: str | None = None, hue_label=None, ceiling: bool = False):
    """Lines of ``stat`` of ``value`` over ``x``, one per ``hue``, in a ``row`` x ``col`` grid.

    ``stat='median'`` draws the median with its interquartile band; ``'std'`` the standard deviation.
    ``ceiling`` also draws the sender's CPU ceiling (column ``ceiling_mbit``, see :mod:`bbrlab.campaign.calibrate`)
    when ``value`` is the throughput and the runs carry one (:func:`ceiling_lines`).
    Returns (figure, summary table).
    """
    needed = [x, value]
    lacking = missing_columns(runs, needed)
    if runs.empty or lacking:
        why = "no runs match the selection" if runs.empty else f"the data has no {', '.join(lacking)}"
        return empty_figure(f"Nothing to plot: {why}."), summarise(runs.iloc[0:0], [x], value)
    by = [c for c in (row, col, hue, x) if c is not None]
    table = summarise(runs, by, value)
    rows, cols, hues = levels(table, row), levels(table, col), levels(table, hue)
    with style():
        fig, axes = _grid(len(rows), len(cols))
        for i, rv in enumerate(rows):
            for j, cv in enumerate(cols):
                ax = axes[i][j]
                cell = _cell(table, row, rv, col, cv)
                for k, hv in enumerate(hues):
                    _draw_line(ax, _select(cell, hue, hv).sort_values(x), x, stat, band,
                               (hue_label or _hue_text)(hv), colour(hv, k))
                if ceiling and value == "throughput_mbit":
                    ceiling_lines(ax, _cell(runs, row, rv, col, cv), x=x, hue=hue, hues=hues)
                ax.set_title(_panel_title(row, rv, col, cv))
                if logy:
                    ax.set_yscale("log")
                else:
                    ax.set_ylim(bottom=0)  # rates and their spread start at zero: no exaggerated zoom
        _label_edges(axes, LABELS.get(x, x), ylabel or LABELS.get(value, value))
        if ceiling and value == "throughput_mbit" and not logy:
            _keep_data_in_view(axes, runs, table)
        _legend(fig, axes, title)
    return fig, table


#: What the ceiling depends on besides the x axis (bbrlab.run.ceiling.PointKey): one line per level a panel mixes.
CEILING_DIMENSIONS = ("timeslice_ms", "rtt_ms")
CEILING_LABEL = "CPU ceiling"
#: Dash-dot, so that it is not taken for a patched variant (dashed, in its variant's colour).
CEILING_STYLE = {"linestyle": "-.", "linewidth": 1.0, "marker": "", "zorder": 1}
#: How far above the highest rate (or quartile) the y axis of a figure with a ceiling line ends.
CEILING_VIEW_HEADROOM = 1.25


def ceiling_lines(ax, runs: pd.DataFrame, *, x: str, hue: str | None = None, hues: Sequence = ()) -> pd.DataFrame:
    """Draw the median ``ceiling_mbit`` over ``x`` of ``runs`` (one panel) as dash-dotted lines.

    One line per timeslice and RTT the panel still mixes (a panel of one timeslice and RTT gets one
    line); when the hue is one of them, each line takes its hue's colour. Runs without a ceiling are
    skipped, so data without a calibration draws nothing.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    runs : pandas.DataFrame
        The panel's runs.
    x : str
        The x column (``cpu_share_pct``).
    hue, hues : optional
        The figure's hue column and its levels, to colour a line per hue level.

    Returns
    -------
    pandas.DataFrame
        What was drawn: the median ceiling per line and x (empty when nothing was).
    """
    if "ceiling_mbit" not in runs.columns or x not in runs.columns:
        return pd.DataFrame()
    have = runs[runs["ceiling_mbit"].notna()]
    if have.empty:
        return pd.DataFrame()
    dims = [d for d in CEILING_DIMENSIONS if d in have.columns and have[d].nunique() > 1]
    table = summarise(have, [*dims, x], "ceiling_mbit")
    groups = table.groupby(dims, dropna=False, sort=True) if dims else [((), table)]
    for levels_, part in groups:
        levels_ = levels_ if isinstance(levels_, tuple) else (levels_,)
        named = dict(zip(dims, levels_, strict=True))
        colour_ = "black"
        if hue in named and named[hue] in list(hues):
            colour_ = colour(named[hue], list(hues).index(named[hue]))
        extra = ", ".join(level_label(d, v) for d, v in named.items())
        part = part.sort_values(x)
        ax.plot(part[x], part["median"], color=colour_, label=f"{CEILING_LABEL}{' (' + extra + ')' if extra else ''}",
                **CEILING_STYLE)
    return table


def _keep_data_in_view(axes, runs: pd.DataFrame, table: pd.DataFrame) -> None:
    """A ceiling far above the link rates would squash the curves: the y axis then ends a little above the
    highest rate or quartile, and the ceiling line leaves the frame at the top (it is above all that is drawn)."""
    tops = [table[c].max() for c in ("q75", "median") if c in table]
    if "rate_mbit" in runs:
        tops.append(runs["rate_mbit"].max())
    top = CEILING_VIEW_HEADROOM * max((t for t in tops if pd.notna(t)), default=0.0)
    for ax in np.ravel(axes):
        if top > 0 and ax.get_ylim()[1] > top:
            ax.set_ylim(0, top)


def _hue_text(value) -> str:
    return NOT_RECORDED if _missing(value) else str(value)


def _draw_line(ax, part: pd.DataFrame, x: str, stat: str, band: bool, label: str, color: str) -> None:
    if part.empty:
        return
    ax.plot(part[x], part[stat], marker="o", label=label, color=color,
            linestyle="--" if " patched" in label else "-")  # patched variants: dashed, whatever the colour
    if band and stat == "median":
        ax.fill_between(part[x], part["q25"], part["q75"], color=color, alpha=0.18, linewidth=0)


def _legend(fig, axes, title: str | None = None) -> None:
    """One legend for the whole figure, above the panels (with the figure's title, if any)."""
    handles, labels = {}, []
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=False):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.tight_layout()
    if handles or title:
        fig.legend([handles[lab] for lab in labels], labels, loc="lower center", ncols=max(1, min(len(labels), 3 if any(len(x) > 24 for x in labels) else 5)),
                   bbox_to_anchor=(0.5, 1.0), title=title)


# -- the paper's figures --------------------------------------------------------------------------

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
        fig, axes = _grid(len(rows), len(cols))
        for i, rv in enumerate(rows):
            for j, cv in enumerate(cols):
                ax = axes[i][j]
                _run_lines(ax, _cell(table, row, rv, col, cv), alpha)
                ax.set_ylim(bottom=0)
                ax.set_title(_panel_title(row, rv, col, cv))
        _label_edges(axes, LABELS["t_s"], LABELS["throughput_mbit"])
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
    ax.autoscale_view()


SS_PANELS = {
    "rates": (("pacing_rate_mbit", "pacing rate"), ("delivery_rate_mbit", "delivery rate"),
              ("bw_mbit", "BBR bw estimate")),
    "inflight": (("inflight_bdp", "inflight [BDP]"),),
    "gains": (("pacing_gain", "pacing_gain"), ("cwnd_gain", "cwnd_gain")),
}
SS_YLABELS = {"rates": "rate [Mbit/s]", "inflight": "inflight [BBR BDP]", "gains": "gain"}


def representative_runs(runs: pd.DataFrame, by: Sequence[str] = ("variant", "timeslice_ms", "cpu_share_pct"),
                        have: Sequence[str] | None = None) -> list[str]:
    """One typical run per group: the run whose throughput is closest to its group's median.

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table.
    by : sequence of str, default ("variant", "timeslice_ms", "cpu_share_pct")
        The groups.
    have : sequence of str, optional
        Only these run ids qualify (e.g. runs with ss samples).

    Returns
    -------
    list of str
        One run id per group, in group order; a group without throughputs (e.g. the authors' socket
        logs) gives its first run.
    """
    pool = runs if have is None else runs[runs["run_id"].isin(have)]
    if pool.empty:
        return []
    cols = [c for c in by if c in pool.columns]
    chosen = []
    for _, g in pool.groupby(cols, dropna=False, sort=True):
        distance = (g["throughput_mbit"] - g["throughput_mbit"].median()).abs()
        chosen.append(g.loc[distance.idxmin(), "run_id"] if distance.notna().any() else g["run_id"].iloc[0])
    return chosen


def socket_state(tables: Tables, *, run_ids: Sequence[str] | None = None, panels: Sequence[str] = ("rates",),
                 max_runs: int = 6, title: str | None = None):
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
        fig, axes = _grid(len(panels), len(ids), sharey=False)
        for j, run_id in enumerate(ids):
            part = table[table["run_id"] == run_id].sort_values("t_s")
            for i, panel in enumerate(panels):
                _ss_panel(axes[i][j], part, panel)
                if j == 0:
                    axes[i][j].set_ylabel(SS_YLABELS[panel])
            axes[0][j].set_title(_run_title(info, run_id))
            axes[-1][j].set_xlabel(LABELS["t_s"])
        _legend(fig, axes, title)
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
    ax.set_ylim(bottom=0)
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
    for ax, rv, cv in _panels(fig, table, row, col):
        cell = _cell(data, row, rv, col, cv)
        ax.scatter(cell[x], cell["link_utilisation"], s=4, color="black", alpha=0.25, label="_runs", zorder=1)


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
    copies = runs[runs["workload"] == "rsync"] if "workload" in runs.columns else runs.iloc[0:0]
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
    for ax, rv, cv in _panels(fig, table, row, col):
        cell = _cell(late, row, rv, col, cv)
        if len(cell):
            ax.plot(cell["loss_pct"], cell[y], linestyle="none", marker="x", markersize=5, color="black",
                    label=TIMED_OUT_LABEL)
    for legend in list(fig.legends):
        legend.remove()
    _legend(fig, np.array(fig.axes), title)
