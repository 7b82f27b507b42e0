"""The facet engine behind bbrlab's figures: panel grids, levels and their labels, colours, the publication style.

A figure is a grid of panels, one per level of a ``row`` column times one per level of a ``col`` column,
with one line per level of a ``hue`` column in each panel. :func:`facet_lines` draws the median (with the
order-statistic confidence interval of the median as its band, and the legend says the level each n reaches:
"n = 2: [min, max], 50 %"; the interquartile range stays in the table)
or the standard deviation over repetitions that way; :mod:`bbrlab.analysis.plots`
builds the paper's figures on it. :func:`save` writes PDF (for papers) and PNG (for a quick look) plus
``<name>.points.json``, the coordinates read back from the figure's lines (:func:`plotted_points`), so
anyone can verify a figure against the table without parsing an image. Each panel there also carries its
axis limits, so :func:`bbrlab.analysis.offaxis.points_outside_axes` can tell which drawn points a reader does not see.

Axis limits are set once a grid is drawn (:func:`fit_y`), never panel by panel: panels share their y
axis, and a limit fixed while only the first panel had data would hide every later panel's higher lines.

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

from . import runkey
from .data import summarise
from .stats import LEVEL, level_text, median_interval

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
          "loss_pct": "loss [%]", "goodput_mbit": "goodput [Mbit/s]", "elapsed_s": "transfer time [s]",
          "buffer_bdp": "bottleneck queue in force [BDP]", "mean_rtt_ms": "sender's mean RTT [ms]"}
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
        Per axes: ``title``, ``xlabel``, ``ylabel``, ``xlim`` and ``ylim`` (the axis limits as drawn,
        ``[low, high]``) and ``lines``, each ``{"label", "x", "y"}`` (a collection of many run lines:
        ``{"label", "segments"}``, [[x, y], ...] per run). A reference line that may leave the panel on
        purpose (:func:`mark_reference`, e.g. the CPU ceiling) also has ``"reference": true``. Each panel's
        ``bands`` are the drawn bands (:func:`mark_band`): ``{"label", "shows", "x", "low", "high"}``.
    """
    out = []
    for ax in fig.axes:
        lines = [{"label": ln.get_label(), "x": _plain(ln.get_xdata()), "y": _plain(ln.get_ydata()),
                  **_reference_flag(ln)}
                 for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        lines += [{"label": c.get_label(), "segments": [seg.tolist() for seg in c.get_segments()],
                   **_reference_flag(c)}
                  for c in ax.collections if isinstance(c, LineCollection) and not c.get_label().startswith("_")]
        bands = [{k: v if isinstance(v, str) else _plain(v) for k, v in c.bbrlab_band.items()}
                 for c in ax.collections if getattr(c, "bbrlab_band", None)]
        out.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                    "xlim": [float(v) for v in ax.get_xlim()], "ylim": [float(v) for v in ax.get_ylim()],
                    "lines": lines, "bands": bands})
    return out


#: What the band around a median line shows (figure legends and points.json say so; the level is per point).
BAND_SHOWS = "CI of the median (order statistics)"


def mark_band(artist, label: str, x, low, high, shows: str = BAND_SHOWS, level=None, n=None, blocks=None):
    """Keep a band's data on its artist, for :func:`plotted_points` and :func:`fit_y`; returns the artist.
    ``level`` (the coverage each point's interval reaches), ``n`` (its runs) and ``blocks`` (the blocks its
    interval counts, where the block is the unit; NaN elsewhere) go to points.json too."""
    artist.bbrlab_band = {"label": label, "shows": shows, "x": np.asarray(x, dtype=float), "low": np.asarray(low, dtype=float),
                          "high": np.asarray(high, dtype=float)}
    if level is not None:
        artist.bbrlab_band["level"] = np.asarray(level, dtype=float)
    if n is not None:
        artist.bbrlab_band["n"] = np.asarray(n, dtype=float)
    if blocks is not None:
        artist.bbrlab_band["blocks"] = pd.Series(blocks).astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    return artist


def band_levels(table: pd.DataFrame, asked: float = LEVEL) -> str:
    """The levels a table's intervals reach, as a legend says them: ``"n >= 6: >= 95 %"`` for the points that
    reach the asked level, and each smaller n with its own (``"n = 2: [min, max], 50 %"``), joined by ``"; "``.
    Points whose unit is the block (``unit`` = ``block``) count blocks: ``"blocks = 2: [min, max], 50 %"``."""
    with_ci = table[table["ci_low"].notna()] if "ci_low" in table else table.iloc[0:0]
    if with_ci.empty or "ci_level" not in with_ci:
        return ""
    parts = []
    blocked = with_ci["unit"].eq("block") if "unit" in with_ci else pd.Series(False, index=with_ci.index)
    for word, rows, count in (("n", with_ci[~blocked], "n"), ("blocks", with_ci[blocked], "blocks")):
        below = sorted(set(rows.loc[rows["ci_level"] < asked - 1e-12, count].astype(int)))
        parts += [median_interval(range(k), asked).text().replace("n = ", f"{word} = ") for k in below]
        reached = rows[rows["ci_level"] >= asked - 1e-12]
        if not reached.empty:
            parts.append(f"{word} >= {int(reached[count].min())}: >= {level_text(asked)}")
    return "; ".join(parts)


def band_title(table: pd.DataFrame) -> str:
    """``"band: CI of the median (order statistics), n = 2: [min, max], 50 %"``: what the band is and the level
    its points reach."""
    levels = band_levels(table)
    return f"band: {BAND_SHOWS}, {levels}" if levels else f"band: {BAND_SHOWS}"


def _plain(values) -> list:
    return [None if isinstance(v, float) and math.isnan(v) else v for v in np.asarray(values, dtype=float).tolist()]


#: The gid of an artist allowed to leave its panel (a reference such as the CPU ceiling, not data).
REFERENCE_GID = "bbrlab-reference"


def mark_reference(artist):
    """Mark a drawn reference (not data) that may leave its panel on purpose; returns the artist."""
    artist.set_gid(REFERENCE_GID)
    return artist


def _reference_flag(artist) -> dict:
    return {"reference": True} if artist.get_gid() == REFERENCE_GID else {}


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


def cell_rows(df: pd.DataFrame, row: str | None, rv, col: str | None, cv) -> pd.DataFrame:
    """The rows of one panel: ``row`` == ``rv`` and ``col`` == ``cv`` (a None facet selects nothing out)."""
    return _select(_select(df, row, rv), col, cv)


def panel_title(row: str | None, rv, col: str | None, cv) -> str:
    """``"timeslice 1 ms | RTT 10 ms"``: the panel's row and column levels."""
    return " | ".join(level_label(c, v) for c, v in ((row, rv), (col, cv)) if c is not None)


def label_edges(axes, xlabel: str, ylabel: str) -> None:
    """The x label under the bottom row of a panel grid, the y label beside its left column."""
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)


def panel_cells(fig, table: pd.DataFrame, row: str | None, col: str | None):
    """The panels of a figure laid out from ``table`` by ``row`` x ``col``, each as (axes, rv, cv)."""
    rows, cols = levels(table, row), levels(table, col)
    for idx, ax in enumerate(fig.axes[: len(rows) * len(cols)]):
        yield ax, rows[idx // len(cols)], cols[idx % len(cols)]


def colour(key, index: int) -> str:
    """The fixed colour of a variant label, else the index-th colour of the default cycle."""
    return VARIANT_COLOURS.get(str(key), FALLBACK[index % len(FALLBACK)])


def grid(n_rows: int, n_cols: int, sharey: bool = True):
    """A figure of ``n_rows`` x ``n_cols`` panels sharing x (and y unless ``sharey`` is false).

    Each panel is :data:`PANEL_WIDTH_IN` x :data:`PANEL_HEIGHT_IN` inches. Returns (figure, 2-D array of axes).
    """
    fig, axes = plt.subplots(n_rows, n_cols, squeeze=False, sharex=True, sharey=sharey,
                             figsize=(PANEL_WIDTH_IN * n_cols + 0.6, PANEL_HEIGHT_IN * n_rows + 0.4))
    return fig, axes


def fit_y(axes, *, from_zero: bool = True) -> None:
    """Fit the y axes of a drawn grid to everything drawn in it; call it once all panels have their data.

    Each panel's y axis is autoscaled again from all its artists (and, when panels share y, from all of
    theirs), then a linear axis whose data are not negative starts at zero (rates and their spread:
    no exaggerated zoom). Setting a limit panel by panel instead froze a shared axis at the first
    panel's data and hid the higher lines of later panels.

    Parameters
    ----------
    axes : array of matplotlib.axes.Axes
        The grid (:func:`grid`) or any iterable of axes.
    from_zero : bool, default True
    """
    flat = list(np.ravel(axes))
    for ax in flat:
        ax.relim()  # older matplotlib skips collections here (3.11 does not): the bands are added back below
        for c in ax.collections:
            band = getattr(c, "bbrlab_band", None)
            if band is not None:
                pts = np.column_stack([np.r_[band["x"], band["x"]], np.r_[band["low"], band["high"]]])
                ax.update_datalim(pts[np.isfinite(pts).all(axis=1)])
        ax.autoscale(enable=True, axis="y")
    for ax in flat:
        if from_zero and ax.get_yscale() == "linear" and np.isfinite(ax.dataLim.y0) and ax.dataLim.y0 >= 0:
            ax.set_ylim(bottom=0)


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
                title: str | None = None, hue_label=None, ceiling: bool = False, logx: bool = False):
    """Lines of ``stat`` of ``value`` over ``x``, one per ``hue``, in a ``row`` x ``col`` grid.

    ``stat='median'`` draws the median with the order-statistic confidence interval of the median as its band
    (:data:`BAND_SHOWS`, the legend says the level reached, :func:`band_title`; the table also keeps the interquartile range, ``q25``/``q75``); ``'std'`` the standard
    deviation. A title, when given, is followed by what the band shows.
    ``logy``, ``logx``: logarithmic axes.
    ``ceiling`` also draws the sender's CPU ceiling (column ``ceiling_mbit``, see :mod:`bbrlab.calibration.calibrate`)
    when ``value`` is the throughput and the runs carry one (:func:`ceiling_lines`).
    Returns (figure, summary table).
    """
    needed = [x, value]
    lacking = missing_columns(runs, needed)
    if runs.empty or lacking:
        why = "no runs match the selection" if runs.empty else f"the data has no {', '.join(lacking)}"
        return empty_figure(f"Nothing to plot: {why}."), summarise(runs.iloc[0:0], [x], value)
    by = [c for c in (row, col, hue, x) if c is not None]
    runs, added = runkey.split(runs, hue, by)  # a point is one condition: what else differs joins the hue
    table = summarise(runs, [*by, *added], value)
    rows, cols, hues = levels(table, row), levels(table, col), levels(table, hue)
    with style():
        fig, axes = grid(len(rows), len(cols))
        for i, rv in enumerate(rows):
            for j, cv in enumerate(cols):
                ax = axes[i][j]
                cell = cell_rows(table, row, rv, col, cv)
                for k, hv in enumerate(hues):
                    _draw_line(ax, _select(cell, hue, hv).sort_values(x), x, stat, band,
                               (hue_label or _hue_text)(hv), colour(hv, k))
                if ceiling and value == "throughput_mbit":
                    ceiling_lines(ax, cell_rows(runs, row, rv, col, cv), x=x, hue=hue, hues=hues)
                ax.set_title(panel_title(row, rv, col, cv))
                if logy:
                    ax.set_yscale("log")
                if logx:
                    ax.set_xscale("log")
        fit_y(axes)  # once every panel is drawn: the shared y axis then covers all of them
        label_edges(axes, LABELS.get(x, x), ylabel or LABELS.get(value, value))
        if ceiling and value == "throughput_mbit" and not logy:
            _keep_data_in_view(axes, runs, table)
        drew_band = band and stat == "median" and table["ci_low"].notna().any()
        figure_legend(fig, axes, f"{title}; {band_title(table)}" if title and drew_band else
                      title or (band_title(table) if drew_band else None))
    return fig, table


#: What the ceiling depends on besides the x axis (bbrlab.run.ceiling.PointKey): one line per level a panel mixes.
CEILING_DIMENSIONS = ("timeslice_ms", "rtt_ms")
CEILING_LABEL = "CPU ceiling"
#: Dash-dot, so that it is not taken for a patched variant (dashed, in its variant's colour).
CEILING_STYLE = {"linestyle": "-.", "linewidth": 1.0, "marker": "", "zorder": 1}
#: How far above the highest rate (or band) the y axis of a figure with a ceiling line ends.
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
        mark_reference(ax.plot(part[x], part["median"], color=colour_, **CEILING_STYLE,
                               label=f"{CEILING_LABEL}{' (' + extra + ')' if extra else ''}")[0])
    return table


def _keep_data_in_view(axes, runs: pd.DataFrame, table: pd.DataFrame) -> None:
    """A ceiling far above the link rates would squash the curves: the y axis then ends a little above the
    highest rate or band, and the ceiling line leaves the frame at the top (it is above all that is drawn)."""
    tops = [table[c].max() for c in ("ci_high", "median") if c in table]
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
    if band and stat == "median" and part["ci_low"].notna().any():
        mark_band(ax.fill_between(part[x], part["ci_low"], part["ci_high"], color=color, alpha=0.18, linewidth=0,
                                  label=f"_band {label}"), label, part[x], part["ci_low"], part["ci_high"],
                  level=part["ci_level"] if "ci_level" in part else None, n=part["n"],
                  blocks=part["blocks"] if "unit" in part and part["unit"].eq("block").any() else None)


def figure_legend(fig, axes, title: str | None = None) -> None:
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

