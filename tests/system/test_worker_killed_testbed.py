"""A Dask worker SIGKILLed during a real contended run on the local testbed (issue 35; the engine tests kill
workers running stand-in run functions only): the campaign loses and duplicates nothing, and the testbed is
restored by the worker the Nanny starts in its place (no deadline policy left on the sender's vCPU threads).

One testbed, one worker: the worker's plugin takes the testbed's lock under this session's (a descendant of
the holder does not wait for it, bbrlab.testbed.lock)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from bbrlab.campaign.options import CampaignOptions
from bbrlab.contention.deadline import show_policies

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

pytestmark = [pytest.mark.system, pytest.mark.testbed]

SPEC = {"name": "worker-killed", "ccas": ["cubic"], "timeslices_ms": [10], "cpu_shares_pct": [50], "rtts_ms": [20],
        "rates_mbit": [50], "repetitions": 2, "duration_s": 3, "max_attempts": 2, "seed": 1}


def _deadline_threads(testbed) -> list[int]:
    return [tid for tid, p in show_policies(testbed.sender.hypervisor, testbed.sender.vcpu_threads()).items()
            if p.is_deadline]


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/record.json"))]


def test_a_worker_killed_during_a_contended_run_loses_nothing_and_the_testbed_is_restored(testbed, tmp_path):
    from distributed import Client

    from bbrlab.campaign import distributed as d
    from bbrlab.campaign.spec import CampaignSpec

    assert _deadline_threads(testbed) == []
    spec = CampaignSpec.from_dict({**SPEC, "testbed": testbed.name})
    out = tmp_path / "campaign"
    killed: dict = {}
    with d.local_cluster([testbed.name]) as cluster, Client(cluster) as client:
        d.wait_for_workers(client, 1)
        (address,) = d.testbed_workers(client)
        pid = client.run(os.getpid, workers=[address])[address]

        def kill_under_deadline() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not killed:
                under = _deadline_threads(testbed)
                if under:  # the run is contended now: its policy is on the vCPU threads
                    os.kill(pid, signal.SIGKILL)
                    killed.update(pid=pid, threads=under)
                    return
                time.sleep(0.1)

        killer = threading.Thread(target=kill_under_deadline)
        killer.start()
        try:
            st = d.run_campaign_distributed(spec, out, client, options=QUIET)
        finally:
            killer.join()
        workers_after = client.run(os.getpid)
    assert killed, "no run was seen under its deadline policy"
    records = _records(out)
    plan = json.loads((out / "plan.json").read_text())
    assert sorted(r["run_id"] for r in records) == sorted(r["run_id"] for r in plan["runs"])  # each once
    failed = [json.loads(p.read_text())["reason"] for p in sorted(out.glob("failed/*/record.json"))]
    assert st.done == 2 and all(r["status"] == "ok" for r in records) and failed == []  # the killed run ran again
    assert all(r["metadata"]["contention"]["evidence"]["policy_held"] is True for r in records)
    assert pid not in workers_after.values()  # the Nanny's new worker ran the runs after the kill
    assert _deadline_threads(testbed) == []  # restored: the killed run's policy is off every vCPU thread
