"""Several flows in one run (issue #29): a BBR flow from the contended sender VM and a Cubic flow from the
uncontended competitor (a namespace bridged to the sender's side of the emulator), starting 3 s later, through
the same emulated bottleneck; both recorded, and Jain's index in the tables.

Runs on the suite's local testbed (Debian 6.1 sender guest under TCG); about 25 s of testbed time.
"""

from __future__ import annotations

import json

import pytest

from bbrlab.analysis import data
from bbrlab.run import record as rec
from bbrlab.run.runner import run_once
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario
from bbrlab.testbed.local import plumbing

pytestmark = [pytest.mark.system, pytest.mark.testbed]


def test_a_bbr_flow_and_a_later_cubic_competitor_share_the_bottleneck_and_are_both_recorded(testbed, tmp_path):
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=10), Contention(10, 100), Flow("bbr", IperfParams(duration_s=12)),
                        flows=[{"cca": "cubic", "origin": "competitor", "start_s": 3, "duration_s": 9}])
    run_dir = tmp_path / "c" / "runs" / scenario.run_id
    record = run_once(testbed, scenario, run_dir)
    assert record["status"] == "ok", record["reason"]
    (flow1,) = record["metadata"]["flows"]
    assert flow1["origin"] == "competitor" and flow1["iperf_sender"] == "cubic" and flow1["server_port"] == 5202
    assert 2.9 <= flow1["start_s"] <= 4.0, flow1
    competitor = json.loads((run_dir / "iperf-flow1.json").read_text())
    assert competitor["start"]["connected"][0]["local_host"] == plumbing.COMPETITOR_IP
    assert json.loads((run_dir / "iperf.json").read_text())["end"]["sender_tcp_congestion"] == "bbr"
    rec.write_file(run_dir / "record.json", json.dumps(record))

    t = data.load(tmp_path / "c")
    run = t.runs.iloc[0]
    print(f"jain_index={run['jain_index']:.3f} overlap_s={run['overlap_s']:.1f} "
          f"convergence_s={run['convergence_s']} shares={t.flows.set_index('cca')['share'].round(3).to_dict()} "
          f"throughput={t.flows.set_index('cca')['overlap_throughput_mbit'].round(2).to_dict()}")
    assert run["flows"] == 2 and 0.5 <= run["jain_index"] <= 1.0
    assert set(t.flows["origin"]) == {"sender", "competitor"}
    # both flows carried data through the 10 Mbit/s bottleneck while they overlapped, and together no more
    assert (t.flows["overlap_throughput_mbit"] > 0.5).all()
    assert t.flows["overlap_throughput_mbit"].sum() <= 10.5
    assert t.streams[t.streams["flow"] == 1]["t_start_s"].min() >= 2.9
