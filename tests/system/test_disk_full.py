"""Issue 35 item 8: a campaign whose disk fills ends with an error naming the directory and its free space, not
a traceback; every run recorded before stays whole and the run being written leaves nothing behind.

The campaign directory is a real tmpfs of 1 MiB mounted for the test (unmounted whatever happens); the run
function writes real files into its staging folder (no testbed: the disk is what is tested).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.run import record as rec
from tests.campaign_runs import run_metadata

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

pytestmark = pytest.mark.system

SPEC = {"name": "full", "ccas": ["cubic"], "timeslices_ms": [10], "cpu_shares_pct": [100], "rtts_ms": [20],
        "rates_mbit": [100], "repetitions": 12, "duration_s": 5}
RUN_BYTES = 200_000  # five runs fill the 1 MiB


@pytest.fixture
def small_disk(tmp_path) -> Path:
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "bbrlab-test-full", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def _run(fill_exactly: bool):
    """A run function writing ``RUN_BYTES`` of data; with ``fill_exactly``, once fewer than that are free it
    writes exactly what is free, so the run itself succeeds and its record is what does not fit."""
    def run(scenario, staging, *, run_id, attempt):
        free = shutil.disk_usage(staging).free
        size = free if fill_exactly and free < RUN_BYTES else RUN_BYTES
        (staging / "iperf.json").write_bytes(b"x" * size)
        return run_metadata(scenario)
    return run


@pytest.mark.parametrize("where", ["in the run", "in its record"])
def test_a_full_disk_ends_the_campaign_with_a_clear_error_and_keeps_every_recorded_run(small_disk, where):
    out = small_disk / "campaign"
    with pytest.raises(rec.DiskFull) as e:
        campaign.run_campaign(CampaignSpec.from_dict(SPEC), out, _run(where == "in its record"),
                              options=QUIET)
    message = str(e.value)
    assert str(out) in message and "free:" in message and "bytes" in message
    assert e.value.free_bytes is not None and e.value.free_bytes < RUN_BYTES
    done = sorted((out / rec.RUNS).iterdir())
    assert 1 <= len(done) < SPEC["repetitions"]
    for run_dir in done:  # each recorded run is whole
        assert json.loads((run_dir / rec.RECORD_FILE).read_text())["status"] == "ok"
        assert (run_dir / "iperf.json").stat().st_size == RUN_BYTES
    assert not (out / rec.FAILED).exists() or not any((out / rec.FAILED).iterdir())  # no attempt was spent
    assert not any((out / rec.TMP).iterdir())  # the run being written left nothing
    assert campaign.status(out).done == len(done)
