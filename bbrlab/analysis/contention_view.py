"""Throughput under the contention models (#28): against the share of a CPU the vCPU really got, and against the
share asked. A label per contention (:func:`contention_label`: ``deadline 1 ms``, ``cfs-quota 100 ms``,
``credit 1 s``, ``competing-load``, ``none``) tells the models and their parameters apart in one legend.
Figures come with the facet engine's style and are read back by :func:`bbrlab.analysis.facets.plotted_points`.
"""

from __future__ import annotations

import pandas as pd

from .facets import colour, empty_figure, facet_lines, figure_legend, fit_y, grid, label_edges, levels, style
from .tables import Tables

#: The columns :func:`vs_achieved_share`'s table keeps for each run.
ACHIEVED_COLUMNS = ("run_id", "variant", "contention", "cpu_share_pct", "achieved_share_pct", "throughput_mbit",
                    "credit_ran_out_s")


def _label(row) -> str:
    mode = row["contention_mode"]

    def num(name: str) -> str:
        v = row.get(name)
        return "?" if v is None or pd.isna(v) else f"{v:g}"
    if mode == "deadline":
        implicit = " implicit" if row.get("deadline_mode") == "implicit" else ""
        return f"deadline {num('timeslice_ms')} ms{implicit}"
    if mode == "cfs-quota":
        return f"cfs-quota {num('cfs_period_ms')} ms"
    if mode == "cfs-burst":
        return f"cfs-burst {num('cfs_period_ms')} ms + {num('cfs_burst_ms')} ms"
    if mode == "credit":
        return f"credit {num('credit_s')} s"
    return "none" if pd.isna(mode) else str(mode)


def contention_label(runs: pd.DataFrame) -> pd.Series:
    """Each run's contention as a legend label: the model and the parameter that tells its runs apart."""
    if runs.empty:
        return pd.Series([], dtype="string", index=runs.index)
    return runs.apply(_label, axis=1).astype("string")


def with_contention(tables: Tables) -> pd.DataFrame:
    """The runs with a ``contention`` column (:func:`contention_label`)."""
    return tables.runs.assign(contention=contention_label(tables.runs))


def vs_achieved_share(tables: Tables, *, col: str | None = "variant", value: str = "throughput_mbit",
                      title: str | None = None):
    """``value`` of every run (a marker each) against the share of a CPU its vCPU threads really got
    (``achieved_share_pct``, from the host's schedstat), a colour per contention, a panel per ``col`` (the CCA's
    variant by default). Runs without the achieved share are left out, and said so in the table's absence.

    Returns
    -------
    matplotlib.figure.Figure
    pandas.DataFrame
        The runs drawn: :data:`ACHIEVED_COLUMNS` (and ``col``).
    """
    runs = with_contention(tables)
    runs = runs[runs["achieved_share_pct"].notna() & runs[value].notna()] if not runs.empty else runs
    if runs.empty:
        return empty_figure("Nothing to plot: no run has an achieved share (contention evidence)"), runs
    cols = levels(runs, col)
    labels = sorted(runs["contention"].unique(), key=str)
    with style():
        fig, axes = grid(1, len(cols))
        for ax, cv in zip(axes[0], cols, strict=True):
            cell = runs if col is None else runs[runs[col] == cv]
            for i, label in enumerate(labels):
                part = cell[cell["contention"] == label]
                if not part.empty:
                    ax.plot(part["achieved_share_pct"], part[value], linestyle="none", marker="o", markersize=4,
                            alpha=0.8, color=colour(label, i), label=str(label))
            ax.set_title("" if col is None else str(cv))
        label_edges(axes, "CPU share the vCPU got [%]", "throughput [Mbit/s]" if value == "throughput_mbit" else value)
        fit_y(axes)
        figure_legend(fig, axes, title)
    keep = [c for c in (*ACHIEVED_COLUMNS, col) if c is not None and c in runs.columns]
    return fig, runs[list(dict.fromkeys(keep))].reset_index(drop=True)


def vs_asked_share(tables: Tables, *, col: str | None = "variant", value: str = "throughput_mbit",
                   title: str | None = None):
    """Median ``value`` (band: the CI of the median, at the level its runs reach) over the share asked (``cpu_share_pct``), a line per contention, a panel per
    ``col``: the same runs as :func:`vs_achieved_share`, on the axis the paper uses."""
    runs = with_contention(tables)
    return facet_lines(runs, x="cpu_share_pct", value=value, hue="contention", row=None, col=col, title=title,
                       hue_label=str)
