"""Campaign directories -> tidy tables, on the real host-netns fixture campaign (tests/netns_campaign.py)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.analysis import data, table_cache
from bbrlab.core.errors import BbrlabError

FIXTURE = Path(__file__).parents[2] / "fixtures" / "campaign"


@pytest.fixture
def campaign(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "c")
    return tmp_path / "c"


def iperf(run_dir):
    return json.loads((run_dir / "iperf.json").read_text())


def test_runs_table_matches_each_record_and_iperf_report(campaign):
    t = data.load(campaign)
    assert t.counts() == {"runs": 8, "ok": 8, "intervals": 32, "ss": 75, "vcpu": 0, "bottleneck": 0, "streams": 32, "flows": 8}
    assert list(t.runs.columns) == list(data.RUN_COLUMNS)
    for run_dir in (campaign / "runs").iterdir():
        record, report = json.loads((run_dir / "record.json").read_text()), iperf(run_dir)
        row = t.runs.set_index("run_id").loc[run_dir.name]
        sc = record["scenario"]
        assert row["cca"] == sc["flow"]["cca"] and row["cpu_share_pct"] == sc["contention"]["cpu_share_pct"]
        assert row["timeslice_ms"] == sc["contention"]["timeslice_ms"] and row["rate_mbit"] == 100
        assert row["throughput_mbit"] == pytest.approx(report["end"]["sum_received"]["bits_per_second"] / 1e6)
        assert row["retransmits"] == report["end"]["sum_sent"]["retransmits"]
        assert row["cpu_sender_pct"] == pytest.approx(report["end"]["cpu_utilization_percent"]["host_total"])
        assert row["link_utilisation"] == pytest.approx(row["throughput_mbit"] / 100)
        assert row["source"] == "bbrlab" and row["testbed_kind"] == "host-netns"


def test_intervals_sum_streams_per_interval(campaign):
    t = data.load(campaign)
    run_dir = next((campaign / "runs").iterdir())
    rows = t.intervals[t.intervals["run_id"] == run_dir.name].sort_values("t_start_s")
    sums = [i["sum"] for i in iperf(run_dir)["intervals"]]
    assert list(rows["throughput_mbit"]) == pytest.approx([s["bits_per_second"] / 1e6 for s in sums])
    assert list(rows["t_end_s"]) == pytest.approx([s["end"] for s in sums])


def test_ss_rows_only_for_iperf_data_ports_with_inflight_in_bdp(campaign):
    t = data.load(campaign)
    ports = {}
    for run_dir in (campaign / "runs").iterdir():
        ports[run_dir.name] = {c["local_port"] for c in iperf(run_dir)["start"]["connected"]}
    assert all(int(r.port) in ports[r.run_id] for r in t.ss.itertuples())
    bbr = t.ss[t.ss["cca"] == "bbr"].dropna(subset=["bdp_bytes"])
    assert len(bbr) > 0
    assert list(bbr["bdp_bytes"]) == pytest.approx(list(bbr["bw_mbit"] * 1e6 / 8 * bbr["mrtt_ms"] / 1e3))
    assert list(bbr["inflight_bdp"]) == pytest.approx(list(bbr["inflight_bytes"] / bbr["bdp_bytes"]))
    assert t.ss["t_s"].min() >= 0


def read_reused(t):
    (source,) = t.sources
    return source["read"], source["reused"]


def test_cache_is_reused_when_unchanged_and_only_changed_runs_are_reread(campaign):
    first = data.load(campaign)
    assert read_reused(first) == (8, 0)
    assert {p.name for p in (campaign / "tables").iterdir()} == {
        "runs.parquet", "intervals.parquet", "ss.parquet", "vcpu.parquet", "bottleneck.parquet", "streams.parquet",
        "flows.parquet", "manifest.json"}
    again = data.load(campaign)
    assert read_reused(again) == (0, 8)
    pd.testing.assert_frame_equal(again.runs, first.runs)
    # change one run's record: only that run is read again, and the change shows
    run_dir = sorted((campaign / "runs").iterdir())[0]
    record = json.loads((run_dir / "record.json").read_text())
    record["campaign"] = "renamed"
    (run_dir / "record.json").write_text(json.dumps(record))
    third = data.load(campaign)
    assert read_reused(third) == (1, 7)
    assert third.counts() == first.counts()
    assert third.runs.set_index("run_id").loc[run_dir.name, "campaign"] == "renamed"
    assert read_reused(data.load(campaign, force=True)) == (8, 0)


def test_failed_runs_are_kept_flagged_and_tmp_is_ignored(campaign):
    run_dir = sorted((campaign / "runs").iterdir())[0]
    failed = campaign / "failed" / f"{run_dir.name}.a1"
    shutil.copytree(run_dir, failed)
    record = json.loads((failed / "record.json").read_text())
    record.update(status="failed", reason="iperf3 exited 1")
    (failed / "record.json").write_text(json.dumps(record))
    shutil.copytree(run_dir, campaign / ".tmp" / "half-written")
    t = data.load(campaign)
    assert t.counts()["runs"] == 9 and t.counts()["ok"] == 8
    bad = t.runs[t.runs["status"] == "failed"].iloc[0]
    assert bad["reason"] == "iperf3 exited 1" and bad["path"].startswith("failed/")
    assert len(t.intervals) == 32  # the failed attempt adds no intervals next to its successful retry


def test_unreadable_run_is_noted_not_fatal(campaign):
    run_dir = sorted((campaign / "runs").iterdir())[0]
    (run_dir / "record.json").write_text("{not json")
    t = data.load(campaign)
    assert t.counts()["runs"] == 7 and any("unreadable run" in n for n in t.notes)


def test_process_pool_gives_the_same_tables(campaign, monkeypatch):
    monkeypatch.setattr(table_cache, "PARALLEL_MIN_UNITS", 1)
    pooled = data.load(campaign, cache=False, workers=2)
    serial = data.load(campaign, cache=False, workers=1)
    key = ["run_id"]
    pd.testing.assert_frame_equal(pooled.runs.sort_values(key).reset_index(drop=True),
                                  serial.runs.sort_values(key).reset_index(drop=True))


def test_select_is_strict_and_says_what_it_left_out(campaign):
    t = data.load(campaign)
    bbr = data.select(t, {"variant": "BBRv1"}, cpu_share_pct=[25])
    assert set(bbr.runs["cca"]) == {"bbr"} and len(bbr.runs) == 2
    assert set(bbr.intervals["run_id"]) == set(bbr.runs["run_id"]) and set(bbr.ss["run_id"]) <= set(bbr.runs["run_id"])
    assert bbr.notes == ["variant in ['BBRv1']: kept 4 of 8 runs (left out variant ['Cubic'])",
                         "cpu_share_pct in [25]: kept 2 of 4 runs (left out cpu_share_pct [100])"]
    absent = data.select(t, rate_mbit=50)
    assert absent.runs.empty and absent.intervals.empty and absent.ss.empty
    assert absent.notes == ["no runs with rate_mbit in [50] (the data has [100]): the selection is empty"]
    unrecorded = data.select(t, load_pct=50)
    assert unrecorded.runs.empty and "the data has none" in unrecorded.notes[0]
    assert len(data.select(t, rate_mbit=None).runs) == 8  # None: any value
    with pytest.raises(BbrlabError, match="no column 'colour'"):
        data.select(t, colour="red")


def test_select_leaves_out_runs_that_are_not_ok_unless_asked(campaign):
    run_dir = sorted((campaign / "runs").iterdir())[0]
    failed = campaign / "failed" / f"{run_dir.name}.a1"
    shutil.copytree(run_dir, failed)
    record = json.loads((failed / "record.json").read_text())
    (failed / "record.json").write_text(json.dumps({**record, "status": "failed", "reason": "iperf3 exited 1"}))
    t = data.load(campaign)
    assert len(data.select(t).runs) == 8 and data.select(t).notes == ["left out runs that are not ok: 1 failed"]
    assert len(data.select(t, ok_only=False).runs) == 9


def test_summaries_and_dimension_checks(campaign):
    t = data.load(campaign)
    bbr = data.select(t, cca="bbr", cpu_share_pct=25)
    s = data.summarise(t.runs, ["variant", "cpu_share_pct"])
    row = s[(s["variant"] == "BBRv1") & (s["cpu_share_pct"] == 25)].iloc[0]
    assert row["n"] == 2 and row["median"] == pytest.approx(bbr.runs["throughput_mbit"].median())
    assert data.check_dimensions(t, {"cpu_share_pct": 2}, ["rtt_ms"]) == []
    assert data.check_dimensions(t, {"rtt_ms": 2}, ["variant"]) == [
        "rtt_ms: the figure varies it over 2+ values, the data has [0]",
        "variant: the figure assumes one value, the selection has ['BBRv1', 'Cubic']"]


def test_sampled_runs_are_kept_out_of_throughput_selections(campaign):
    t = data.load(campaign)
    assert t.runs["ss_sampled"].all()  # the fixture's runs were all sampled
    throughput = data.select(t, ss_sampled=False)
    assert throughput.runs.empty and "(the data has [True])" in throughput.notes[0]


def test_missing_directory_and_empty_data_dir(tmp_path):
    empty = {"runs": 0, "ok": 0, "intervals": 0, "ss": 0, "vcpu": 0, "bottleneck": 0, "streams": 0, "flows": 0}
    assert data.load(tmp_path / "nope").counts() == empty
    assert data.load(tmp_path).counts() == empty


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "bbrlab.cli.main", *argv], capture_output=True, text=True,
                          timeout=120)


def test_ingest_command_prints_counts_and_reuses_tables(campaign):
    first = run_cli("ingest", str(campaign))
    assert first.returncode == 0, first.stderr
    assert "8 runs (8 ok), 32 intervals, 75 ss samples, 0 vCPU intervals; 8 read, 0 reused" in first.stdout
    again = run_cli("ingest", str(campaign))
    assert "all reused from tables/" in again.stdout
    assert "8 read" in run_cli("ingest", str(campaign), "--force").stdout


def test_ingest_and_figures_refuse_a_directory_without_runs(tmp_path):
    for argv in (("ingest", str(tmp_path)), ("figures", "--data", str(tmp_path), "--out", str(tmp_path / "o"))):
        proc = run_cli(*argv)
        assert proc.returncode != 0 and "no " in proc.stderr and str(tmp_path) in proc.stderr
    assert not (tmp_path / "o").exists()  # nothing rendered, nothing created


def test_two_campaigns_with_the_same_grid_keep_their_runs_apart(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "first")
    shutil.copytree(FIXTURE, tmp_path / "second")
    t = data.load(tmp_path)
    assert t.runs["run_id"].is_unique and len(t.runs) == 16
    one = t.runs["run_id"].iloc[0]
    assert one.split("/")[0] in ("first", "second")
    assert len(t.intervals[t.intervals["run_id"] == one]) == 4  # not 8: the other campaign's copy stays apart


def test_an_emptied_selection_names_only_the_condition_that_emptied_it(campaign):
    t = data.load(campaign)
    sel = data.select(t, rtt_ms=10, rate_mbit=100, streams=None)
    assert sel.notes == ["no runs with rtt_ms in [10] (the data has [0]): the selection is empty"]
    with pytest.raises(BbrlabError, match="no column 'colour'"):
        data.select(t, rtt_ms=10, colour=None)  # a typo is an error even when it asks for any value


def test_ceiling_column_comes_from_the_records_pointer(campaign):
    run_dir = sorted((campaign / "runs").iterdir())[0]
    record = json.loads((run_dir / "record.json").read_text())
    record["metadata"]["ceiling"] = {"value_mbit": 41.5, "source": "calibration.json", "key": "ts1ms-sh25-rtt0ms"}
    (run_dir / "record.json").write_text(json.dumps(record))
    runs = data.load(campaign).runs.set_index("run_id")
    assert runs.loc[run_dir.name, "ceiling_mbit"] == 41.5
    assert runs.drop(run_dir.name)["ceiling_mbit"].isna().all()  # runs without a calibration carry none
    assert runs["ceiling_mbit"].dtype == "float64"


def test_sweeps_keeps_only_campaigns_that_vary_the_column(campaign):
    t = data.load(campaign)
    runs = t.runs.copy()
    half = runs.index[: len(runs) // 2]
    runs.loc[half, "campaign"] = "loss-sweep"
    runs.loc[half, "loss_pct"] = [0.0, 10.0] * (len(half) // 2)
    mixed = t.with_runs(runs, [])
    swept = data.sweeps(mixed, "loss_pct")
    assert set(swept.runs["campaign"]) == {"loss-sweep"} and len(swept.runs) == len(half)
    assert set(swept.intervals["run_id"]) <= set(swept.runs["run_id"])
    fixed = runs.loc[runs.index[len(runs) // 2:], "campaign"].iloc[0]
    assert swept.notes == [f"campaigns that do not vary loss_pct left out: {fixed}"]
    assert data.sweeps(mixed, "loss_pct", at_least=3).runs.empty
    with pytest.raises(BbrlabError, match="no column 'nope'"):
        data.sweeps(mixed, "nope")
