"""The emulator's bottleneck sampler: its log parsed, the bottleneck qdisc found from the tree it shows, the
``bottleneck`` table aligned to this machine's clock, the flow option validated, and the C sampler built and run
for real against this machine's loopback interface (its qdisc is noqueue: the dump still answers)."""

from __future__ import annotations

import json
import subprocess

import pytest

from bbrlab.analysis import records_reader
from bbrlab.analysis.tables import BOTTLENECK_COLUMNS, RunRows, build_tables
from bbrlab.core import recordjson
from bbrlab.core.errors import ValidationError
from bbrlab.run.clocks import ClockDrift
from bbrlab.sampling import bottleneck
from bbrlab.sampling.sockdiag import build
from bbrlab.scenario.scenario import Flow

# bbrlab's tree: netem 1: at the root, tbf 2: below it; two samples 5 ms apart
LOG = """# bbrlab-qdisc-sampler format=1 interval_ns=5000000 stop_after_s=36 ifname=eth2 ifindex=3 pid=7 t0_ns=1
# ready cpu_user_us=100 cpu_sys_us=200
Q 1700000000000000000 00010000 ffffffff netem 1000 10 0 0 0 3000 2
Q 1700000000000000000 00020000 00010001 tbf 900 9 1 40 0 150000 100
Q 1700000000005000000 00010000 ffffffff netem 2000 20 0 0 0 3000 2
Q 1700000000005000000 00020000 00010001 tbf 1800 18 4 80 0 250000 166
# end samples=2 ticks=3 missed=1 cpu_user_us=1100 cpu_sys_us=900 maxrss_kb=1000 wall_ns=10000000 reason=stop_file
"""


def test_the_log_parses_into_one_row_per_qdisc_and_sample():
    rows = bottleneck.parse_log(LOG)
    assert len(rows) == 4
    tbf = rows[3]
    assert (tbf.t_s, tbf.handle, tbf.parent, tbf.kind) == (1700000000.005, "2:", "1:1", "tbf")
    assert (tbf.bytes, tbf.packets, tbf.drops, tbf.overlimits, tbf.backlog_bytes, tbf.qlen_packets) == \
        (1800, 18, 4, 80, 250000, 166)
    assert rows[0].parent == "root"


def test_a_malformed_line_is_named():
    with pytest.raises(ValueError, match="line 2"):
        bottleneck.parse_log("# x\nQ 1 2 3\n")


def test_the_footer_gives_cost_samples_and_missed_ticks():
    s = bottleneck.summary(LOG, 5)
    assert s.samples == 2 and s.missed == 1 and s.reason == "stop_file"
    assert s.cpu_s == pytest.approx(0.002) and s.cpu_per_sample_us == pytest.approx(1000)
    assert s.samples_per_s == pytest.approx(200) and s.qdiscs == [] and s.binary is None
    assert bottleneck.summary("no footer", 5) is None


def test_the_bottleneck_is_tbf_in_bbrlabs_tree_and_netem_in_the_authors():
    assert bottleneck.bottleneck_handle(bottleneck.parse_log(LOG)) == "2:"
    authors = ("Q 1000000000 00010000 ffffffff tbf 0 0 0 0 0 0 0\n"
               "Q 1000000000 000a0000 00010001 netem 0 0 0 0 0 0 0\n")
    assert bottleneck.bottleneck_handle(bottleneck.parse_log(authors)) == "a:"
    assert bottleneck.bottleneck_handle(bottleneck.parse_log("Q 1 00010000 ffffffff netem 0 0 0 0 0 0 0\n")) is None


def test_bottleneck_rows_are_put_on_this_machines_clock():
    # the emulator's clock runs 2 s ahead, 0.3 ms uncertain, no drift
    off = {"offset_s": 2.0, "uncertainty_s": 3e-4, "round_trip_s": 6e-4, "exchanges": 20}
    clock = {"start": {**off, "measured_at": 1699999990.0}, "end": {**off, "measured_at": 1700000010.0}}
    rows = records_reader.bottleneck_rows("r1", LOG, ClockDrift.from_dict(clock))
    assert [r["t_host_s"] for r in rows] == pytest.approx([1699999998.0, 1699999998.0, 1699999998.005,
                                                           1699999998.005])
    assert [r["bottleneck"] for r in rows] == [False, True, False, True]
    assert rows[3]["t_s"] == pytest.approx(0.005) and rows[3]["align_uncertainty_ms"] == pytest.approx(0.3)
    t = build_tables([RunRows({"run_id": "r1", "status": "ok"}, [], [], [], bottleneck=rows)])
    assert list(t.bottleneck.columns) == list(BOTTLENECK_COLUMNS)
    assert t.bottleneck["backlog_bytes"].dtype == "Int64" and len(t.bottleneck) == 4
    assert records_reader.bottleneck_rows("r1", LOG, None)[0]["t_host_s"] is None


def test_the_flow_option_defaults_on_for_sampled_runs_and_is_validated():
    assert Flow("cubic", sample_ms=10).bottleneck_interval_ms == 5
    assert Flow("cubic").bottleneck_interval_ms is None
    assert Flow("cubic", sample_ms=10, bottleneck_ms=0).bottleneck_interval_ms is None
    assert Flow("cubic", bottleneck_ms=20).bottleneck_interval_ms == 20
    assert "bottleneck_ms" not in Flow("cubic", sample_ms=10).to_dict()  # run ids of existing flows unchanged
    assert Flow.from_dict(Flow("cubic", bottleneck_ms=20).to_dict()).bottleneck_ms == 20
    for bad in (-1, 1001, 2.5, True, "often"):
        with pytest.raises(ValidationError, match="flow.bottleneck_ms"):
            Flow("cubic", bottleneck_ms=bad)


def test_sampler_arguments_are_checked_naming_the_field():
    with pytest.raises(ValidationError, match="ifname"):
        bottleneck.sampler_argv("/x", 5, 30, "/stop", "eth0; reboot")
    with pytest.raises(ValidationError, match="bottleneck_ms"):
        bottleneck.sampler_argv("/x", 0, 30, "/stop", "eth0")


def test_the_c_sampler_dumps_this_machines_loopback_qdisc(tmp_path):
    binary = build("qdisc")
    stop = tmp_path / "stop"
    p = subprocess.run([str(binary.path), "-i", "5000", "-t", "1", "-s", str(stop), "-n", "lo"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    rows = bottleneck.parse_log(p.stdout)
    summary = bottleneck.summary(p.stdout, 5)
    assert summary.reason == "deadline" and summary.samples >= 100
    assert len(rows) >= summary.samples and rows[0].parent == "root"
    gaps = sorted(b.t_s - a.t_s for a, b in zip(rows, rows[1:], strict=False) if b.t_s > a.t_s)
    assert gaps[len(gaps) // 2] == pytest.approx(0.005, abs=0.001)
    bad = subprocess.run([str(binary.path), "-i", "5000", "-t", "1", "-s", str(stop), "-n", "nosuchif0"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 3 and "no interface nosuchif0" in bad.stdout
    json.dumps(recordjson.to_json(summary))  # the record's JSON


def test_a_campaign_spec_passes_bottleneck_ms_to_its_flows_and_checks_it():
    from bbrlab.campaign.spec import CampaignSpec

    base = {"name": "q", "ccas": ["cubic"], "timeslices_ms": [10], "cpu_shares_pct": [100], "rtts_ms": [20],
            "rates_mbit": [100], "repetitions": 1, "sample_ms": 10}
    assert {s.flow.bottleneck_interval_ms for s in CampaignSpec.from_dict(base).plan()} == {5}
    assert {s.flow.bottleneck_ms for s in CampaignSpec.from_dict({**base, "bottleneck_ms": 0}).plan()} == {0}
    with pytest.raises(ValidationError, match="bottleneck_ms"):
        CampaignSpec.from_dict({**base, "bottleneck_ms": "sometimes"})
