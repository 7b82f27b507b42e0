"""A run function without a testbed, for exercising the Dask campaign engine with real worker processes.

It writes one file, waits ``BBRLAB_TEST_RUN_S`` seconds (default 0.3), names the process that ran it in
``ran.json`` and returns real metadata; ``python -m tests.engine_runs DIR`` drives a 12-run campaign on two such workers
(used by the driver-kill, driver-interrupt and listener tests; it prints ``started ADDRESS TLS_DIR`` once
the workers are up, and exits with status 128 + signal when interrupted).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec
from tests.campaign_runs import run_metadata

#: The file beside the run's record naming the process that ran it (``pid``): a run's metadata is a typed
#: RunMetadata, which has no such field.
RAN_FILE = "ran.json"

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output


def spec() -> CampaignSpec:
    return CampaignSpec.from_dict({"name": "engine", "ccas": ["cubic", "bbr"], "timeslices_ms": [1, 10],
                                   "cpu_shares_pct": [25, 50, 100], "rtts_ms": [20], "rates_mbit": [50],
                                   "repetitions": 1, "duration_s": 2, "max_attempts": 2})


def slow_run(scenario, staging, *, run_id, attempt):
    """Busy in Python code for ``BBRLAB_TEST_RUN_S`` (so a stop reaches it at once, as it reaches a real run);
    it leaves a file named after the run in ``BBRLAB_TEST_STARTED_DIR`` when it starts and in
    ``BBRLAB_TEST_STOPPED_DIR`` when it is stopped (its "restore")."""
    (staging / "iperf.json").write_text("{}")
    started = os.environ.get("BBRLAB_TEST_STARTED_DIR")
    if started:
        Path(started, f"{run_id}.a{attempt}").write_text(str(os.getpid()))
    end = time.monotonic() + float(os.environ.get("BBRLAB_TEST_RUN_S", "0.3"))
    try:
        while time.monotonic() < end:
            time.sleep(0.01)
    except BaseException:
        marks = os.environ.get("BBRLAB_TEST_STOPPED_DIR")
        if marks:
            Path(marks, f"{run_id}.a{attempt}").write_text(str(os.getpid()))
        raise
    (staging / RAN_FILE).write_text(json.dumps({"pid": os.getpid()}))
    return run_metadata(scenario)


def block_run(scenario, staging, *, run_id, attempt, block=None):
    """:func:`slow_run` that says which block the worker was handed (a :class:`~bbrlab.run.blockboot.BlockBoot`,
    or None) in ``metadata.block``, as the runner does."""
    from bbrlab.run.blockboot import BlockBoot

    metadata = slow_run(scenario, staging, run_id=run_id, attempt=attempt)
    assert block is None or isinstance(block, BlockBoot)
    from bbrlab.core import recordjson

    return {**metadata, "block": None if block is None else recordjson.to_json(block.record(False))}


def dying_run(scenario, staging, *, run_id, attempt):
    """:func:`slow_run`, except that the run named ``BBRLAB_TEST_DIE_RUN`` kills its worker process (as the
    kernel's OOM killer would), so Dask gives up on it with ``KilledWorker``."""
    if run_id == os.environ.get("BBRLAB_TEST_DIE_RUN"):
        os._exit(9)
    return slow_run(scenario, staging, run_id=run_id, attempt=attempt)


def hanging_run(scenario, staging, *, run_id, attempt):
    """:func:`slow_run`, except that the first attempt of the run named ``BBRLAB_TEST_HANG_RUN`` hangs holding
    the GIL (libc's ``sleep`` called without releasing it), so no Python runs in its worker any more, as in
    an interpreter deadlock; it leaves its pid in ``BBRLAB_TEST_STARTED_DIR`` first."""
    import ctypes

    if run_id == os.environ.get("BBRLAB_TEST_HANG_RUN") and attempt == 1:
        Path(os.environ["BBRLAB_TEST_STARTED_DIR"], f"{run_id}.a{attempt}").write_text(str(os.getpid()))
        libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL
        while True:
            libc.sleep(3600)
    return slow_run(scenario, staging, run_id=run_id, attempt=attempt)


def main(out: str) -> int:
    from distributed import Client

    from bbrlab.campaign import distributed as d
    from bbrlab.core.signals import Interrupted

    try:
        with d.local_cluster(["a", "b"], run_function=slow_run) as cluster, Client(cluster) as client:
            d.wait_for_workers(client, 2)
            print("started", cluster.scheduler_address, getattr(cluster, "tls_dir", ""), flush=True)
            d.run_campaign_distributed(spec(), Path(out), client, options=QUIET)
    except Interrupted as e:
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))


def inode_run(scenario, staging, *, run_id, attempt):
    """:func:`slow_run` that names where it wrote its file (``staged`` in :data:`RAN_FILE`: the directory and the
    file's inode): a run whose files reached ``runs/`` by a rename keeps that inode."""
    metadata = slow_run(scenario, staging, run_id=run_id, attempt=attempt)
    ran = json.loads((staging / RAN_FILE).read_text())
    staged = {"dir": str(staging), "inode": (staging / "iperf.json").stat().st_ino}
    (staging / RAN_FILE).write_text(json.dumps({**ran, "staged": staged}))
    return metadata
