"""The run picker: real ipywidgets (they work without a browser); picking runs redraws their figure."""

import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from bbrlab.analysis import data, explore, plots

FIXTURE = Path(__file__).parents[2] / "fixtures" / "campaign"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore")
    shutil.copytree(FIXTURE, root / "c")
    return data.load(root / "c")


def test_options_are_labelled_runs(tables):
    options = explore.run_options(tables)
    assert sorted(run_id for _, run_id in options) == sorted(tables.runs["run_id"])
    label = dict((run_id, label) for label, run_id in options)[tables.runs["run_id"].iloc[0]]
    assert label.startswith(("BBRv1 | 1 ms | ", "Cubic | 1 ms | ")) and label.endswith("Mbit/s")


def test_picking_runs_redraws_the_figure_of_exactly_those_runs(tables):
    drawn = []

    def draw(ids):
        drawn.append(ids)
        return plots.timeseries(data.select(tables, run_id=ids))

    box = explore.pick_runs(tables, draw)
    variant, picker, _out = box.children
    first = picker.options[0][1]
    assert drawn == [[first]]
    two = tuple(run_id for _, run_id in picker.options[:2])
    picker.value = two
    assert drawn[-1] == list(two)
    variant.value = "Cubic"
    assert all(label.startswith("Cubic") for label, _ in picker.options)
    assert not set(picker.value) - {run_id for _, run_id in picker.options}
    plt.close("all")


def test_the_parts_of_the_picker_carry_their_css_classes(tables):
    """The browser test finds the picker's parts in JupyterLab's page by these classes."""
    box = explore.pick_runs(tables, lambda ids: plots.timeseries(data.select(tables, run_id=ids)))
    parts = [box, *box.children]
    names = ("box", "variant", "runs", "figure")
    assert [w._dom_classes for w in parts] == [(explore.CSS_CLASSES[n],) for n in names]
    plt.close("all")
