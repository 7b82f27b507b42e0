"""Per-run overhead and the samplers' cost through the run path, on the local testbed (holds its lock).

Printed:

- wall time per run / iperf3 duration for 10 s runs through the campaign engine (probe, link when
  changed, server, contention, client, verify, atomic record), unsampled (goal <= 1.25) and sampled every
  10 ms with the vCPU trace and the queue sampler as the demo's sampled runs are (goal <= 1.5), every check
  kept (issue 35 item 10);
- a 10 s cubic run sampled every 10 ms by each sampler (bpf, netlink, ss), without and with a 25 % CPU
  share (10 ms timeslice), as a campaign runs it: samples, missed ticks, guest CPU per sample and the
  achieved interval (median, p99, longest gap) from the run record (benchmarks/sampling.py compares the
  samplers side by side, with the perturbation).

``BBRLAB_BENCH_RUNS`` (default 3) sets how many overhead runs; ``BBRLAB_TESTBED`` the testbed name.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

DURATION_S = 10
GOAL_RATIO = {False: 1.25, True: 1.5}  # unsampled, sampled


def _overhead(tb, n_runs: int, sampled: bool = False) -> list[float]:
    from bbrlab.campaign.loop import run_campaign
    from bbrlab.campaign.options import CampaignOptions
    from bbrlab.campaign.spec import CampaignSpec
    from bbrlab.run.runner import Runner

    spec = CampaignSpec.from_dict({
        "name": "bench-overhead", "testbed": tb.name, "ccas": ["cubic"], "timeslices_ms": [10],
        "cpu_shares_pct": [100], "rtts_ms": [20], "rates_mbit": [100], "repetitions": n_runs,
        "duration_s": DURATION_S, "order": "sequential", "max_attempts": 1,
        **({"sample_ms": 10, "sampler": "bpf"} if sampled else {}),
    })
    walls: list[float] = []
    runner = Runner(tb)
    with tempfile.TemporaryDirectory(prefix="bbrlab-bench-") as out:
        last = [time.monotonic()]

        def on_run(record: dict) -> None:
            now = time.monotonic()
            walls.append(now - last[0])
            last[0] = now
            phases = record["metadata"].get("timing", {})
            print(f"  run {len(walls)}: {record['status']:6s} wall {walls[-1]:6.2f} s  ratio "
                  f"{walls[-1] / DURATION_S:.3f}  phases {phases}", flush=True)

        try:
            run_campaign(spec, Path(out), runner, options=CampaignOptions(progress=False), on_run=on_run)
        finally:
            runner.close()
    return walls


def _sampler(tb, share_pct: float, kind: str) -> dict:
    from bbrlab.run.runner import run_once
    from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

    scenario = Scenario(Link(rtt_ms=20, rate_mbit=100), Contention(10, share_pct),
                        Flow("cubic", IperfParams(duration_s=10), sample_ms=10, sampler=kind))
    with tempfile.TemporaryDirectory(prefix="bbrlab-bench-") as out:
        record = run_once(tb, scenario, out)
    if record["status"] != "ok":
        raise RuntimeError(f"sampled run failed: {record['reason']}")
    return record["metadata"]["sampling"] | {"throughput_mbit": record["metadata"]["iperf"]["receiver_mbit"]}


def main() -> None:
    import bbrlab.testbed as tbmod

    name = os.environ.get("BBRLAB_TESTBED", "local")
    n_runs = int(os.environ.get("BBRLAB_BENCH_RUNS", "3"))
    with tbmod.testbed_lock(name):
        tb = tbmod.up(name, progress=False)
        try:
            for sampled in (False, True):
                kind = "sampled (bpf every 10 ms, vCPU trace, queue)" if sampled else "unsampled"
                print(f"per-run overhead: {n_runs} x {DURATION_S} s cubic runs, {kind}, testbed {name} "
                      f"({tb.accelerator}), same link for all (set once)")
                walls = _overhead(tb, n_runs, sampled)
                steady = sorted(walls[1:] or walls)
                print(f"wall/duration {kind}: first run {walls[0] / DURATION_S:.3f} (sets the link), following "
                      f"runs median {steady[len(steady) // 2] / DURATION_S:.3f} (goal <= {GOAL_RATIO[sampled]})")
            for share in (100, 25):
                for kind in ("bpf", "netlink", "ss"):
                    s = _sampler(tb, share, kind)
                    iv = s["interval"]
                    print(f"{kind:7s} sampler asked 10 ms, cpu share {share} %: {s['samples']} samples, "
                          f"{s['missed_ticks']} ticks missed, CPU {s['cpu_per_sample_ms']:.3f} ms per sample, "
                          f"achieved interval median {iv['median_ms']:.1f} ms, p99 {iv['p99_ms']:.1f} ms, longest "
                          f"gap {iv['longest_gap_ms']:.1f} ms; throughput {s['throughput_mbit']:.1f} Mbit/s")
        finally:
            tb.close()


if __name__ == "__main__":
    main()
