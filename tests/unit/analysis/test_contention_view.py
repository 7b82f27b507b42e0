"""The contention models' figures (#28): labels per model, every run with an achieved share drawn at it, and the
asked-share medians. Tables from the committed demo campaign (deadline and 100 % runs, with their achieved share),
and label rows of the other models built from the table's columns (no campaign of them is committed yet)."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.analysis import contention_view, data, plots
from bbrlab.analysis.tables import Tables

DEMO = Path(__file__).parents[3] / "data" / "demo"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("contention_view")
    shutil.copytree(DEMO, root / "campaign", ignore=shutil.ignore_patterns("calibration", "tables"))
    return data.select(data.load(root / "campaign"))  # the ok runs, as every notebook selects them


def test_labels_name_the_model_and_its_parameter():
    runs = pd.DataFrame({"contention_mode": ["deadline", "cfs-quota", "cfs-burst", "credit", "competing-load", None],
                         "timeslice_ms": [1.0, 25, 25, 25, None, None], "cfs_period_ms": [None, 10, 100, 100, None, None],
                         "cfs_burst_ms": [None, None, 5, None, None, None], "credit_s": [None, None, None, 1, None, None]})
    assert list(contention_view.contention_label(runs)) == [
        "deadline 1 ms", "cfs-quota 10 ms", "cfs-burst 100 ms + 5 ms", "credit 1 s", "competing-load", "none"]


def test_every_run_with_an_achieved_share_is_drawn_at_it(tables):
    fig, drawn = contention_view.vs_achieved_share(tables)
    runs = tables.runs[tables.runs["achieved_share_pct"].notna()]
    assert len(drawn) == len(runs) > 0
    points = {(round(x, 6), round(y, 6)) for p in plots.plotted_points(fig) for ln in p["lines"]
              for x, y in zip(ln["x"], ln["y"], strict=True)}
    assert points == {(round(a, 6), round(t, 6)) for a, t in zip(runs["achieved_share_pct"], runs["throughput_mbit"],
                                                                  strict=True)}


def test_asked_share_medians_have_a_line_per_contention(tables):
    fig, table = contention_view.vs_asked_share(tables)
    # the demo ran at 10 and 100 Mbit/s: a line is one condition (bbrlab.analysis.runkey), so one per rate too
    assert set(table["contention"].str.replace(r" \[.*\]$", "", regex=True)) == \
        set(contention_view.contention_label(tables.runs))
    assert set(table["contention"].str.extract(r"\[(.*)\]$")[0]) == {"10 Mbit/s", "100 Mbit/s"}
    assert not table.empty


def test_no_achieved_share_gives_a_note_not_an_exception(tables):
    empty = Tables(tables.runs.iloc[0:0], tables.intervals.iloc[0:0], tables.ss.iloc[0:0], [], [])
    fig, drawn = contention_view.vs_achieved_share(empty)
    assert drawn.empty and "Nothing to plot" in fig.axes[0].texts[0].get_text()
