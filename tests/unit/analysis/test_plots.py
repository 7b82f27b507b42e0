"""Figure functions on the real fixture campaign: what is drawn equals the data; gaps never raise."""

import json
import shutil
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from bbrlab.analysis import data, facets, plots

FIXTURES = Path(__file__).parents[2] / "fixtures"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("plots")
    shutil.copytree(FIXTURES / "campaign", root / "campaign")
    return data.load(root / "campaign")


#: What the fixture's runs are: stock bbr of a mainline (6.18) kernel, i.e. BBRv1, and Cubic.
LABELS = {"bbr": "BBRv1", "cubic": "Cubic"}


def raw_medians():
    """(label, share) -> median receiver throughput, straight from the fixture's JSON files."""
    groups = {}
    for run in (FIXTURES / "campaign" / "runs").iterdir():
        sc = json.loads((run / "record.json").read_text())["scenario"]
        bps = json.loads((run / "iperf.json").read_text())["end"]["sum_received"]["bits_per_second"]
        groups.setdefault((LABELS[sc["flow"]["cca"]], sc["contention"]["cpu_share_pct"]), []).append(bps / 1e6)
    return {k: statistics.median(v) for k, v in groups.items()}


def lines_of(fig):
    return {(ln["label"], x): y for p in plots.plotted_points(fig) for ln in p["lines"]
            for x, y in zip(ln["x"], ln["y"], strict=True)}


def test_throughput_vs_share_draws_the_medians_and_returns_them(tables):
    fig, table = plots.throughput_vs_share(tables)
    drawn = lines_of(fig)
    assert drawn.keys() == raw_medians().keys()
    for key, median in raw_medians().items():
        assert drawn[key] == pytest.approx(median)
        row = table[(table["variant"] == key[0]) & (table["cpu_share_pct"] == key[1])].iloc[0]
        assert row["median"] == pytest.approx(median) and row["q25"] <= row["median"] <= row["q75"]
    assert [ax.get_title() for ax in fig.axes] == ["timeslice 1 ms | RTT 0 ms"]
    plt.close(fig)


def test_std_vs_share_draws_the_sample_standard_deviation(tables):
    fig, table = plots.std_vs_share(tables)
    runs = tables.runs
    bbr25 = runs[(runs["cca"] == "bbr") & (runs["cpu_share_pct"] == 25)]["throughput_mbit"]
    assert lines_of(fig)[("BBRv1", 25.0)] == pytest.approx(statistics.stdev(bbr25))
    plt.close(fig)


def test_save_writes_pdf_png_and_points(tables, tmp_path):
    fig, _ = plots.link_utilisation(tables)
    paths = plots.save(fig, tmp_path / "out", "lu")
    assert sorted(p.name for p in paths) == ["lu.pdf", "lu.png", "lu.points.json"]
    assert (tmp_path / "out/lu.pdf").read_bytes()[:4] == b"%PDF"
    assert (tmp_path / "out/lu.png").read_bytes()[:4] == b"\x89PNG"
    plt.close(fig)


def test_empty_selection_gives_a_note_not_an_exception(tables):
    empty = data.select(tables, rate_mbit=1)
    for fig, table in (plots.throughput_vs_share(empty), plots.sweep(empty), plots.timeseries(empty),
                       plots.socket_state(empty), plots.patched_vs_original(empty), plots.link_utilisation(empty)):
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert any(t.startswith("Nothing to plot") for t in texts) and len(table) == 0
        plt.close(fig)


def test_missing_dimension_collapses_to_one_labelled_facet(tables):
    runs = tables.runs.assign(rtt_ms=float("nan"))
    fig, _ = plots.throughput_vs_share(tables.with_runs(runs, []))
    assert [ax.get_title() for ax in fig.axes] == ["timeslice 1 ms | RTT not recorded"]
    no_column = tables.runs.drop(columns=["hypervisor"])
    fig2, _ = plots.link_utilisation(tables.with_runs(no_column, []))
    assert len(fig2.axes) == 1
    plt.close(fig)
    plt.close(fig2)


def test_full_share_runs_without_timeslice_appear_in_every_timeslice_facet():
    runs = pd.DataFrame({"cpu_share_pct": [25.0, 25.0, 100.0], "timeslice_ms": [1.0, 10.0, float("nan")],
                         "run_id": ["a", "b", "c"]})
    spread = plots.spread_full_share(runs)
    assert sorted(spread[spread["run_id"] == "c"]["timeslice_ms"]) == [1.0, 10.0]


def test_patched_and_stock_runs_of_one_version_are_drawn_apart(tables):
    runs = tables.runs.copy()
    second = (runs["cca"] == "bbr") & (runs["repetition"] == 1)
    runs.loc[second, ["patched", "variant"]] = [True, "BBRv1 patched"]
    fig, table = plots.patched_vs_original(tables.with_runs(runs, []))
    assert set(table["variant"]) == {"BBRv1", "BBRv1 patched"}  # Cubic has no patched version: left out
    drawn = {ln["label"] for p in plots.plotted_points(fig) for ln in p["lines"]}
    assert drawn == {"BBRv1", "BBRv1 patched"}
    plt.close(fig)
    fig, table = plots.patched_vs_original(tables)
    assert table.empty  # no patched runs: nothing to compare
    plt.close(fig)


def test_socket_state_draws_the_sampled_values_and_checks_panel_names(tables):
    run_id = tables.ss.loc[tables.ss["cca"] == "bbr", "run_id"].iloc[0]
    fig, table = plots.socket_state(tables, run_ids=[run_id], panels=("rates", "inflight"))
    bw = next(ln for p in plots.plotted_points(fig) for ln in p["lines"] if ln["label"] == "BBR bw estimate")
    expected = tables.ss[tables.ss["run_id"] == run_id].sort_values("t_s")["bw_mbit"]
    assert bw["y"] == pytest.approx(list(expected))
    plt.close(fig)
    with pytest.raises(ValueError, match="panels"):
        plots.socket_state(tables, panels=("colours",))


def test_representative_run_is_the_one_closest_to_its_group_median(tables):
    chosen = plots.representative_runs(tables.runs, by=("cca", "cpu_share_pct"))
    assert len(chosen) == 4
    runs = tables.runs.set_index("run_id")
    for run_id in chosen:
        r = runs.loc[run_id]
        group = runs[(runs["cca"] == r["cca"]) & (runs["cpu_share_pct"] == r["cpu_share_pct"])]["throughput_mbit"]
        assert abs(r["throughput_mbit"] - group.median()) == min(abs(group - group.median()))


def test_authors_versions_and_patch_are_separate_lines(tmp_path):
    shutil.copytree(FIXTURES / "authors", tmp_path / "authors")
    sel = data.select(data.load(tmp_path / "authors"), rate_mbit=100, rtt_ms=20, streams=1, loss_pct=0,
                      ss_sampled=False, contention_mode=["deadline", "none"])
    fig, table = plots.throughput_vs_share(sel, col=None)
    drawn = lines_of(fig)
    # the fixture's BBRv1 ran on two kernels (bbr on 6.1, bbr1 on the BBRv3 kernel) and one Cubic run had fq: each
    # is a condition of its own (bbrlab.analysis.runkey), so a line of its own
    assert {label for label, _ in drawn} == {"Cubic [qdisc not recorded]", "Cubic [qdisc fq]", "BBRv1 [kernel kernel6-1]",
                                             "BBRv1 [kernel BBRv3]", "BBRv1 patched", "BBRv3", "BBRv3 patched"}
    medians = sel.runs.groupby(["variant", "timeslice_ms", "cpu_share_pct"])["throughput_mbit"].median()
    panels = plots.plotted_points(fig)
    ts10 = next(p for p in panels if p["title"] == "timeslice 10 ms")
    v3p = next(ln for ln in ts10["lines"] if ln["label"] == "BBRv3 patched")
    assert v3p["y"] == pytest.approx([medians[("BBRv3 patched", 10.0, s)] for s in (25.0, 50.0, 100.0)])
    plt.close(fig)


def _with_runs(tables, runs):
    import dataclasses

    return dataclasses.replace(tables, runs=runs)


def test_the_ceiling_is_a_line_per_timeslice_with_the_median_of_its_points(tables):
    runs = tables.runs.copy()
    assert not facets.ceiling_lines(plt.figure().gca(), runs, x="cpu_share_pct").size  # no calibration: nothing
    plt.close("all")
    two = pd.concat([runs, runs.assign(timeslice_ms=10.0, run_id=runs["run_id"] + "-10")], ignore_index=True)
    two["ceiling_mbit"] = two["cpu_share_pct"] * 2 + two["timeslice_ms"]  # any value that differs per point
    fig, _ = plots.throughput_vs_share(_with_runs(tables, two))
    drawn = {p["title"]: ln for p in plots.plotted_points(fig) for ln in p["lines"] if ln["label"] == "CPU ceiling"}
    assert set(drawn) == {"timeslice 1 ms | RTT 0 ms", "timeslice 10 ms | RTT 0 ms"}
    for title, ln in drawn.items():
        ts = 10.0 if "10 ms" in title else 1.0
        assert ln["y"] == pytest.approx([x * 2 + ts for x in ln["x"]])
    styles = {ln.get_linestyle() for ax in fig.axes for ln in ax.get_lines() if ln.get_label() == "CPU ceiling"}
    assert styles == {"-."}  # not dashed: dashed lines are patched variants
    plt.close(fig)
    fig, _ = plots.throughput_vs_share(_with_runs(tables, two), row=None, col=None)  # both timeslices in one panel
    labels = {ln["label"] for p in plots.plotted_points(fig) for ln in p["lines"] if ln["label"].startswith("CPU")}
    assert labels == {"CPU ceiling (timeslice 1 ms)", "CPU ceiling (timeslice 10 ms)"}
    plt.close(fig)


def test_a_sweep_draws_the_ceiling_once_per_panel(tables):
    runs = tables.runs.assign(ceiling_mbit=55.0)
    runs = pd.concat([runs, runs.assign(rate_mbit=20.0, run_id=runs["run_id"] + "-20")], ignore_index=True)
    fig, _ = plots.sweep(_with_runs(tables, runs), over="rate_mbit")
    for p in plots.plotted_points(fig):
        ceilings = [ln for ln in p["lines"] if ln["label"] == "CPU ceiling"]
        assert len(ceilings) == 1 and set(ceilings[0]["y"]) == {55.0}
    plt.close(fig)


def test_a_ceiling_far_above_the_rates_does_not_squash_the_curves(tables):
    runs = tables.runs.assign(ceiling_mbit=10_000.0)
    fig, _ = plots.throughput_vs_share(_with_runs(tables, runs))
    top = fig.axes[0].get_ylim()[1]
    assert top == pytest.approx(facets.CEILING_VIEW_HEADROOM * max(runs["rate_mbit"].max(),
                                                                   runs["throughput_mbit"].max()), rel=0.3)
    assert top < 10_000
    plt.close(fig)


def test_runs_of_several_bottleneck_queues_are_never_one_line():
    # The committed buffer-queue campaign: Cubic at 10 ms / 25 % carries about half the link with a 1 BDP queue
    # and nearly all of it with the authors' deep one. A figure over all of data/ must not average the two.
    tables = data.select(data.load(Path(__file__).parents[3] / "data" / "buffer-queue-local"), variant="Cubic")
    fig, table = plots.throughput_vs_share(tables)
    plt.close(fig)
    assert set(table["variant"]) == {"Cubic [1 BDP]", "Cubic [8 BDP]", "Cubic [authors' queue]"}
    at = table[(table["timeslice_ms"] == 10) & (table["cpu_share_pct"] == 25)].set_index("variant")["median"]
    assert at["Cubic [1 BDP]"] < 0.6 * at["Cubic [authors' queue]"]
    one = data.select(tables, queue_mode="bbrlab", buffer_bdp=1.0)
    fig, table = plots.throughput_vs_share(one)
    plt.close(fig)
    assert set(table["variant"]) == {"Cubic"}  # one queue: the labels stay as they were
