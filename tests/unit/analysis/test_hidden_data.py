"""No figure hides data: panels sharing a y axis cover every panel's lines, and points.json says so.

The tables here are made by hand: a first panel of slow runs and later panels of fast ones, the shape of
figure 5 on data/ (BBRv1 at 1-15 Mbit/s above BBRv1 patched and Cubic at 77-123 Mbit/s), where a limit
fixed while drawing the first panel hid the others.
"""

import dataclasses
import json
import os
import time

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from bbrlab.analysis import facets, offaxis, plots, render
from bbrlab.analysis.tables import Tables

SLOW_MBIT, FAST_MBIT = (3.0, 5.0, 14.0), (80.0, 123.0, 95.0)


def hand_made(runs_per_variant: int) -> Tables:
    """Variant "A" (slow, the first panel) and "B" (fast), 1 ms timeslice, three 1 s intervals per run."""
    runs, intervals = [], []
    for variant, mbits in (("A", SLOW_MBIT), ("B", FAST_MBIT)):
        for r in range(runs_per_variant):
            run_id = f"{variant}-r{r:02d}"
            runs.append({"run_id": run_id, "variant": variant, "timeslice_ms": 1.0, "cpu_share_pct": 25.0})
            intervals += [{"run_id": run_id, "t_end_s": t + 1.0, "throughput_mbit": mbit + r}
                          for t, mbit in enumerate(mbits)]
    return dataclasses.replace(Tables.empty(), runs=pd.DataFrame(runs), intervals=pd.DataFrame(intervals))


def top_of_data(tables: Tables) -> float:
    return float(tables.intervals["throughput_mbit"].max())


def test_many_run_line_collections_stay_inside_the_shared_y_axis(monkeypatch):
    """Above MANY_LINES runs a panel is one LineCollection per variant; the fast panel's used to lie above
    the axis, which ended a little above the slow first panel (about 15 Mbit/s)."""
    monkeypatch.setattr(plots, "MANY_LINES", 2)
    tables = hand_made(runs_per_variant=3)
    fig, _ = plots.timeseries(tables)
    assert all(ax.collections and not ax.get_lines() for ax in fig.axes)  # the collection path was taken
    points = plots.plotted_points(fig)
    assert offaxis.points_outside_axes(points) == []
    bottom, top = fig.axes[1].get_ylim()
    assert bottom == 0 and top >= top_of_data(tables)
    assert points[1]["ylim"] == [bottom, top]
    plt.close(fig)


def test_few_run_lines_stay_inside_the_shared_y_axis():
    tables = hand_made(runs_per_variant=2)
    fig, _ = plots.timeseries(tables)
    assert all(ax.get_lines() for ax in fig.axes)
    assert offaxis.points_outside_axes(plots.plotted_points(fig)) == []
    assert fig.axes[1].get_ylim()[1] >= top_of_data(tables)
    plt.close(fig)


def test_facet_lines_fit_the_shared_y_axis_to_every_panel():
    runs = pd.DataFrame([{"variant": v, "timeslice_ms": ts, "cpu_share_pct": s, "throughput_mbit": base * s / 100}
                         for ts, base in ((1.0, 10.0), (10.0, 120.0)) for v in ("A", "B")
                         for s in (25.0, 50.0, 100.0)])
    fig, _ = facets.facet_lines(runs, x="cpu_share_pct", value="throughput_mbit", hue="variant",
                                row="timeslice_ms", col=None)
    assert offaxis.points_outside_axes(plots.plotted_points(fig)) == []
    assert fig.axes[0].get_ylim()[0] == 0 and fig.axes[1].get_ylim()[1] >= 120.0
    plt.close(fig)


def test_points_outside_axes_lists_what_a_reader_cannot_see():
    points = [
        {"title": "low", "xlim": [0, 10], "ylim": [0, 15], "lines": [
            {"label": "run", "x": [1, 2, 3, None], "y": [5, 15.0000000001, 90, 200]},
            {"label": "many", "segments": [[[1, 1], [2, 16]], [[11, 3]]]},
            {"label": "ceiling", "x": [1], "y": [1000], "reference": True},
        ]},
        {"title": "old file, no limits", "lines": [{"label": "x", "x": [0], "y": [1e9]}]},
    ]
    hidden = offaxis.points_outside_axes(points)
    assert [(h["label"], h["x"], h["y"]) for h in hidden] == [("run", 3, 90), ("many", 2, 16), ("many", 11, 3)]
    assert all(h["panel"] == "low" for h in hidden)
    assert "3 drawn points outside" in offaxis.hidden_points_summary("fig", hidden)


def test_a_ceiling_above_the_view_is_a_reference_not_hidden_data():
    runs = pd.DataFrame([{"variant": "A", "timeslice_ms": 1.0, "cpu_share_pct": s, "throughput_mbit": s / 10,
                          "rate_mbit": 10.0, "ceiling_mbit": 10_000.0} for s in (25.0, 50.0, 100.0)])
    fig, _ = facets.facet_lines(runs, x="cpu_share_pct", value="throughput_mbit", hue="variant", row=None,
                                col=None, ceiling=True)
    points = plots.plotted_points(fig)
    (ceiling,) = [ln for ln in points[0]["lines"] if ln["label"] == facets.CEILING_LABEL]
    assert ceiling["reference"] is True and max(ceiling["y"]) > points[0]["ylim"][1]  # leaves the view on purpose
    assert offaxis.points_outside_axes(points) == []
    plt.close(fig)


def test_rendering_reports_the_figures_of_this_render_that_hide_data(tmp_path):
    hiding = [{"title": "p", "xlim": [0, 1], "ylim": [0, 1], "lines": [{"label": "l", "x": [0.5], "y": [7]}]}]
    fine = [{"title": "p", "xlim": [0, 1], "ylim": [0, 1], "lines": [{"label": "l", "x": [0.5], "y": [0.5]}]}]
    (tmp_path / "fig_hides.points.json").write_text(json.dumps(hiding))
    (tmp_path / "fig_fine.points.json").write_text(json.dumps(fine))
    stale = tmp_path / "fig_stale.points.json"
    stale.write_text(json.dumps(hiding))
    os.utime(stale, (time.time() - 3600, time.time() - 3600))  # a previous render's figure
    found = render.hidden_data(tmp_path, since=time.time() - 60)
    assert list(found) == ["fig_hides"] and found["fig_hides"][0]["y"] == 7


@pytest.mark.parametrize("scale", ["linear", "log"])
def test_fit_y_starts_non_negative_linear_axes_at_zero(scale):
    fig, axes = facets.grid(1, 2)
    axes[0][0].plot([1, 2], [3, 4], label="a")
    axes[0][1].plot([1, 2], [50, 60], label="b")
    for ax in axes.ravel():
        ax.set_yscale(scale)
    facets.fit_y(axes)
    low, high = axes[0][0].get_ylim()
    assert high >= 60 and (low == 0 if scale == "linear" else 0 < low <= 3)
    plt.close(fig)
