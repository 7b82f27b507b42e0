"""Figures of flows that compete (issue #29): each flow's throughput over time, Jain's index and harm
against the contended flow's CPU share, and Cubic with and without fq against the share.

Each function takes :class:`~bbrlab.analysis.tables.Tables` and returns ``(figure, table)`` like
:mod:`bbrlab.analysis.plots`; a selection without the runs a figure needs gives a figure that says so.
"""

from __future__ import annotations

import pandas as pd

from . import fairness, runkey
from .facets import FALLBACK, LABELS, empty_figure, grid, label_edges, style
from .tables import Tables

#: At most this many runs get a panel in :func:`flows_over_time` (the first by run id).
MAX_PANELS = 12


def _pairs(tables: Tables) -> pd.DataFrame:
    """The ok multi-flow runs with ``pair``: flow 0's variant against the other flows' CCAs and origins."""
    runs = tables.runs[(tables.runs["status"] == "ok") & (tables.runs["flows"] > 1)]
    others = tables.flows[tables.flows["flow"] > 0].sort_values(["run_id", "flow"])
    beside: dict[str, list[str]] = {}
    for run_id, cca, origin in zip(others["run_id"], others["cca"], others["origin"], strict=True):
        beside.setdefault(run_id, []).append(f"{cca} ({origin})")
    return runs.assign(pair=[f"{v} vs {', '.join(beside.get(r, []))}" for v, r in zip(runs["variant"], runs["run_id"],
                                                                                      strict=True)])


def flows_over_time(tables: Tables, *, run_ids: list[str] | None = None, title: str | None = None):
    """Per-flow throughput over time (receiver bytes per interval, streams summed), one panel per multi-flow
    run, one line per flow: the layout of the authors' fairness figures. Returns the figure and the
    per-flow intervals drawn."""
    runs = _pairs(tables)
    if run_ids is not None:
        runs = runs[runs["run_id"].isin(run_ids)]
    runs = runs.sort_values("run_id").head(MAX_PANELS)
    streams = tables.streams[tables.streams["run_id"].isin(runs["run_id"])]
    if streams.empty:
        return empty_figure("Nothing to plot: no runs of several flows in the selection."), streams
    table = (streams.groupby(["run_id", "flow", "t_start_s", "t_end_s"], as_index=False)["throughput_mbit"].sum()
             .merge(tables.flows[["run_id", "flow", "cca", "origin"]], on=["run_id", "flow"]))
    with style():
        fig, axes = grid(len(runs), 1)
        for ax, (_, run) in zip(axes[:, 0], runs.iterrows(), strict=True):
            for k, (flow, part) in enumerate(table[table["run_id"] == run["run_id"]].groupby("flow")):
                ax.plot(part["t_end_s"], part["throughput_mbit"], color=FALLBACK[k % len(FALLBACK)],
                        label=f"flow {flow}: {part['cca'].iloc[0]} ({part['origin'].iloc[0]})")
            ax.set_title(f"{run['pair']}, {run['cpu_share_pct']:g} % share, Jain {run['jain_index']:.2f}")
            ax.legend(loc="best", fontsize="small")
        label_edges(axes, LABELS["t_s"], LABELS["throughput_mbit"])
        fig.tight_layout()
        if title:
            fig.suptitle(title, y=1.02)
    return fig, table


def _vs_share(ax, frame: pd.DataFrame, value: str, by: str) -> pd.DataFrame:
    """Median of ``value`` per ``by`` and CPU share, one line per ``by`` and condition (a line whose points would mix
    conditions is split, :func:`bbrlab.analysis.runkey.split`); the medians drawn."""
    frame, added = runkey.split(frame, by, [by, "cpu_share_pct"])
    medians = frame.groupby([by, "cpu_share_pct", *added], as_index=False, dropna=False)[value].median()
    for k, (label, part) in enumerate(medians.groupby(by)):
        part = part.sort_values("cpu_share_pct")
        ax.plot(part["cpu_share_pct"], part[value], marker="o", color=FALLBACK[k % len(FALLBACK)], label=str(label))
    if len(medians):
        ax.legend(loc="best", fontsize="small")
    return medians


def fairness_vs_share(tables: Tables, *, title: str | None = None):
    """Jain's index and the competing flows' harm (median over repetitions) against the contended flow's CPU
    share, one line per pair of CCAs. Harm needs baseline runs (:func:`bbrlab.analysis.fairness.harm`);
    without them its panel is empty and the table's harm is NaN."""
    runs = _pairs(tables)
    if runs.empty:
        return empty_figure("Nothing to plot: no runs of several flows in the selection."), runs
    harm = fairness.harm(tables.runs, tables.flows).drop(columns="cca").merge(
        runs[["run_id", "pair", *runkey.key_columns(runs)]], on="run_id")
    harm = harm[harm["flow"] > 0]
    with style():
        fig, axes = grid(1, 2, sharey=False)
        jain = _vs_share(axes[0][0], runs, "jain_index", "pair").assign(measure="jain_index")
        axes[0][0].set_ylabel("Jain's index")
        axes[0][0].set_title("Fairness over the flows' overlap")
        harmed = _vs_share(axes[0][1], harm.dropna(subset=["harm"]), "harm", "pair").assign(measure="harm")
        axes[0][1].set_ylabel("harm to the other flows (1 - beside / alone)")
        axes[0][1].set_title("Harm (baseline runs alone at the same point)")
        for ax in axes[0]:
            ax.set_xlabel(LABELS.get("cpu_share_pct", "CPU share [%]"))
        fig.tight_layout()
        if title:
            fig.suptitle(title, y=1.02)
    return fig, pd.concat([jain.rename(columns={"jain_index": "value"}), harmed.rename(columns={"harm": "value"})])


#: What may differ between the runs :func:`qdisc_vs_share` compares: the qdisc and the contention point.
_QDISC_COMPARED = ("sender_qdisc", "cpu_share_pct", "contention_mode")


def _beside_fq(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs measured in a setting that also has fq runs: the same identity (:mod:`bbrlab.analysis.runkey`) but
    for the qdisc and the contention point, so a line without fq is the same experiment as the fq line."""
    cols = runkey.key_columns(runs, tuple(c for c in runkey.RUN_KEY if c not in _QDISC_COMPARED))
    if runs.empty or "sender_qdisc" not in runs:
        return runs
    text = runkey.identity(runs, tuple(cols)).astype("string").fillna("<missing>").agg("|".join, axis=1)
    return runs[text.isin(set(text[runs["sender_qdisc"] == "fq"]))]


def qdisc_vs_share(tables: Tables, *, cca: str = "cubic", title: str | None = None):
    """``cca``'s throughput (median over repetitions) against the CPU share, one line per sender qdisc
    (default and fq, for Cubic: the figure the authors' repository numbers 13; the paper has none), from single-flow runs."""
    runs = _beside_fq(tables.runs[(tables.runs["status"] == "ok") & (tables.runs["cca"] == cca)
                                  & (tables.runs["flows"] == 1)])
    if runs["sender_qdisc"].nunique() < 2:
        return empty_figure(f"Nothing to compare: the selection's {cca} runs have one sender qdisc "
                            f"({', '.join(map(str, runs['sender_qdisc'].dropna().unique())) or 'none'})."), runs
    with style():
        fig, axes = grid(1, 1)
        table = _vs_share(axes[0][0], runs, "throughput_mbit", "sender_qdisc")
        axes[0][0].set_title(f"{cca} with and without fq pacing")
        label_edges(axes, LABELS.get("cpu_share_pct", "CPU share [%]"), LABELS["throughput_mbit"])
        fig.tight_layout()
        if title:
            fig.suptitle(title, y=1.02)
    return fig, table
