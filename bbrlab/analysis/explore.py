"""Pick runs interactively in JupyterLab (ipywidgets) and redraw a figure of the picked ones.

The notebooks call :func:`pick_runs` only when their ``interactive`` parameter is true; ``bbrlab figures``
(papermill) sets it to false, so batch runs stay non-interactive and their figures come from the
parameters alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from . import runkey
from .facets import show
from .tables import Tables

ALL = "(all)"
#: The CSS classes of the picker's parts in the page: the box, the variant filter, the run list, the figure.
CSS_CLASSES = {"box": "bbrlab-run-picker", "variant": "bbrlab-run-picker-variant",
               "runs": "bbrlab-run-picker-runs", "figure": "bbrlab-run-picker-figure"}


def run_label(run: pd.Series) -> str:
    """A readable label of one run, e.g. ``"BBRv3 patched | 1 ms | 25 % | rep 2 | 71.3 Mbit/s"``."""
    parts = [str(run.get("variant"))]
    for col, unit in (("timeslice_ms", "ms"), ("cpu_share_pct", "%"), ("rtt_ms", "ms RTT")):
        value = run.get(col)
        if value is not None and not (isinstance(value, float) and math.isnan(value)) and value is not pd.NA:
            parts.append(f"{value:g} {unit}")
    if pd.notna(run.get("repetition")):
        parts.append(f"rep {run['repetition']:g}")
    if pd.notna(run.get("throughput_mbit")):
        parts.append(f"{run['throughput_mbit']:.1f} Mbit/s")
    return " | ".join(parts)


def run_options(tables: Tables, candidates: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(label, run id) of the runs to offer, sorted by variant, timeslice, share and repetition.

    Parameters
    ----------
    tables : Tables
    candidates : sequence of str, optional
        Offer only these run ids (e.g. the runs with ss samples).

    Returns
    -------
    list of (str, str)
    """
    runs = tables.runs if candidates is None else tables.runs[tables.runs["run_id"].isin(set(candidates))]
    order = [c for c in ("variant", "timeslice_ms", "cpu_share_pct", "rtt_ms", "repetition", "run_id") if c in runs]
    runs = runs.sort_values(order, na_position="last")
    return [(run_label(r), r["run_id"]) for _, r in runs.iterrows()]


def representative_runs(runs: pd.DataFrame, by: Sequence[str] = ("variant", "timeslice_ms", "cpu_share_pct"),
                        have: Sequence[str] | None = None) -> list[str]:
    """One typical run per group and condition: the run whose throughput is closest to its group's median, where a
    group never mixes conditions (the run-identity key, :mod:`bbrlab.analysis.runkey`, splits it further).

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
    cols += [c for c in runkey.key_columns(pool) if c not in cols]
    chosen = []
    for _, g in runkey.with_identity(pool).groupby(cols, dropna=False, sort=True):
        distance = (g["throughput_mbit"] - g["throughput_mbit"].median()).abs()
        chosen.append(g.loc[distance.idxmin(), "run_id"] if distance.notna().any() else g["run_id"].iloc[0])
    return chosen


def pick_runs(tables: Tables, draw: Callable[[list[str]], tuple], *, candidates: Sequence[str] | None = None,
              initial: Sequence[str] | None = None, rows: int = 10):
    """A run picker (filter by variant, multi-select runs) above the figure of the picked runs.

    The figure is redrawn whenever the pick changes.

    Parameters
    ----------
    tables : Tables
        The selection to pick from.
    draw : callable
        ``draw(run_ids) -> (figure, table)``, e.g.
        ``lambda ids: plots.socket_state(sel, run_ids=ids, panels=("rates", "inflight"))``.
    candidates : sequence of str, optional
        Offer only these run ids.
    initial : sequence of str, optional
        Picked at first (default: the first offered run).
    rows : int, default 10
        Height of the list.

    Returns
    -------
    ipywidgets.VBox
        Display it as a cell's last expression; ``.children`` are the variant filter, the run list
        and the output area. Each carries a CSS class of its own (:data:`CSS_CLASSES`), the handles by
        which the browser test (and a stylesheet) finds them in JupyterLab's page.

    Examples
    --------
    >>> explore.pick_runs(sel, lambda ids: plots.timeseries(data.select(sel, run_id=ids)))  # doctest: +SKIP
    """
    import ipywidgets as widgets

    options = run_options(tables, candidates)
    variants = sorted({label.split(" | ", 1)[0] for label, _ in options})
    variant = widgets.Dropdown(options=[ALL, *variants], value=ALL, description="variant")
    start = [i for i in (initial or [o[1] for o in options[:1]]) if i in {o[1] for o in options}]
    picker = widgets.SelectMultiple(options=options, value=tuple(start), rows=rows, description="runs",
                                    layout=widgets.Layout(width="95%"))
    out = widgets.Output()

    def refilter(change=None) -> None:
        keep = [o for o in options if variant.value == ALL or o[0].split(" | ", 1)[0] == variant.value]
        picked = [v for v in picker.value if v in {o[1] for o in keep}]
        picker.options = keep
        picker.value = tuple(picked)

    def redraw(change=None) -> None:
        with out:
            out.clear_output(wait=True)
            if not picker.value:
                print("Pick one or more runs (Ctrl/Shift-click for several).")
                return
            fig, _ = draw(list(picker.value))
            show(fig)

    variant.observe(refilter, names="value")
    picker.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([variant, picker, out])
    for part, widget in (("box", box), ("variant", variant), ("runs", picker), ("figure", out)):
        widget.add_class(CSS_CLASSES[part])
    return box
