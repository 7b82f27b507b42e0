"""A CPU ceiling that shaped runs exceed is flagged (issue #26), and the calibration now bounds them: the
highest run, not the median of a few, over runs as long as the campaign's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.analysis import data, fidelity
from bbrlab.calibration import ceilings
from bbrlab.calibration.check import above_ceiling, ceiling_exceeded, report_lines
from bbrlab.calibration.plan import CalibrationSpec
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.run.ceiling import PointKey, load
from tests.unit.calibration.test_calibration import TESTBED, _write_runs

DEMO = Path(__file__).parents[3] / "data" / "demo"


def _runs(rows: list[tuple]) -> pd.DataFrame:
    cols = ["run_id", "status", "variant", "timeslice_ms", "cpu_share_pct", "rtt_ms", "rate_mbit", "queue_mode",
            "throughput_mbit", "ceiling_mbit"]
    return pd.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])


RUNS = _runs([
    ("a", "ok", "Cubic", 1.0, 10.0, 20.0, 100.0, "bbrlab", 45.8, 30.4),   # data/demo's case
    ("b", "ok", "Cubic", 1.0, 10.0, 20.0, 100.0, "bbrlab", 19.2, 30.4),
    ("c", "ok", "BBRv1", 1.0, 10.0, 20.0, 100.0, "bbrlab", 2.2, 30.4),
    ("d", "failed", "Cubic", 10.0, 25.0, 20.0, 100.0, "bbrlab", 99.0, 30.0),  # failed runs do not count
    ("e", "ok", "Cubic", 10.0, 25.0, 20.0, 100.0, "bbrlab", 50.0, None),     # no ceiling: not judged
])


@pytest.mark.parametrize("thr, ceiling, expected", [(32.5, 30.4, True), (30.4, 30.4, False), (10, 30, False),
                                                    (None, 30, None), (32.5, None, None), (float("nan"), 3, None)])
def test_one_run_above_its_ceiling(thr, ceiling, expected):
    assert above_ceiling(thr, ceiling) is expected


def test_points_whose_runs_exceed_their_ceiling_are_listed_with_the_numbers():
    flagged = ceiling_exceeded(RUNS)
    assert len(flagged) == 1
    row = flagged.iloc[0]
    assert (row["variant"], row["n"], row["n_above"], row["max_throughput_mbit"]) == ("Cubic", 2, 1, 45.8)
    assert row["reason"] == ("Cubic at 1 ms / 10 %, RTT 20 ms, 100 Mbit/s, bbrlab queue: 1 of 2 run(s) above the "
                             "CPU ceiling 30.4 Mbit/s (highest 45.8, median 32.5)")
    assert ceiling_exceeded(RUNS[RUNS["variant"] == "BBRv1"]).empty
    assert ceiling_exceeded(RUNS.drop(columns="ceiling_mbit")).empty


def test_the_fidelity_report_counts_and_lists_them(tmp_path):
    assert "1 point(s) with runs above their ceiling" in fidelity.ceiling_note(RUNS)
    table = pd.DataFrame([{"key": "k", "subject": "s", "verdict": "partly", "paper": "p", "measured": "m",
                           "set_aside": []}])
    text = fidelity.write_report(table, "n", tmp_path, runs=RUNS).read_text()
    assert "## Runs above their CPU ceiling" in text and "1 of 2 run(s) above the CPU ceiling 30.4" in text
    assert report_lines(RUNS[RUNS["variant"] == "BBRv1"])[-1].startswith("None:")
    assert "Runs above" not in fidelity.write_report(table, "n", tmp_path / "no-runs").read_text()


def test_data_demo_flags_the_point_the_issue_names(tmp_path):
    """In data/demo (re-recorded 2026-11-28), Cubic at 1 ms / 10 % over 100 Mbit/s carried 17.5 and 46.3 Mbit/s
    against a ceiling of 17.6 (the highest of calibration runs of 5.7-17.6); nothing else exceeds its ceiling.
    The demo recorded before it showed the same point above its ceiling (45.8 and 19.2 against 30.4)."""
    shutil.copytree(DEMO, tmp_path / "demo", ignore=shutil.ignore_patterns("tables"))
    runs = data.load(str(tmp_path / "demo")).runs
    flagged = ceiling_exceeded(runs)
    assert list(flagged["reason"]) == ["Cubic at 1 ms / 10 %, RTT 20 ms, 100 Mbit/s, bbrlab queue: 1 of 2 run(s) "
                                       "above the CPU ceiling 17.6 Mbit/s (highest 46.3, median 31.9)"]
    assert runs["above_ceiling"].sum() == 1


def test_the_demos_calibration_re_summarises_to_the_file_it_recorded():
    """data/demo's calibration was made with the highest-run statistic: summarised again from its runs (nothing
    re-run) it gives the file's ceilings, 17.6 Mbit/s at 1 ms / 10 % from 1-stream runs of 5.7 and 17.6."""
    cal = load(DEMO / "calibration.json")
    spec = CalibrationSpec.from_dict(cal.configuration["spec"])
    again = ceilings.summarise(spec, cal.path.parent / cal.runs_dir, cal.testbed)
    point = again.find(PointKey.of(1, 10, 20))
    assert cal.find(PointKey.of(1, 10, 20)).ceiling_mbit == point.ceiling_mbit == 17.614
    assert sorted(point.by_streams["1"]["repetitions_mbit"]) == [5.711, 17.614]
    assert sorted(p.ceiling_mbit for p in again.points) == sorted(p.ceiling_mbit for p in cal.points)


def test_one_high_run_makes_the_ceiling_even_when_another_stream_count_has_the_higher_median(tmp_path):
    spec = CalibrationSpec("c", (1,), (10,), (20,), streams=(1, 4), repetitions=2, bridge_reference=False)
    values = {(1, 0): 48.0, (1, 1): 12.0, (4, 0): 30.0, (4, 1): 31.0}
    _write_runs(tmp_path, spec, lambda s: values[(s.flow.params.streams, s.repetition)])
    point = ceilings.summarise(spec, tmp_path, TESTBED).find(PointKey.of(1, 10, 20))
    assert point.ceiling_mbit == 48.0 and point.streams == 1
    assert point.by_streams["4"] == {**point.by_streams["4"], "median_mbit": 30.5, "max_mbit": 31.0}


def test_a_campaigns_calibration_runs_as_long_as_its_runs():
    spec = CampaignSpec.from_dict({"name": "d", "ccas": ["cubic"], "timeslices_ms": [1], "cpu_shares_pct": [10],
                                   "rtts_ms": [20], "rates_mbit": [100], "duration_s": 10})
    assert CalibrationSpec.for_campaign(spec).duration_s == 10
    assert CalibrationSpec.for_campaign(spec, duration_s=5).duration_s == 5  # --duration still decides
