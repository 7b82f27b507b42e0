"""The claim checks decide from the numbers they are given: each verdict flips when the data does."""

import json

import pandas as pd

from bbrlab.analysis import fidelity, paper_claims
from bbrlab.analysis.tables import Tables


def _runs(points):
    """points: (variant, timeslice_ms, share, utilisation) -> a runs table of 100 Mbit/s runs (2 reps each)."""
    rows = []
    for i, (variant, ts, share, util) in enumerate(points):
        for rep in range(2):
            rows.append(dict(run_id=f"r{i}-{rep}", status="ok", variant=variant, timeslice_ms=ts, cpu_share_pct=share,
                             rtt_ms=20, rate_mbit=100, link_utilisation=util, throughput_mbit=util * 100,
                             bbr_version=None if variant == "Cubic" else int(variant[4]),
                             patched=variant.endswith("patched"),
                             accelerator="tcg", kernel="6.1.0-56-amd64", testbed_kind="local"))
    return pd.DataFrame(rows)


PAPER_LIKE = [
    *[("Cubic", ts, s, 0.95) for ts in (1, 10) for s in (10, 25, 50, 100)],
    ("BBRv1", 1, 10, 0.05), ("BBRv1", 1, 25, 0.08), ("BBRv1", 1, 50, 0.9), ("BBRv1", 1, 100, 0.95),
    ("BBRv1", 10, 10, 0.03), ("BBRv1", 10, 25, 0.04), ("BBRv1", 10, 50, 0.3), ("BBRv1", 10, 70, 0.85), ("BBRv1", 10, 100, 0.95),
    ("BBRv1 patched", 1, 10, 0.2), ("BBRv1 patched", 1, 25, 0.85), ("BBRv1 patched", 1, 50, 0.95), ("BBRv1 patched", 1, 100, 0.95),
    ("BBRv1 patched", 10, 10, 0.1), ("BBRv1 patched", 10, 25, 0.3), ("BBRv1 patched", 10, 50, 0.9), ("BBRv1 patched", 10, 70, 0.9),
    ("BBRv1 patched", 10, 100, 0.95),
]


def test_paper_like_numbers_reproduce():
    med = fidelity.medians(_runs(PAPER_LIKE))
    assert paper_claims.claim_cubic_robust(med).verdict == "reproduced"
    assert paper_claims.claim_bbr_capped(med).verdict == "reproduced"
    rec = paper_claims.claim_recovery_thresholds(med)
    assert rec.evidence["recovery_share_pct"] == {"1.0": 50.0, "10.0": 70.0}
    assert rec.verdict == "reproduced"
    assert paper_claims.claim_patch_lowers_threshold(med).verdict == "reproduced"


def test_verdicts_flip_when_the_data_disagrees():
    flat = [(c, ts, s, 0.95) for c in ("Cubic", "BBRv1", "BBRv1 patched") for ts in (1, 10) for s in (10, 25, 50, 100)]
    med = fidelity.medians(_runs(flat))
    assert paper_claims.claim_bbr_capped(med).verdict == "not reproduced"
    assert paper_claims.claim_patch_lowers_threshold(med).verdict == "not reproduced"
    starved = [(c, ts, s, 0.95 if s == 100 else 0.02) for c in ("Cubic", "BBRv1") for ts in (1, 10)
               for s in (10, 25, 50, 100)]
    assert paper_claims.claim_cubic_robust(fidelity.medians(_runs(starved))).verdict == "not reproduced"


def test_recovery_share_needs_every_higher_share():
    assert paper_claims.recovery_share(pd.Series({10: 0.9, 25: 0.2, 50: 0.9, 100: 0.95})) == 50
    assert paper_claims.recovery_share(pd.Series({10: 0.1, 100: 0.95})) is None


def test_missing_dimensions_say_no_data():
    only_cubic = fidelity.medians(_runs([("Cubic", 1, 100, 0.95)]))
    assert paper_claims.claim_bbr_capped(only_cubic).verdict == "no data"
    assert paper_claims.claim_patch_lowers_threshold(only_cubic).verdict == "no data"
    empty_ss = pd.DataFrame()
    assert paper_claims.claim_inflight_deficit(empty_ss, _runs(PAPER_LIKE)).verdict == "no data"


def test_inflight_and_gain_claims_from_samples():
    runs = _runs([("BBRv1", 1, 25, 0.1), ("BBRv1", 1, 100, 0.95), ("BBRv1 patched", 1, 25, 0.8)])
    ss = pd.DataFrame(
        [dict(run_id="r0-0", inflight_bdp=0.5, pacing_gain=1.0, app_limited=False)] * 8
        + [dict(run_id="r1-0", inflight_bdp=1.5, pacing_gain=1.0, app_limited=False)] * 8
        + [dict(run_id="r2-0", inflight_bdp=0.7, pacing_gain=2.89, app_limited=False)] * 8
    )
    assert paper_claims.claim_inflight_deficit(ss, runs).verdict == "reproduced"
    assert paper_claims.claim_patched_gain(ss, runs).verdict == "reproduced"
    ss.loc[ss["run_id"] == "r2-0", "pacing_gain"] = 1.0
    assert paper_claims.claim_patched_gain(ss, runs).verdict == "not reproduced"


def test_bracket_is_what_a_coarse_grid_can_say():
    curve = pd.Series({10.0: 0.02, 25.0: 0.06, 50.0: 0.12, 100.0: 0.94})
    assert paper_claims.bracket(curve, paper_claims.recovery_share(curve)) == (50.0, 100.0)  # paper's 65 % fits
    curve = pd.Series({10.0: 0.02, 25.0: 0.08, 50.0: 0.89, 100.0: 0.93})
    assert paper_claims.bracket(curve, paper_claims.recovery_share(curve)) == (25.0, 50.0)  # paper's 45 % fits


def test_claims_are_checked_per_bbr_version_and_patch_pair():
    runs = _runs([("BBRv1", 1, 25, 0.05), ("BBRv3", 1, 25, 0.04), ("BBRv3 patched", 1, 25, 0.8),
                  ("Cubic", 1, 25, 0.95)])
    stock, pairs = fidelity.bbr_variants(runs)
    assert stock == ["BBRv1", "BBRv3"] and pairs == [("BBRv3", "BBRv3 patched")]

    none = pd.DataFrame({"run_id": []})
    table = fidelity.claims(Tables(runs.assign(ss_sampled=False, workload="iperf3"), none, none))
    capped = table[table["key"] == "bbr_capped_low_share"].set_index("subject")["verdict"]
    assert capped.to_dict() == {"BBRv1": "reproduced", "BBRv3": "reproduced"}
    assert set(table.loc[table["key"] == "patch_lowers_threshold", "subject"]) == {"BBRv3 vs BBRv3 patched"}


NONE = pd.DataFrame({"run_id": []})


def _with_ceiling(runs, ceiling_of):
    return runs.assign(ceiling_mbit=[ceiling_of(r) for r in runs.itertuples()], ss_sampled=False)


def _claims(runs):
    return fidelity.claims(Tables(runs.assign(ss_sampled=False, workload="iperf3"), NONE, NONE))


def test_points_at_or_above_the_ceiling_are_set_aside_and_named():
    # A TCG-like testbed: at 10 % share nobody, not even Cubic, carries 100 Mbit/s (ceiling 30).
    runs = _runs([(v, ts, s, 0.28 if s == 10 else u) for v, ts, s, u in PAPER_LIKE])
    runs = _with_ceiling(runs, lambda r: 30.0 if r.cpu_share_pct == 10 else 300.0)
    assert paper_claims.claim_cubic_robust(fidelity.medians(runs)).verdict == "partly"  # unfiltered: TCG shows
    split = fidelity.split_by_ceiling(runs)
    assert set(split.set_aside["cpu_share_pct"]) == {10.0} and split.unchecked == 0
    assert (split.judged["cpu_share_pct"] != 10).all() and len(split.judged) == len(runs) - 2 * len(split.set_aside)
    cubic = _claims(runs).set_index("key").loc["cubic_robust"]
    assert cubic["verdict"] == "reproduced" and "set aside" in cubic["measured"]
    assert cubic["set_aside"] == ["Cubic at 1 ms / 10 %, RTT 20 ms: link 100 Mbit/s >= CPU ceiling 30.0 Mbit/s "
                                  "(median throughput 28.0)",
                                  "Cubic at 10 ms / 10 %, RTT 20 ms: link 100 Mbit/s >= CPU ceiling 30.0 Mbit/s "
                                  "(median throughput 28.0)"]
    assert "CPU ceiling known for 26 of 26 points, 6 set aside" in fidelity.testbed_note(runs)


def test_report_lists_the_points_set_aside(tmp_path):
    runs = _with_ceiling(_runs(PAPER_LIKE), lambda r: 30.0 if r.cpu_share_pct == 10 else 300.0)
    text = fidelity.write_report(_claims(runs), fidelity.testbed_note(runs), tmp_path).read_text()
    assert "## Points set aside" in text and "recovery_thresholds (BBRv1):" in text
    assert "- BBRv1 at 10 ms / 10 %, RTT 20 ms" in text
    assert json.loads((tmp_path / "fidelity.json").read_text())["claims"][0]["set_aside"]


def test_without_a_calibration_every_point_is_judged_and_the_note_says_so(tmp_path):
    runs = _runs(PAPER_LIKE)
    split = fidelity.split_by_ceiling(runs)
    assert split.set_aside.empty and len(split.judged) == len(runs)
    assert "no CPU ceiling calibrated" in fidelity.testbed_note(runs)
    text = fidelity.write_report(_claims(runs), "n", tmp_path)
    assert text.read_text().rstrip().endswith("None.")


def _two_rates(bbr_mbit):
    """Cubic at the link rate everywhere; BBRv1 at 10-25 % share gets bbr_mbit(rate) at 10 and 100 Mbit/s."""
    rows = []
    points = [(v, r, s) for v in ("Cubic", "BBRv1") for r in (10, 100) for s in (10, 25, 100)]
    for i, (variant, rate, share) in enumerate(points):
        mbit = rate * 0.95 if variant == "Cubic" or share == 100 else bbr_mbit(rate)
        for rep in range(2):
            rows.append(dict(run_id=f"r{i}-{rep}", status="ok", variant=variant, timeslice_ms=10, cpu_share_pct=share,
                             rtt_ms=20, rate_mbit=rate, link_utilisation=mbit / rate, throughput_mbit=mbit,
                             bbr_version=None if variant == "Cubic" else 1, patched=False, accelerator="tcg"))
    return pd.DataFrame(rows)


def test_bandwidth_independence_compares_rates_at_low_shares():
    same = fidelity.medians(_two_rates(lambda rate: 4.0 if rate == 10 else 5.0))
    claim = paper_claims.claim_bandwidth_independent(same)
    assert claim.verdict == "reproduced" and "4.0 Mbit/s at 10 Mbit/s, 5.0 Mbit/s at 100 Mbit/s" in claim.measured
    scaled = fidelity.medians(_two_rates(lambda rate: rate * 0.5))
    assert paper_claims.claim_bandwidth_independent(scaled).verdict == "not reproduced"
    assert paper_claims.claim_bandwidth_independent(fidelity.medians(_runs(PAPER_LIKE))).verdict == "no data"


def test_figure_4_claims_are_judged_apart_at_each_rate():
    table = _claims(_two_rates(lambda rate: 5.0)).set_index("key")  # 50 % of 10 Mbit/s, 5 % of 100 Mbit/s
    capped = table.loc["bbr_capped_low_share"].set_index("subject")  # judged apart at each rate
    assert capped.loc["BBRv1 [100 Mbit/s]", "verdict"] == "reproduced"
    assert capped.loc["BBRv1 [10 Mbit/s]", "verdict"] == "not reproduced"
    assert table.loc["bandwidth_independent", "verdict"] == "reproduced"


def test_testbeds_agree_names_the_testbed_that_differs():
    import pandas as pd

    from bbrlab.analysis.paper_claims import claim_testbeds_agree

    def rows(testbed, util, n=3):
        return [{"run_id": f"{testbed}{i}", "status": "ok", "testbed": testbed, "cpu_share_pct": 100.0,
                 "variant": "Cubic", "rtt_ms": 20.0, "rate_mbit": 50.0, "streams": 1.0, "link_utilisation": util}
                for i in range(n)]

    agree = claim_testbeds_agree(pd.DataFrame(rows("a", 0.95) + rows("b", 0.93)))
    assert agree.verdict == "consistent" and "2 testbeds" in agree.measured
    off = claim_testbeds_agree(pd.DataFrame(rows("a", 0.95) + rows("b", 0.94) + rows("c", 0.60)))
    assert off.verdict == "inconsistent" and list(off.evidence["deviations"]) == ["c"]
    assert claim_testbeds_agree(pd.DataFrame(rows("a", 0.95))) is None


def test_each_bottleneck_queue_is_judged_apart():
    # The same points twice: Cubic halved under a 1 BDP queue, at the rate under the authors' deep queue. Mixed
    # together the claim would say "partly"; judged per queue, each queue gets its own verdict.
    shallow = _runs([("Cubic", ts, s, 0.5 if s < 100 else 0.95) for ts in (1, 10) for s in (25, 50, 100)])
    deep = _runs([("Cubic", ts, s, 0.95) for ts in (1, 10) for s in (25, 50, 100)])
    runs = pd.concat([shallow.assign(queue_mode="bbrlab", buffer_bdp=1.0),
                      deep.assign(queue_mode="authors", buffer_bdp=605.6, run_id=deep["run_id"] + "-a")])
    robust = _claims(runs).query("key == 'cubic_robust'").set_index("subject")["verdict"].to_dict()
    assert robust == {"Cubic [authors' queue]": "reproduced", "Cubic [1 BDP]": "not reproduced"}
    # one queue: the subjects stay as they were
    assert set(_claims(shallow.assign(queue_mode="bbrlab", buffer_bdp=1.0)).query("key == 'cubic_robust'")["subject"]) \
        == {"Cubic"}
