"""A campaign with blocks on the local testbed (issue #36 item 3): each block runs on a fresh boot of the sender
(and, with ``block_reboot: sender+emulator``, of the emulator), and every record says its block and boot.

Both tests are in ``make test-slow``: ``make test`` checks one block's fresh sender boot in the README's demo
campaign (tests/system/test_testbed_hardening.py, the demo has ``blocks: 2``), and the block logic without a
testbed in tests/unit/campaign/test_blocks.py."""

from __future__ import annotations

import json

import pytest

from bbrlab.campaign import loop as campaign
from bbrlab.campaign import spec as campaign_spec
from bbrlab.campaign.options import CampaignOptions
from bbrlab.run.runner import Runner

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

pytestmark = [pytest.mark.system, pytest.mark.testbed]


def _campaign(testbed, tmp_path, **over) -> list[dict]:
    """Two blocks of one repetition of one point (the shortest transfer), run; the records in plan order."""
    spec = campaign_spec.CampaignSpec.from_dict({
        "name": "blocks", "testbed": testbed.name, "ccas": ["cubic"], "timeslices_ms": [1], "cpu_shares_pct": [100],
        "rtts_ms": [20], "rates_mbit": [50], "repetitions": 2, "blocks": 2, "duration_s": 1, "max_attempts": 1,
        **over})
    runner = Runner(testbed)
    try:
        st = campaign.run_campaign(spec, tmp_path, runner, options=QUIET)
    finally:
        runner.close()
    assert (st.done, st.failed_attempts) == (2, 0)
    plan = [r["run_id"] for r in json.loads((tmp_path / "plan.json").read_text())["runs"]]
    records = [json.loads((tmp_path / "runs" / r / "record.json").read_text()) for r in plan]
    for r in records:  # what a block's boot costs here (pytest -s shows it)
        timing = r["metadata"]["timing"]
        print(f"block {r['metadata']['block']['block']}: boot {timing.get('block_boot_s')} s, run "
              f"{timing.get('run_wall_s')} s, attempt {timing.get('attempt_wall_s')} s")
    return records


@pytest.mark.slow
def test_each_block_runs_on_a_fresh_sender_boot(testbed, tmp_path):
    """Two sender boots (``timing.block_boot_s``: 29.9 and 30.9 s under TCG here, 2026-11-28) and two 1 s
    transfers: about 75 s, nearly all of it the boots a block is about."""
    import bbrlab.testbed as tbmod

    emulator_pid = testbed.local.qemu_pids["emulator"]
    before = testbed.sender.host.output(["cat", "/proc/sys/kernel/random/boot_id"]).strip()
    records = _campaign(testbed, tmp_path)
    blocks = [r["metadata"]["block"] for r in records]
    assert [(b["block"], b["blocks"], b["fresh_boot"]) for b in blocks] == [(0, 2, True), (1, 2, True)]
    boots = [r["metadata"]["testbed"]["sender_boot_id"] for r in records]
    assert len(set(boots)) == 2 and before not in boots  # every block on a boot of its own, made for it
    assert all(r["metadata"]["timing"]["block_boot_s"] > 0 for r in records)
    assert records[0]["metadata"]["testbed"]["emulator_boot_id"] == records[1]["metadata"]["testbed"]["emulator_boot_id"]
    assert tbmod.load(testbed.name).local.qemu_pids["emulator"] == emulator_pid  # only the sender rebooted


@pytest.mark.slow
def test_blocks_can_boot_the_emulator_afresh_too(testbed, tmp_path):
    """``block_reboot: sender+emulator``: both VMs boot per block (49.8 and 51.3 s each under TCG: make test-slow)."""
    records = _campaign(testbed, tmp_path, block_reboot="sender+emulator")
    for key in ("sender_boot_id", "emulator_boot_id"):
        assert len({r["metadata"]["testbed"][key] for r in records}) == 2, key
    assert all(r["metadata"]["block"]["reboot"] == "sender+emulator" for r in records)
