"""The timeline: vCPU intervals, socket samples and bottleneck samples of one run on the host's clock.

Hand-built tables check the arithmetic (origin, gaps, the samples around a gap, the window, the drawn points);
the recorded demo (data/demo-sampled, traced) checks that the axis matches what the raw files say.
"""

import csv
import json
from pathlib import Path

import pytest

from bbrlab.analysis import facets, offaxis, tables, timeline

ROOT = Path(__file__).parents[3]
DEMO = ROOT / "data" / "demo-sampled"
T0 = 1_700_000_000.0  # host Unix seconds of the first socket sample
US = 1e-6  # float64 Unix seconds resolve ~0.24 us: times compare to the microsecond (the trace's own resolution)


def hand_tables() -> tables.Tables:
    """One bbr run: a vCPU on 10 ms, off 30 ms, four times; a socket sample every 5 ms while on; a queue sample
    every 10 ms. Link 100 Mbit/s x 20 ms = 250,000 bytes BDP."""
    run = {"run_id": "r", "status": "ok", "cca": "bbr", "timeslice_ms": 10.0, "cpu_share_pct": 25.0,
           "rate_mbit": 100.0, "rtt_ms": 20.0, "sender_clock_uncertainty_ms": 0.6}
    vcpu, ss = [], []
    for k in range(4):
        on_ns = int((T0 + 0.040 * k) * 1e9)
        vcpu.append({"run_id": "r", "tid": 7, "on_cpu": True, "start_ns": on_ns, "end_ns": on_ns + 10_000_000})
        vcpu.append({"run_id": "r", "tid": 7, "on_cpu": False, "start_ns": on_ns + 10_000_000,
                     "end_ns": on_ns + 40_000_000})
        for j, t in enumerate((0.001, 0.006)):
            ss.append({"run_id": "r", "t_host_s": T0 + 0.040 * k + t, "port": 5201.0, "cca": "bbr",
                       "delivery_rate_mbit": 80.0 - 20 * j if k else 90.0, "bw_mbit": 90.0, "pacing_rate_mbit": 100.0,
                       "inflight_bytes": 125_000.0, "bytes_acked": 1.0})
    queue = [{"run_id": "r", "t_host_s": T0 + 0.010 * i, "bottleneck": True, "backlog_bytes": 25_000 * i,
              "drops": 0, "align_uncertainty_ms": 0.4} for i in range(16)]
    return tables.build_tables([tables.RunRows(run, [], ss, [], vcpu, queue)])


def test_the_axis_starts_at_the_first_socket_sample_on_the_host_clock():
    tl = timeline.of_run(hand_tables(), "r")
    assert tl.t0_host_s == pytest.approx(T0 + 0.001)
    assert tl.socket["t_s"].iloc[0] == 0.0
    assert tl.vcpu["start_s"].iloc[0] == pytest.approx(-0.001, abs=US)
    assert tl.link_bdp_bytes == pytest.approx(250_000)
    assert tl.socket["inflight_link_bdp"].tolist() == pytest.approx([0.5] * 8)
    assert tl.backlog["backlog_link_bdp"].iloc[2] == pytest.approx(0.2)
    assert tl.align_uncertainty_ms == 0.6  # the larger of the sender's (0.6) and the emulator's (0.4)


def test_gaps_are_the_spaces_between_on_cpu_intervals():
    g = timeline.gaps(timeline.of_run(hand_tables(), "r"), min_ms=5)
    assert g["length_ms"].tolist() == pytest.approx([30.0] * 3)


def test_gap_effect_pairs_the_last_sample_before_with_the_first_after():
    e = timeline.gap_effect(timeline.of_run(hand_tables(), "r"), min_gap_ms=5)
    # the first on-interval's samples read 90; later intervals start at 80 and fall to 60 within the interval
    assert e["before"].tolist() == [90.0, 60.0, 60.0]
    assert e["after"].tolist() == [80.0, 80.0, 80.0]
    assert e["after_delay_ms"].tolist() == pytest.approx([1.0] * 3, abs=US * 1e3)
    s = timeline.gap_summary([timeline.of_run(hand_tables(), "r")], min_gap_ms=5).iloc[0]
    assert (s["gaps"], s["fell_share"]) == (3, pytest.approx(1 / 3))


def test_the_figure_draws_only_the_window_and_hides_nothing():
    tl = timeline.of_run(hand_tables(), "r")
    fig = timeline.figure([tl, tl], 0.030, 0.052)
    points = facets.plotted_points(fig)
    assert offaxis.points_outside_axes(points) == []
    bars = points[0]["lines"][0]
    # on-CPU from 39 ms and 79 ms (host t0 + 40k ms, axis from the first sample at +1 ms) for 10 ms, cut at 82 ms
    assert bars["label"] == "vCPU 7 on-CPU"
    assert [x for seg in bars["segments"] for x in (seg[0][0], seg[1][0])] == pytest.approx([9.0, 19.0, 49.0, 52.0], abs=US * 1e3)
    delivery = next(ln for ln in points[2]["lines"] if ln["label"] == "delivery rate")
    assert delivery["x"] == pytest.approx([10.0, 15.0, 50.0], abs=US * 1e3)  # the samples at 40, 45 and 80 ms
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.parametrize(("start_s", "length_s", "field"), [(-1, 0.3, "start_s"), (0, 0, "length_s"),
                                                             (0, float("nan"), "length_s"), (0, 601, "length_s")])
def test_a_bad_zoom_window_is_refused_naming_the_field(start_s, length_s, field):
    with pytest.raises(timeline.TimelineError, match=field):
        timeline.figure([timeline.of_run(hand_tables(), "r")], start_s, length_s)


def test_a_run_without_a_trace_is_refused_with_what_it_lacks():
    t = hand_tables()
    bare = tables.Tables(t.runs, t.intervals, t.ss, [], t.sources, t.vcpu.iloc[0:0], t.bottleneck)
    with pytest.raises(timeline.TimelineError, match="vCPU trace"):
        timeline.of_run(bare, "r")
    with pytest.raises(timeline.TimelineError, match="traced runs"):
        timeline.pick(t, cca="cubic", timeslice_ms=10, cpu_share_pct=25)


def _first_sample_host_s(run_dir: Path) -> float:
    """The first data-port sample of a recorded run on the host's clock, from its raw files (not the tables)."""
    from bbrlab.run.clocks import to_local
    from bbrlab.sampling import sockdiag

    record = json.loads((run_dir / "record.json").read_text())
    port = json.loads((run_dir / "iperf.json").read_text())["start"]["connected"][0]["local_port"]
    rows = [r for r in sockdiag.rows((run_dir / "samples.log").read_text()) if r["port"] == port]
    return to_local(min(r["t_unix_s"] for r in rows), record["metadata"]["clocks"]["sender"])


def test_the_recorded_demo_puts_the_raw_files_on_one_axis(tmp_path):
    import shutil

    from bbrlab.analysis import data

    shutil.copytree(DEMO, tmp_path / "demo")  # load writes its cache beside the data
    t = data.load(tmp_path / "demo")
    run_id = timeline.pick(t, cca="bbr", timeslice_ms=10, cpu_share_pct=25)
    run_dir = next(p for p in (DEMO / "runs").iterdir() if p.name == run_id)
    tl = timeline.of_run(t, run_id)
    assert tl.t0_host_s == pytest.approx(_first_sample_host_s(run_dir), abs=1e-6)
    with open(run_dir / "vcpu.csv", newline="") as f:
        first_on = min(int(r["start_ns"]) for r in csv.DictReader(f) if r["state"] == "on")
    assert tl.on["start_s"].iloc[0] == pytest.approx(first_on / 1e9 - tl.t0_host_s, abs=1e-6)
    # the guest samples only while a vCPU runs: (nearly) every sample lies in an on-CPU interval, give or take
    # the sender's clock uncertainty (the run's own alignment check says the same)
    sender = json.loads((run_dir / "record.json").read_text())["metadata"]["clocks"]["sender"]
    slack = max(sender["start"]["uncertainty_s"], sender["end"]["uncertainty_s"])
    on = tl.on.to_numpy()
    inside = [((on[:, 0] - slack <= x) & (x <= on[:, 1] + slack)).any() for x in tl.socket["t_s"]]
    assert sum(inside) / len(inside) >= 0.99
    emulator = json.loads((run_dir / "record.json").read_text())["metadata"]["clocks"]["emulator"]
    assert len(tl.backlog) > 0
    assert tl.align_uncertainty_ms == pytest.approx(1e3 * max(
        json.loads((run_dir / "record.json").read_text())["metadata"]["alignment"]["uncertainty_ns"] / 1e9,
        emulator["start"]["uncertainty_s"], emulator["end"]["uncertainty_s"]))
