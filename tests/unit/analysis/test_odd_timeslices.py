"""Timeslices beyond the paper's 1 and 10 ms (#38): its 20 ms, and the 2.8 ms granularity it cites. The fixture
campaign's contended runs are relabelled to those timeslices in a copy (a test input, not data): the tables,
the figures' panels and the calibration's point keys take them as numbers like any other."""

import json
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from bbrlab.analysis import data, plots
from bbrlab.run import ceiling

FIXTURES = Path(__file__).parents[2] / "fixtures"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd") / "campaign"
    shutil.copytree(FIXTURES / "campaign", root)
    for run in sorted((root / "runs").iterdir()):
        path = run / "record.json"
        record = json.loads(path.read_text())
        contention = record["scenario"]["contention"]
        if contention["cpu_share_pct"] < 100:
            contention["timeslice_ms"] = 2.8 if record["scenario"]["flow"]["cca"] == "bbr" else 20
            path.write_text(json.dumps(record))
    return data.load(root)


def test_the_runs_table_keeps_the_timeslices_as_numbers(tables):
    contended = tables.runs[tables.runs["cpu_share_pct"] < 100]
    assert sorted(contended["timeslice_ms"].unique()) == [2.8, 20.0]


def test_a_figure_has_a_panel_per_timeslice_named_in_ms(tables):
    fig, table = plots.throughput_vs_share(tables)
    titles = [ax.get_title() for ax in fig.axes]
    assert any(t.startswith("timeslice 2.8 ms") for t in titles), titles
    assert any(t.startswith("timeslice 20 ms") for t in titles), titles
    assert set(table["timeslice_ms"].dropna()) >= {2.8, 20.0}
    plt.close(fig)


def test_the_calibrations_point_keys_take_them():
    assert ceiling.PointKey.of(2.8, 25, 20).text == "ts2.8ms-sh25-rtt20ms"
    assert ceiling.PointKey.of(20, 25, 20).text == "ts20ms-sh25-rtt20ms"
    assert ceiling.PointKey.of(2.8, 25, 20) != ceiling.PointKey.of(20, 25, 20)
