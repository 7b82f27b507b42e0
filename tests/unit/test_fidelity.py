"""The claim checks decide from the numbers they are given: each verdict flips when the data does."""

import json

import pandas as pd

from bbrlab import fidelity
from bbrlab.data import Tables


def _runs(points):
    """points: (cca, timeslice_ms, share, utilisation) -> a runs table of 100 Mbit/s runs (2 reps each)."""
    rows = []
    for i, (cca, ts, share, util) in enumerate(points):
        for rep in range(2):
            rows.append(dict(run_id=f"r{i}-{rep}", status="ok", cca=cca, timeslice_ms=ts, cpu_share_pct=share,
                             rtt_ms=20, rate_mbit=100, link_utilisation=util, throughput_mbit=util * 100,
                             accelerator="tcg", sender_kernel="6.1.0-56-amd64", testbed_kind="local"))
    return pd.DataFrame(rows)


PAPER_LIKE = [
    *[("cubic", ts, s, 0.95) for ts in (1, 10) for s in (10, 25, 50, 100)],
    ("bbr", 1, 10, 0.05), ("bbr", 1, 25, 0.08), ("bbr", 1, 50, 0.9), ("bbr", 1, 100, 0.95),
    ("bbr", 10, 10, 0.03), ("bbr", 10, 25, 0.04), ("bbr", 10, 50, 0.3), ("bbr", 10, 70, 0.85), ("bbr", 10, 100, 0.95),
    ("bbr2b", 1, 10, 0.2), ("bbr2b", 1, 25, 0.85), ("bbr2b", 1, 50, 0.95), ("bbr2b", 1, 100, 0.95),
    ("bbr2b", 10, 10, 0.1), ("bbr2b", 10, 25, 0.3), ("bbr2b", 10, 50, 0.9), ("bbr2b", 10, 70, 0.9),
    ("bbr2b", 10, 100, 0.95),
]


def test_paper_like_numbers_reproduce():
    med = fidelity.medians(_runs(PAPER_LIKE))
    assert fidelity.claim_cubic_robust(med).verdict == "reproduced"
    assert fidelity.claim_bbr_capped(med).verdict == "reproduced"
    rec = fidelity.claim_recovery_thresholds(med)
    assert rec.evidence["recovery_share_pct"] == {"1.0": 50.0, "10.0": 70.0}
    assert rec.verdict == "reproduced"
    assert fidelity.claim_patch_lowers_threshold(med).verdict == "reproduced"


def test_verdicts_flip_when_the_data_disagrees():
    flat = [(c, ts, s, 0.95) for c in ("cubic", "bbr", "bbr2b") for ts in (1, 10) for s in (10, 25, 50, 100)]
    med = fidelity.medians(_runs(flat))
    assert fidelity.claim_bbr_capped(med).verdict == "not reproduced"
    assert fidelity.claim_patch_lowers_threshold(med).verdict == "not reproduced"
    starved = [(c, ts, s, 0.95 if s == 100 else 0.02) for c in ("cubic", "bbr") for ts in (1, 10)
               for s in (10, 25, 50, 100)]
    assert fidelity.claim_cubic_robust(fidelity.medians(_runs(starved))).verdict == "not reproduced"


def test_recovery_share_needs_every_higher_share():
    assert fidelity.recovery_share(pd.Series({10: 0.9, 25: 0.2, 50: 0.9, 100: 0.95})) == 50
    assert fidelity.recovery_share(pd.Series({10: 0.1, 100: 0.95})) is None


def test_missing_dimensions_say_no_data():
    only_cubic = fidelity.medians(_runs([("cubic", 1, 100, 0.95)]))
    assert fidelity.claim_bbr_capped(only_cubic).verdict == "no data"
    assert fidelity.claim_patch_lowers_threshold(only_cubic).verdict == "no data"
    empty_ss = pd.DataFrame()
    assert fidelity.claim_inflight_deficit(empty_ss, _runs(PAPER_LIKE)).verdict == "no data"


def test_inflight_and_gain_claims_from_samples():
    runs = _runs([("bbr", 1, 25, 0.1), ("bbr", 1, 100, 0.95), ("bbr2b", 1, 25, 0.8)])
    ss = pd.DataFrame(
        [dict(run_id="r0-0", inflight_bdp=0.5, pacing_gain=1.0, app_limited=False)] * 8
        + [dict(run_id="r1-0", inflight_bdp=1.5, pacing_gain=1.0, app_limited=False)] * 8
        + [dict(run_id="r2-0", inflight_bdp=0.7, pacing_gain=2.89, app_limited=False)] * 8
    )
    assert fidelity.claim_inflight_deficit(ss, runs).verdict == "reproduced"
    assert fidelity.claim_patched_gain(ss, runs).verdict == "reproduced"
    ss.loc[ss["run_id"] == "r2-0", "pacing_gain"] = 1.0
    assert fidelity.claim_patched_gain(ss, runs).verdict == "not reproduced"


def test_bracket_is_what_a_coarse_grid_can_say():
    curve = pd.Series({10.0: 0.02, 25.0: 0.06, 50.0: 0.12, 100.0: 0.94})
    assert fidelity.bracket(curve, fidelity.recovery_share(curve)) == (50.0, 100.0)  # paper's 65 % fits
    curve = pd.Series({10.0: 0.02, 25.0: 0.08, 50.0: 0.89, 100.0: 0.93})
    assert fidelity.bracket(curve, fidelity.recovery_share(curve)) == (25.0, 50.0)  # paper's 45 % fits


def _with_ceiling(runs, ceiling_of):
    return runs.assign(ceiling_mbit=[ceiling_of(r) for r in runs.itertuples()])


def test_points_at_or_above_the_ceiling_are_set_aside_and_named():
    # A TCG-like testbed: at 10 % share nobody, not even Cubic, carries 100 Mbit/s (ceiling 30).
    runs = _runs([(c, ts, s, 0.28 if s == 10 else u) for c, ts, s, u in PAPER_LIKE])
    runs = _with_ceiling(runs, lambda r: 30.0 if r.cpu_share_pct == 10 else 300.0)
    assert fidelity.claim_cubic_robust(fidelity.medians(runs)).verdict == "partly"  # unfiltered: TCG shows
    split = fidelity.split_by_ceiling(runs)
    assert set(split.set_aside["cpu_share_pct"]) == {10.0} and split.unchecked == 0
    assert (split.judged["cpu_share_pct"] != 10).all() and len(split.judged) == len(runs) - 2 * len(split.set_aside)
    table = fidelity.claims(Tables(runs, pd.DataFrame(), pd.DataFrame()))
    cubic = table.set_index("key").loc["cubic_robust"]
    assert cubic["verdict"] == "reproduced" and "set aside" in cubic["measured"]
    assert cubic["set_aside"] == ["cubic at 1 ms / 10 %, RTT 20 ms: link 100 Mbit/s >= CPU ceiling 30.0 Mbit/s "
                                  "(median throughput 28.0)",
                                  "cubic at 10 ms / 10 %, RTT 20 ms: link 100 Mbit/s >= CPU ceiling 30.0 Mbit/s "
                                  "(median throughput 28.0)"]
    assert "CPU ceiling known for" in fidelity.testbed_note(runs)


def test_report_lists_the_points_set_aside(tmp_path):
    runs = _with_ceiling(_runs(PAPER_LIKE), lambda r: 30.0 if r.cpu_share_pct == 10 else 300.0)
    table = fidelity.claims(Tables(runs, pd.DataFrame(), pd.DataFrame()))
    text = fidelity.write_report(table, fidelity.testbed_note(runs), tmp_path).read_text()
    assert "## Points set aside" in text and "- bbr at 10 ms / 10 %, RTT 20 ms" in text
    assert json.loads((tmp_path / "fidelity.json").read_text())["claims"][0]["set_aside"]


def test_without_a_calibration_every_point_is_judged_and_the_note_says_so(tmp_path):
    runs = _runs(PAPER_LIKE)
    split = fidelity.split_by_ceiling(runs)
    assert split.set_aside.empty and len(split.judged) == len(runs)
    assert "no CPU ceiling calibrated" in fidelity.testbed_note(runs)
    text = fidelity.write_report(fidelity.claims(Tables(runs, pd.DataFrame(), pd.DataFrame())), "n", tmp_path)
    assert text.read_text().rstrip().endswith("None.")


def _two_rates(bbr_mbit):
    """cubic at the link rate everywhere; bbr at 10-25 % share gets bbr_mbit(rate, share) at 10 and 100 Mbit/s."""
    rows = []
    for i, (cca, rate, share) in enumerate((c, r, s) for c in ("cubic", "bbr") for r in (10, 100) for s in (10, 25, 100)):
        mbit = rate * 0.95 if cca == "cubic" or share == 100 else bbr_mbit(rate, share)
        for rep in range(2):
            rows.append(dict(run_id=f"r{i}-{rep}", status="ok", cca=cca, timeslice_ms=10, cpu_share_pct=share,
                             rtt_ms=20, rate_mbit=rate, link_utilisation=mbit / rate, throughput_mbit=mbit,
                             accelerator="tcg"))
    return pd.DataFrame(rows)


def test_bandwidth_independence_compares_rates_at_low_shares():
    same = fidelity.medians(_two_rates(lambda rate, share: 4.0 if rate == 10 else 5.0))
    claim = fidelity.claim_bandwidth_independent(same)
    assert claim.verdict == "reproduced" and "4.0 Mbit/s at 10 Mbit/s, 5.0 Mbit/s at 100 Mbit/s" in claim.measured
    scaled = fidelity.medians(_two_rates(lambda rate, share: rate * 0.5))
    assert fidelity.claim_bandwidth_independent(scaled).verdict == "not reproduced"
    one_rate = fidelity.medians(_runs(PAPER_LIKE))
    assert fidelity.claim_bandwidth_independent(one_rate).verdict == "no data"


def test_figure_4_claims_are_judged_at_100_mbit_when_there_are_two_rates():
    runs = _two_rates(lambda rate, share: 5.0)  # bbr: 50 % of 10 Mbit/s, 5 % of 100 Mbit/s
    table = fidelity.claims(Tables(runs, pd.DataFrame(), pd.DataFrame())).set_index("key")
    capped = table.loc["bbr_capped_low_share"]
    assert capped["verdict"] == "reproduced" and capped["measured"].startswith("at 100 Mbit/s: highest bbr median")
    assert table.loc["bandwidth_independent", "verdict"] == "reproduced"
