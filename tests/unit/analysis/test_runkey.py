"""One definition of "the same condition" (bbrlab.analysis.runkey) over ALL of the committed data/: no fidelity claim
and no figure point pools runs that differ in any dimension of the run-identity key. Reads data/ through its table
cache (data/*/tables/, rebuilt once when missing)."""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from bbrlab.analysis import data, facets, fairness_plots, fidelity, paper_claims, paper_setup, plots, runkey

DATA = Path(__file__).parents[3] / "data"
#: What a claim compares within one setting: the CCA and the contention point, and (figure 7's claim) the rate.
CLAIM_AXES = ["variant", "contention_mode", "timeslice_ms", "cpu_share_pct", "rate_mbit"]


@pytest.fixture(scope="module")
def tables():
    return data.load(DATA)


def test_the_key_names_every_dimension_and_blanks_an_uncontended_runs_timeslice():
    assert {"loss_pct", "sender_qdisc", "flows", "extra_flows", "contention_mode", "cfs_period_ms", "credit_s",
            "buffer_bdp", "queue_mode", "duration_s", "workload", "kernel", "variant", "emulator_offloads",
            "machine"} <= set(runkey.RUN_KEY)
    runs = pd.DataFrame({"contention_mode": ["none", "none", "deadline"], "timeslice_ms": [1.0, 10.0, 10.0],
                         "cpu_share_pct": [100.0, 100.0, 25.0], "machine": ["cpu A", "cpu A", "cpu B"]})
    ids = runkey.identity(runs)
    assert ids["timeslice_ms"].isna().tolist() == [True, True, False]
    assert runkey.mixed(runs, ["cpu_share_pct"]) == {}
    assert runkey.mixed(runs.assign(cpu_share_pct=100.0), ["cpu_share_pct"]) == {
        "contention_mode": 1, "timeslice_ms": 1, "machine": 1}
    assert runkey.key_columns(runs.drop(columns="machine")) == ["contention_mode", "timeslice_ms", "cpu_share_pct"]


def test_medians_over_all_data_are_one_condition_each(tables):
    med = paper_claims.medians(tables.runs)
    ok = tables.runs[tables.runs["status"] == "ok"]
    by = [c for c in med.columns if c in ok.columns]
    assert runkey.mixed(ok, by) == {}


def test_no_fidelity_claim_over_all_data_pools_unlike_runs(tables, monkeypatch):
    seen = {"medians": [], "ceiling": []}
    real_medians, real_split = fidelity.medians, fidelity.split_by_ceiling
    monkeypatch.setattr(fidelity, "medians", lambda runs: seen["medians"].append(runs) or real_medians(runs))
    monkeypatch.setattr(fidelity, "split_by_ceiling", lambda runs: seen["ceiling"].append(runs) or real_split(runs))
    base = data.select(tables, {}, ss_sampled=None, workload="iperf3")
    table = fidelity.claims(base)
    assert len(seen["medians"]) > 1 and len(seen["ceiling"]) > 1
    for runs in seen["medians"] + seen["ceiling"]:
        kept, _ = paper_setup.restrict_runs(runs)
        assert len(kept) == len(runs)  # only the paper's setup: deadline, no loss, one flow, no fq, bulk iperf3
    for runs in seen["medians"]:  # the throughput claims: one setting, whatever the CCA and the contention point
        assert runkey.mixed(runs, CLAIM_AXES) == {}
    for runs in seen["ceiling"]:  # the socket claims take the sampled runs' samples of the same setting
        assert runkey.mixed(runs, CLAIM_AXES, key=tuple(c for c in runkey.RUN_KEY if c != "sampler")) == {}
    cubic = table[table["key"] == "cubic_robust"]
    assert (cubic["runs"] > 0).all() and cubic["setting"].is_unique
    assert cubic["setting"].str.contains("Mbit/s").all()  # figure 4's claims: one rate each
    assert not cubic["measured"].str.contains("lowest 10 % at 25 % share").any()  # the 30 % loss runs' number


def _figures(tables):
    """The throughput figures the notebooks draw from all of data/, with the notebooks' selections."""
    base = data.select(tables, ss_sampled=False, workload="iperf3")
    paper = data.select(base, rate_mbit=100, streams=1, loss_pct=0, contention_mode=["deadline", "none"])
    sweep = data.select(base, rtt_ms=20, streams=1, loss_pct=0, contention_mode=["deadline", "none"])
    yield plots.throughput_vs_share(data.select(paper, cpu_share_pct=[30, 50, 70]), row=None, col="timeslice_ms")
    yield plots.throughput_vs_share(paper)
    yield plots.sweep(sweep, over="rate_mbit")
    yield plots.sweep(paper, over="rtt_ms", logy=False)
    yield plots.std_vs_share(paper)
    yield plots.patched_vs_original(paper)
    yield plots.vs_queue(data.sweeps(base, "buffer_bdp"))
    yield plots.goodput_vs_loss(data.select(data.sweeps(tables, "loss_pct"), ss_sampled=False))
    yield plots.link_utilisation(data.select(base, loss_pct=0.1))
    yield plots.throughput_vs_share(data.select(tables, ss_sampled=False))  # everything at once


def test_no_figure_point_over_all_data_pools_unlike_runs(tables, monkeypatch):
    groups = []
    real = facets.summarise

    def spy(runs, by, value="throughput_mbit"):
        if value != "ceiling_mbit":  # the ceiling line is a calibration, not a run's point
            groups.append((list(by), runkey.mixed(runs, list(by))))
        return real(runs, by, value)

    monkeypatch.setattr(facets, "summarise", spy)
    for fig, _ in _figures(tables):
        plt.close(fig)
    assert len(groups) >= 10
    assert [(by, mixed) for by, mixed in groups if mixed] == []


def test_no_fairness_figure_point_over_all_data_pools_unlike_runs(tables, monkeypatch):
    """The fairness notebook's lines (median per line and share, fairness_plots._vs_share) over all of data/."""
    drawn = []
    real = fairness_plots._vs_share

    def spy(ax, frame, value, by):
        table = real(ax, frame, value, by)
        drawn.append(runkey.mixed(frame, [c for c in table.columns if c in frame.columns and c != value]))
        return table

    monkeypatch.setattr(fairness_plots, "_vs_share", spy)
    base = data.select(tables, ss_sampled=False)
    for fig, _ in (fairness_plots.qdisc_vs_share(base), fairness_plots.fairness_vs_share(base)):
        plt.close(fig)
    assert len(drawn) == 3 and drawn == [{}, {}, {}]


def test_a_representative_run_is_chosen_per_condition():
    from bbrlab.analysis.explore import representative_runs

    runs = pd.DataFrame({"run_id": ["a", "b", "c", "d"], "variant": "BBRv1", "timeslice_ms": 10.0,
                         "cpu_share_pct": 25.0, "loss_pct": [0.0, 0.0, 10.0, 10.0],
                         "throughput_mbit": [5.0, 6.0, 0.5, 0.7]})
    assert len(representative_runs(runs)) == 2  # one without loss, one at 10 % loss: never the pooled median


def test_select_names_what_a_selection_still_mixes_and_the_paper_setup_what_it_left_out(tables):
    vary = ["variant", "timeslice_ms", "cpu_share_pct"]
    loose = data.select(tables, ss_sampled=False, rate_mbit=20, vary=vary)
    assert any("differ in" in n and "loss_pct" in n and "kernel" in n for n in loose.notes)
    demo = data.select(tables, ss_sampled=False, campaign="demo", rate_mbit=100, vary=vary)
    assert not any("differ in" in n for n in demo.notes)  # one setting: every point one condition
    kept = paper_setup.restrict(tables)
    assert kept.kept + kept.left_out == int((tables.runs["status"] == "ok").sum())
    assert any(n.startswith("left out 60 runs with loss_pct 0.1, 1, 10, 30") for n in kept.notes)
