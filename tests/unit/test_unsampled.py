"""Throughput figures leave ss-sampled runs out (sampling costs the contended sender CPU)."""

import pandas as pd

from bbrlab import data


def test_sampled_runs_are_left_out_of_throughput_tables():
    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "ss_sampled": [False, True, False]})
    kept, notes = data.unsampled(runs)
    assert list(kept["run_id"]) == ["a", "c"] and "1 ss-sampled" in notes[0]


def test_only_sampled_runs_are_kept_with_a_note():
    runs = pd.DataFrame({"run_id": ["a", "b"], "ss_sampled": [True, True]})
    kept, notes = data.unsampled(runs)
    assert len(kept) == 2 and "only ss-sampled" in notes[0]


def test_run_row_marks_sampling():
    record = {"run_id": "x", "status": "ok", "scenario": {"link": {"rate_mbit": 100}, "contention": {},
                                                          "flow": {"cca": "bbr", "sample_ss_ms": 100}}}
    assert data.run_row(record, {"throughput_mbit": 50.0}, "runs/x")["ss_sampled"] is True
    assert data.run_row(record, {"throughput_mbit": 50.0}, "runs/x")["sampler"] == "ss"
    record["scenario"]["flow"]["sample_ss_ms"] = None
    assert data.run_row(record, {"throughput_mbit": 50.0}, "runs/x")["ss_sampled"] is False
    record["scenario"]["flow"] = {"cca": "bbr", "sample_ms": 10, "sampler": "bpf"}
    row = data.run_row(record, {"throughput_mbit": 50.0}, "runs/x")
    assert row["ss_sampled"] is True and row["sampler"] == "bpf"
