"""The Dask campaign engine's overhead per run: dispatch to commit, across two worker processes.

A run function without a testbed (it writes one file and sleeps ``RUN_S``) runs ``N_RUNS`` planned runs on
two single-threaded workers. With perfect scheduling the campaign takes ``N_RUNS x RUN_S / 2``; what it
takes beyond that, per run, is the engine's overhead (submit, schedule, run the task, send the files back,
commit atomically with fsync). Printed as seconds per run and as a fraction of a paper run of 20 s
(goal: under 1 %).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

N_RUNS = 96
RUN_S = 0.2
PAPER_RUN_S = 20.0
GOAL_FRACTION = 0.01


def _spec():
    from bbrlab.campaign.spec import CampaignSpec

    return CampaignSpec.from_dict({"name": "bench-engine", "ccas": ["cubic", "bbr"], "timeslices_ms": [1, 10, 20],
                                   "cpu_shares_pct": [10, 25, 40, 55, 70, 100], "rtts_ms": [20], "rates_mbit": [50],
                                   "repetitions": N_RUNS // 36 + 1, "duration_s": 2})


def _trivial(scenario, staging, *, run_id, attempt):
    (staging / "iperf.json").write_text("{}")
    time.sleep(RUN_S)
    return {"bench": True}


def main() -> None:
    from distributed import Client

    from bbrlab.campaign import distributed as d
    from bbrlab.campaign.options import CampaignOptions

    spec = _spec()
    runs = len(spec.plan())
    with d.local_cluster(["bench-a", "bench-b"], run_function=_trivial) as cluster, Client(cluster) as client:
        d.wait_for_workers(client, 2)
        with tempfile.TemporaryDirectory(prefix="bbrlab-bench-engine-") as out:
            t0 = time.monotonic()
            st = d.run_campaign_distributed(spec, Path(out), client, options=CampaignOptions(progress=False))
            wall = time.monotonic() - t0
    ideal = runs * RUN_S / 2
    per_run = (wall - ideal) / runs * 2  # each worker's share of the excess, per run it ran
    print(f"{runs} runs of {RUN_S:g} s on 2 workers: {wall:.2f} s (ideal {ideal:.2f} s), done {st.done}")
    print(f"engine overhead per run (dispatch to commit): {per_run * 1000:.1f} ms = "
          f"{100 * per_run / PAPER_RUN_S:.3f} % of a {PAPER_RUN_S:g} s run (goal < {100 * GOAL_FRACTION:g} %)")


if __name__ == "__main__":
    main()
