"""The fidelity report's thresholds with intervals and its patched-vs-original comparisons, on runs tables built
here (synthetic values, named so) and on the committed data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bbrlab.analysis import confidence_report as cr
from bbrlab.analysis import data, fidelity

RATE = 20.0
DATA = Path(__file__).resolve().parents[3] / "data"


def _runs(curves: dict[tuple[str, float], dict[float, list[float]]]) -> pd.DataFrame:
    """A runs table: per (variant, timeslice) and share, the link utilisations given (share 100: mode none)."""
    rows = []
    for (variant, ts), by_share in curves.items():
        for share, values in by_share.items():
            for i, u in enumerate(values):
                rows.append({"run_id": f"{variant}-{ts}-{share}-{i}", "status": "ok", "variant": variant,
                             "contention_mode": "none" if share >= 100 else "deadline", "timeslice_ms": ts,
                             "cpu_share_pct": share, "rtt_ms": 20.0, "rate_mbit": RATE, "queue_mode": "bbrlab",
                             "buffer_bdp": 1.0, "loss_pct": 0.0, "streams": 1.0, "flows": 1,
                             "sender_qdisc": "fq_codel", "workload": "iperf3", "duration_s": 10.0,
                             "link_utilisation": u, "throughput_mbit": u * RATE})
    return pd.DataFrame(rows)


def _tight(u: float, n: int = 8) -> list[float]:
    return list(u + np.linspace(-0.01, 0.01, n))


def test_synthetic_threshold_is_bracketed_between_the_last_share_below_and_the_first_above():
    runs = _runs({("BBRv1", 1.0): {20: _tight(0.2), 40: _tight(0.5), 50: _tight(0.9), 70: _tight(0.93),
                                   100: _tight(0.95)}})
    [row] = cr.threshold_rows(runs).to_dict(orient="records")
    assert (row["estimate_pct"], row["low_pct"], row["high_pct"]) == (50.0, 40.0, 50.0)
    assert row["shares_tested"] == "20, 40, 50, 70, 100" and row["runs"] == 40
    assert row["paper_pct"] == 45.0 and row["paper_inside"] is True
    assert row["setting"] == "10 s, fq_codel"


def test_synthetic_uncertain_share_widens_the_interval():
    # At 50 % half the runs recover and half do not: its interval straddles 80 %, so the bracket is (40, 70].
    runs = _runs({("BBRv1 patched", 10.0): {40: _tight(0.3), 50: [0.3, 0.9] * 4, 70: _tight(0.9),
                                            100: _tight(0.95)}})
    [row] = cr.threshold_rows(runs).to_dict(orient="records")
    assert (row["low_pct"], row["high_pct"]) == (40.0, 70.0)
    assert row["paper_pct"] == 40.0 and row["paper_inside"] is False  # 40 is not in (40, 70]


def test_synthetic_never_recovering_curve_has_an_open_upper_end():
    runs = _runs({("BBRv1", 10.0): {25: _tight(0.1), 50: _tight(0.2), 100: _tight(0.95)}})
    [row] = cr.threshold_rows(runs).to_dict(orient="records")
    assert row["estimate_pct"] is None and row["low_pct"] == 50.0 and row["high_pct"] == 100.0
    assert row["interval"].startswith("never below 100 %")


def test_cubic_and_other_contention_models_get_no_threshold_row():
    runs = _runs({("Cubic", 1.0): {25: _tight(0.9), 100: _tight(0.95)}})
    assert cr.threshold_rows(runs).empty
    quota = _runs({("BBRv1", 1.0): {25: _tight(0.9)}}).assign(contention_mode="cfs-quota")
    assert cr.threshold_rows(quota).empty


def test_synthetic_comparison_calls_a_clear_shift_and_holm_corrects_over_the_points():
    runs = _runs({("BBRv1", 1.0): {25: _tight(0.2, 10), 50: _tight(0.9, 10)},
                  ("BBRv1 patched", 1.0): {25: _tight(0.9, 10), 50: _tight(0.9, 10)}})
    rows = cr.comparison_rows(runs, [("BBRv1", "BBRv1 patched")]).set_index("cpu_share_pct")
    low = rows.loc[25.0]
    assert low["call"] == "patched higher" and low["cliffs_delta"] == 1.0
    assert low["shift_mbit"] == pytest.approx(0.7 * RATE, abs=0.01) and low["shift_pct_of_rate"] == pytest.approx(70, abs=0.1)
    assert low["p_holm"] == pytest.approx(2 * low["p_value"])  # the smaller of two p values, times two
    assert rows.loc[50.0, "call"] == "no difference shown" and rows.loc[50.0, "p_holm"] >= low["p_holm"]


def test_two_runs_a_side_cannot_be_called_different_and_the_row_says_why():
    runs = _runs({("BBRv1", 1.0): {25: [0.1, 0.12]}, ("BBRv1 patched", 1.0): {25: [0.9, 0.92]}})
    [row] = cr.comparison_rows(runs, [("BBRv1", "BBRv1 patched")]).to_dict(orient="records")
    assert math.isnan(row["p_value"]) and row["magnitude"] == "n too small"
    assert row["call"] == "too few runs for the test (2 vs 2)"


def test_holm_adjustment_is_monotone_and_keeps_nan():
    out = cr.holm_adjust([0.01, math.nan, 0.04, 0.03])
    assert out[0] == pytest.approx(0.03) and math.isnan(out[1])
    assert out[3] == pytest.approx(0.06) and out[2] == pytest.approx(0.06)  # step-down keeps the order


def test_the_report_on_the_committed_data_carries_thresholds_and_comparisons(tmp_path):
    tables = data.load(DATA, cache=False)
    base = data.select(tables, {}, ss_sampled=None, workload="iperf3")
    claims = fidelity.claims(base)
    path = fidelity.write_report(claims, fidelity.testbed_note(base.runs), tmp_path, runs=base.runs, data_dir=DATA)
    text = path.read_text()
    assert "## Recovery thresholds with their intervals" in text and "## Patched against original" in text
    report = json.loads((tmp_path / "fidelity.json").read_text())
    thresholds, comparisons = report["thresholds"], report["patched_vs_original"]
    assert {t["variant"] for t in thresholds} == {"BBRv1", "BBRv1 patched"}
    # data/demo at 1 ms, 20 ms RTT, 10 Mbit/s: stock BBRv1 recovers above 25 %, patched at 25 % at the latest
    demo = {(t["variant"]): t for t in thresholds
            if t["timeslice_ms"] == 1.0 and t["rate_mbit"] == 10.0 and t["shares_tested"] == "10, 25, 50, 100"}
    assert demo["BBRv1"]["low_pct"] == 25.0 and demo["BBRv1 patched"]["high_pct"] == 25.0
    assert all(c["n_original"] >= 1 and c["n_patched"] >= 1 for c in comparisons)
    assert {c["call"].split(" (")[0] for c in comparisons} <= {"patched higher", "patched lower", "no difference shown",
                                                               "too few runs for the test", "no test"}
