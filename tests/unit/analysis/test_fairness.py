"""Per-stream tables and fairness metrics, checked against the raw iperf3 JSON of committed runs.

The raw-JSON side of each check is parsed here, in the test, by another route than the reader takes (the
server's interval ``sum`` instead of its per-stream entries joined by port), so a slip in either shows.
"""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.analysis import data, fairness, table_cache

DATA = Path(__file__).parents[3] / "data"
FOUR_STREAMS = DATA / "poster-fig2-local" / "runs" / "debian-5.10-bbr-ts10ms-sh100-rtt20ms-20mbit-r00-189eb5c6ff"
ONE_CUBIC = DATA / "demo" / "runs" / "cubic-ts10ms-sh10-rtt20ms-100mbit-r00-c504fc732c"
OFFSET_S = 3.0


def _campaign(tmp_path, *runs: Path) -> Path:
    for run in runs:
        shutil.copytree(run, tmp_path / "c" / "runs" / run.name)
    return tmp_path / "c"


def test_streams_table_holds_each_stream_of_a_four_stream_run_as_iperf3_reported_it(tmp_path):
    t = data.load(_campaign(tmp_path, FOUR_STREAMS))
    raw = json.loads((FOUR_STREAMS / "iperf.json").read_text())
    server = raw["server_output_json"]["intervals"]
    assert len(t.streams) == 4 * len(server)  # the server's last, partial interval too
    assert sorted(t.streams["stream"].unique()) == [0, 1, 2, 3]
    first = t.streams[t.streams["t_start_s"] == 0].sort_values("port")
    raw_first = sorted(raw["intervals"][0]["streams"], key=lambda s: {c["socket"]: c["local_port"]
                                                                        for c in raw["start"]["connected"]}[s["socket"]])
    assert list(first["rtt_ms"]) == [s["rtt"] / 1000 for s in raw_first]
    assert list(first["cwnd_bytes"]) == [s["snd_cwnd"] for s in raw_first]
    assert list(first["retransmits"]) == [s["retransmits"] for s in raw_first]
    # the receiver's four streams add up to the server's own interval sum, interval by interval
    per_interval = t.streams.groupby("t_start_s")["throughput_mbit"].sum().tolist()
    assert per_interval == pytest.approx([iv["sum"]["bits_per_second"] / 1e6 for iv in server], rel=1e-9)
    flow = t.flows.iloc[0]
    assert (flow["flow"], flow["origin"], flow["cca"], flow["streams"]) == (0, "sender", "bbr", 4)
    assert flow["throughput_mbit"] == pytest.approx(raw["end"]["sum_received"]["bits_per_second"] / 1e6)
    run = t.runs.iloc[0]
    assert run["flows"] == 1 and pd.isna(run["jain_index"]) and pd.isna(run["convergence_s"])


def _receiver_intervals(raw: dict, offset_s: float) -> list[tuple[float, float, float]]:
    """(start, end, Mbit/s) of the server's interval sums, shifted by the flow's start."""
    return [(iv["sum"]["start"] + offset_s, iv["sum"]["end"] + offset_s, iv["sum"]["bits_per_second"] / 1e6)
            for iv in raw["server_output_json"]["intervals"]]


def _jain_from_raw(flows: list[list[tuple[float, float, float]]]) -> float:
    lo = max(f[0][0] for f in flows)
    hi = min(f[-1][1] for f in flows)
    means = [sum(r * max(0.0, min(b, hi) - max(a, lo)) for a, b, r in f) / (hi - lo) for f in flows]
    return sum(means) ** 2 / (len(means) * sum(m * m for m in means))


def _flow1() -> dict:
    """``metadata.flows``' entry of the Cubic flow started ``OFFSET_S`` after flow 0, every key as a run writes it
    (bbrlab.run.flowrecord.FlowOutcome)."""
    return {"index": 1, "cca": "cubic", "streams": 1, "start_s": OFFSET_S, "duration_s": 10, "origin": "competitor",
            "asked_start_s": OFFSET_S, "file": "iperf-flow1.json", "server_port": 5202, "client_ports": [40001],
            "iperf_sender": "cubic", "throughput_mbit": 10.0}


def test_jain_index_in_the_tables_matches_one_computed_from_the_raw_json_of_two_recorded_flows_composed_into_a_run(
        tmp_path):
    """Two recorded reports (a 4-stream BBR run and a Cubic run) made into one run's two flows, the second
    starting 3 s later, as a multi-flow record lays them out (``metadata.flows``, ``iperf-flow1.json``)."""
    campaign = _campaign(tmp_path, FOUR_STREAMS)
    run_dir = campaign / "runs" / FOUR_STREAMS.name
    shutil.copy(ONE_CUBIC / "iperf.json", run_dir / "iperf-flow1.json")
    record = json.loads((run_dir / "record.json").read_text())
    record["metadata"]["flows"] = [_flow1()]
    (run_dir / "record.json").write_text(json.dumps(record))
    t = data.load(campaign)

    bbr = json.loads((run_dir / "iperf.json").read_text())
    cubic = json.loads((run_dir / "iperf-flow1.json").read_text())
    expected = _jain_from_raw([_receiver_intervals(bbr, 0.0), _receiver_intervals(cubic, OFFSET_S)])
    run = t.runs.iloc[0]
    assert run["flows"] == 2
    assert run["jain_index"] == pytest.approx(expected, rel=1e-9)
    assert 0.5 <= run["jain_index"] <= 1
    assert run["overlap_s"] == pytest.approx(min(bbr["server_output_json"]["intervals"][-1]["sum"]["end"],
                                                 cubic["server_output_json"]["intervals"][-1]["sum"]["end"] + OFFSET_S)
                                             - OFFSET_S)
    assert t.flows["share"].sum() == pytest.approx(1.0)
    assert list(t.flows.sort_values("flow")["origin"]) == ["sender", "competitor"]
    assert t.streams[t.streams["flow"] == 1]["t_start_s"].min() == OFFSET_S


def test_jain_index_is_one_for_equal_flows_and_one_over_n_when_one_takes_all():
    assert fairness.jain_index([5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert fairness.jain_index([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert fairness.jain_index([]) is None and fairness.jain_index([0.0, 0.0]) is None


def _rows(flow: int, rates: list[float], start: float = 0.0) -> list[tuple]:
    return [("r", flow, 0, 1, start + k, start + k + 1, rate, rate) for k, rate in enumerate(rates)]


def test_convergence_is_the_first_bin_from_which_the_flows_stay_fair():
    rows = _rows(0, [10, 9, 8, 5, 5, 5, 5]) + _rows(1, [0, 1, 2, 5, 5, 5, 5])
    run, shares = fairness.run_fairness(rows)
    assert run["convergence_s"] == 3.0 and run["overlap_s"] == 7.0
    assert shares[0]["share"] == pytest.approx(47 / 70)
    never = fairness.run_fairness(_rows(0, [5, 5, 10]) + _rows(1, [5, 5, 0]))[0]
    assert never["convergence_s"] is None
    late = fairness.run_fairness(_rows(0, [10, 10, 5, 5]) + _rows(1, [5, 5], start=2.0))[0]
    assert late["overlap_s"] == 2.0 and late["convergence_s"] == 0.0 and late["jain_index"] == pytest.approx(1.0)


def test_harm_compares_a_competitor_with_its_uncontended_runs_alone_and_leaves_it_missing_without_them():
    point = {"status": "ok", "rtt_ms": 20.0, "rate_mbit": 50.0, "buffer_bdp": 1.0, "queue_mode": "bbrlab",
             "loss_pct": 0.0, "sender_qdisc": "fq_codel", "timeslice_ms": 10.0}
    runs = pd.DataFrame([
        {**point, "run_id": "pair", "flows": 2, "cca": "bbr", "contention_mode": "deadline", "cpu_share_pct": 50.0},
        {**point, "run_id": "cubic-alone-1", "flows": 1, "cca": "cubic", "contention_mode": "none", "cpu_share_pct": 100.0},
        {**point, "run_id": "cubic-alone-2", "flows": 1, "cca": "cubic", "contention_mode": "none", "cpu_share_pct": 100.0},
        {**point, "run_id": "cubic-contended", "flows": 1, "cca": "cubic", "contention_mode": "deadline",
         "cpu_share_pct": 50.0, "throughput_mbit": 1.0},
    ]).assign(throughput_mbit=[None, 40.0, 44.0, 1.0])
    flows = pd.DataFrame([
        {"run_id": "pair", "flow": 0, "origin": "sender", "cca": "bbr", "overlap_throughput_mbit": 30.0},
        {"run_id": "pair", "flow": 1, "origin": "competitor", "cca": "cubic", "overlap_throughput_mbit": 21.0},
    ])
    h = fairness.harm(runs, flows).set_index("flow")
    assert h.loc[1, "alone_mbit"] == 42.0 and h.loc[1, "baseline_runs"] == 2
    assert h.loc[1, "throughput_ratio"] == pytest.approx(0.5) and h.loc[1, "harm"] == pytest.approx(0.5)
    assert h.loc[0, "baseline_runs"] == 0 and pd.isna(h.loc[0, "alone_mbit"])


def test_a_table_cache_of_the_previous_schema_is_rebuilt_with_the_streams_and_flows_tables(tmp_path):
    campaign = _campaign(tmp_path, FOUR_STREAMS)
    data.load(campaign)
    manifest = campaign / "tables" / "manifest.json"
    old = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**old, "schema": "bbrlab.tables/9"}))
    (campaign / "tables" / "streams.parquet").unlink()
    again = data.load(campaign)
    assert again.sources[0]["read"] == 1 and len(again.streams) == 44
    assert json.loads(manifest.read_text())["schema"] == table_cache.TABLES_SCHEMA


def test_fairness_figures_draw_each_flow_and_the_index_and_say_what_is_missing(tmp_path):
    from bbrlab.analysis import fairness_plots, plots

    campaign = _campaign(tmp_path, FOUR_STREAMS, ONE_CUBIC)
    run_dir = campaign / "runs" / FOUR_STREAMS.name
    shutil.copy(ONE_CUBIC / "iperf.json", run_dir / "iperf-flow1.json")
    record = json.loads((run_dir / "record.json").read_text())
    record["metadata"]["flows"] = [_flow1()]
    (run_dir / "record.json").write_text(json.dumps(record))
    t = data.load(campaign)
    fig, table = fairness_plots.flows_over_time(t)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["flow 0: bbr (sender)", "flow 1: cubic (competitor)"]
    assert list(lines[1].get_xdata()) == list(table[table["flow"] == 1]["t_end_s"])
    plots.save(fig, tmp_path / "out", "flows")
    fig, table = fairness_plots.fairness_vs_share(t)
    assert table[table["measure"] == "jain_index"]["value"].tolist() == [t.runs["jain_index"].dropna().iloc[0]]
    fig, table = fairness_plots.qdisc_vs_share(t)
    assert "one sender qdisc" in fig.axes[0].texts[0].get_text()
