"""The authors' published layout (logs/<timestamp>/meta.json + sender/iperf_N.json) -> bbrlab tables."""

import json
import math
import shutil
from pathlib import Path

import pytest

from bbrlab import authors, data
from bbrlab.errors import BbrlabError, ValidationError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "authors"


@pytest.fixture(scope="module")
def tables():
    return authors.read_authors(FIXTURE)


def point(t, ts):
    return t.runs[t.runs["run_id"].str.startswith(ts)]


def test_fixture_loads_one_row_per_repetition(tables):
    assert tables.counts() == {"runs": 8, "ok": 8, "intervals": 32, "ss": 0}
    assert set(tables.runs["source"]) == {"authors"}
    assert sorted(tables.runs["repetition"].unique()) == [0.0, 1.0]
    assert list(tables.runs.columns) == list(data.RUN_COLUMNS)


def test_deadline_in_ns_and_in_us_give_the_same_contention(tables):
    for ts in ("2026-11-21_01-17-00", "2026-11-21_01-17-30"):  # 1e6/4e6 ns and 1000/4000 us
        p = point(tables, ts)
        assert set(p["timeslice_ms"]) == {1.0} and set(p["cpu_share_pct"]) == {25.0}


def test_no_policy_means_full_share(tables):
    for ts in ("2026-11-21_01-18-00", "2026-11-21_01-18-30"):  # keys absent / zero
        p = point(tables, ts)
        assert set(p["cpu_share_pct"]) == {100.0} and p["timeslice_ms"].isna().all()


def test_missing_keys_are_tolerated(tables):
    p = point(tables, "2026-11-21_01-18-00")
    assert p["buffer_bytes"].isna().all() and p["sender_kernel"].isna().all()
    assert set(p["loss_model"]) == {"none"} and set(p["streams"]) == {1.0}


def test_throughput_is_the_iperf_receiver_sum_and_utilisation_its_ratio_to_rate(tables):
    p = point(tables, "2026-11-21_01-17-00")
    report = json.loads((FIXTURE / "logs/2026-11-21_01-17-00/sender/iperf_1.json").read_text())
    expected = report["end"]["sum_received"]["bits_per_second"] / 1e6
    row = p[p["repetition"] == 1].iloc[0]
    assert row["throughput_mbit"] == pytest.approx(expected)
    assert row["rate_mbit"] == 100 and row["link_utilisation"] == pytest.approx(expected / 100)
    assert row["retransmits"] == report["end"]["sum_sent"]["retransmits"]


def test_deadline_unit_inference_and_override():
    assert authors.deadline_unit_of(20_000_000) == "ns"
    assert authors.deadline_unit_of(20_000) == "us"
    assert authors.deadline_unit_of(20) == "ms"
    assert authors.contention_of({"deadline_run": 20, "deadline_period": 40}) == (20.0, 50.0)
    ts, share = authors.contention_of({"deadline_run": 10, "deadline_period": 40}, unit="us")
    assert ts == pytest.approx(0.01) and share == 25.0
    with pytest.raises(ValidationError, match="deadline_unit"):
        authors.contention_of({"deadline_run": 1, "deadline_period": 4}, unit="fortnights")


def test_loss_modes_map_to_bbrlab_models():
    assert authors.loss_of({}) == ("none", 0.0)
    assert authors.loss_of({"loss": {"mode": "random", "params": ["0.1%"]}}) == ("uniform", 0.1)
    assert authors.loss_of({"loss": {"mode": "gemodel", "params": "1 10 70 0.1"}}) == ("gemodel", 1.0)


def test_rate_and_rtt_strings_or_numbers_and_buffer_in_bdp():
    p = authors.point_params({"rate": "1gbit", "delay_rtt": 20, "buffer_size_bytes": 2_500_000, "parallel": 4})
    assert p["rate_mbit"] == 1000 and p["rtt_ms"] == 20 and p["streams"] == 4
    assert p["buffer_bdp"] == pytest.approx(1.0)
    with pytest.raises(ValidationError, match="rate"):
        authors.point_params({"rate": "fast"})


def test_unreadable_iperf_json_is_a_failed_run_not_a_crash(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "ds")
    (tmp_path / "ds/logs/2026-11-21_01-17-00/sender/iperf_0.json").write_text("{truncated")
    t = authors.read_authors(tmp_path / "ds")
    bad = t.runs[t.runs["run_id"] == "2026-11-21_01-17-00/iperf_0"].iloc[0]
    assert bad["status"] == "failed" and "unreadable" in bad["reason"] and math.isnan(bad["throughput_mbit"])
    assert t.counts()["ok"] == 7


def test_logs_folder_itself_is_accepted_and_other_folders_are_refused(tmp_path):
    assert authors.read_authors(FIXTURE / "logs").counts()["runs"] == 8
    with pytest.raises(BbrlabError, match="layout"):
        authors.read_authors(tmp_path)


def test_data_load_finds_authors_and_bbrlab_sources_side_by_side(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "authors")
    shutil.copytree(FIXTURE.parent / "campaign", tmp_path / "ours")
    t = data.load(tmp_path)
    assert t.runs.groupby("source").size().to_dict() == {"authors": 8, "bbrlab": 8}
