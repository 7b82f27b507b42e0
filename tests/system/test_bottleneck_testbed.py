"""The bottleneck queue sampled in the emulator, and the guests' clocks, during one sampled run on the local
testbed (issue 27): a Cubic flow at 100 Mbit/s into a 1 BDP buffer fills the queue until it overflows, the
emulator's sampler sees the backlog rise and the drops, the record carries both guests' clock offsets with
their uncertainty, and the sampler is gone afterwards."""

from __future__ import annotations

import pytest

from bbrlab.link import bottleneck as trees
from bbrlab.run.runner import run_once
from bbrlab.sampling import bottleneck
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

pytestmark = [pytest.mark.system, pytest.mark.testbed]


def test_a_cubic_run_fills_the_sampled_queue_and_records_both_clocks(testbed, tmp_path):
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=100), Contention(10, 100),
                        Flow("cubic", IperfParams(duration_s=6), sample_ms=10, sampler="netlink"))
    record = run_once(testbed, scenario, tmp_path)
    assert record["status"] == "ok", record["reason"]
    meta = record["metadata"]
    print("bottleneck", meta["bottleneck"])
    print("clocks", meta["clocks"])

    summary = meta["bottleneck"]
    assert summary["reason"] == "stop_file" and summary["interval_ms"] == 5
    assert summary["samples"] >= 6 * 200 * 0.5, summary  # at least half the 5 ms ticks of the 6 s transfer
    rows = bottleneck.parse_log((tmp_path / bottleneck.LOG_FILE).read_text())
    tbf = [r for r in rows if r.kind == "tbf"]  # bbrlab's tree: tbf's limit is the queue
    assert trees.queue_mode_of(meta["qdiscs"][testbed.emulator.ports[1]]) == "bbrlab"
    assert max(r.backlog_bytes for r in tbf) > 100_000, "the 250 kB queue never filled past 100 kB"
    assert max(r.backlog_bytes for r in tbf) <= 250_000 + 65_536  # tbf's limit, plus one aggregate
    assert tbf[-1].drops > tbf[0].drops, "Cubic overflowing 1 BDP dropped nothing at the bottleneck"
    assert tbf[-1].bytes > tbf[0].bytes + 6 * 100e6 / 8 * 0.5  # it sent at least half the link's 6 s

    for host in ("sender", "emulator"):
        for when in ("start", "end"):
            # Known to well within the 5 ms sample interval. The 1 ms target is measured by
            # benchmarks/clocks_bottleneck.py; under a loaded suite one exchange came to 1.006 ms.
            assert 0 < meta["clocks"][host][when]["uncertainty_s"] < 2.5e-3, meta["clocks"][host]
        assert meta["clocks"][host]["drift_ppm"] is not None

    left = testbed.emulator.host.output(["sh", "-c", "pgrep -x qdisc_sampler || true"])
    assert left == "", f"the qdisc sampler still runs in the emulator: pid {left}"
