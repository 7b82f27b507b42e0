"""Throughput selections leave ss-sampled runs out (sampling costs the contended sender CPU)."""

import pandas as pd

from bbrlab.analysis import data
from bbrlab.analysis.records_reader import run_row
from bbrlab.analysis.tables import Tables
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario


def tables_of(sampled):
    runs = pd.DataFrame({"run_id": [f"r{i}" for i in range(len(sampled))], "status": "ok", "ss_sampled": sampled})
    return Tables(runs, pd.DataFrame({"run_id": []}), pd.DataFrame({"run_id": []}))


def test_sampled_runs_are_left_out_of_throughput_tables():
    sel = data.select(tables_of([False, True, False]), ss_sampled=False)
    assert list(sel.runs["run_id"]) == ["r0", "r2"]
    assert sel.notes == ["ss_sampled in [False]: kept 2 of 3 runs (left out ss_sampled [True])"]


def test_only_sampled_runs_give_an_empty_selection_with_a_note():
    sel = data.select(tables_of([True, True]), ss_sampled=False)
    assert sel.runs.empty and "the selection is empty" in sel.notes[0]


def test_run_row_marks_sampling():
    scenario = Scenario(Link(20, 100), Contention(1, 100), Flow("bbr", sample_ms=100, sampler="ss")).to_dict()
    record = {"run_id": "x", "status": "ok", "scenario": scenario}
    assert scenario["flow"]["sample_ss_ms"] == 100  # the form before the samplers had a choice
    assert run_row(record, {"throughput_mbit": 50.0}, "runs/x")["ss_sampled"] is True
    assert run_row(record, {"throughput_mbit": 50.0}, "runs/x")["sampler"] == "ss"
    record["scenario"]["flow"]["sample_ss_ms"] = None
    assert run_row(record, {"throughput_mbit": 50.0}, "runs/x")["ss_sampled"] is False
    record["scenario"]["flow"] = {"cca": "bbr", "sample_ms": 10, "sampler": "bpf"}
    row = run_row(record, {"throughput_mbit": 50.0}, "runs/x")
    assert row["ss_sampled"] is True and row["sampler"] == "bpf"
