"""A campaign over three sender kernels on the local testbed: the plan keeps each kernel's runs together, the
sender boots once per kernel block (and only the sender), and every record says which kernel carried it,
taken from the running sender (release, boot) and from the testbed (origin, package)."""

from __future__ import annotations

import json

import pytest

from bbrlab.campaign import loop as campaign
from bbrlab.campaign import spec as campaign_spec
from bbrlab.campaign.options import CampaignOptions
from bbrlab.run.runner import Runner

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

pytestmark = [pytest.mark.system, pytest.mark.testbed]

KERNELS = ["debian-5.10", "debian-6.12", "debian-6.1"]
RELEASE = {"debian-5.10": "5.10.", "debian-6.12": "6.12.", "debian-6.1": "6.1."}


# Three sender kernels in one campaign take two minutes; make test boots the sender into other kernels in
# test_sender_kernel_testbed.py, and this campaign runs with make test-slow.
@pytest.mark.slow
def test_three_kernels_one_sender_boot_per_block(testbed, tmp_path):
    import bbrlab.testbed as tbmod

    spec = campaign_spec.CampaignSpec.from_dict({
        "name": "kernels", "testbed": testbed.name, "kernels": KERNELS, "ccas": ["cubic", "bbr"],
        "timeslices_ms": [1], "cpu_shares_pct": [100], "rtts_ms": [20], "rates_mbit": [50], "repetitions": 1,
        "duration_s": 2, "max_attempts": 1})
    tbmod.check_campaign_kernels(testbed, spec.kernels, spec.ccas)
    emulator_pid = testbed.local.qemu_pids["emulator"]
    runner = Runner(testbed)
    try:
        st = campaign.run_campaign(spec, tmp_path, runner, options=QUIET)
    finally:
        runner.close()
        tbmod.up(testbed.name, kernel="debian-6.1", progress=False)  # the session's testbed as it was
    assert (st.done, st.failed_attempts) == (6, 0)
    plan = [r["run_id"] for r in json.loads((tmp_path / "plan.json").read_text())["runs"]]
    records = [json.loads((tmp_path / "runs" / r / "record.json").read_text()) for r in plan]
    kernels_in_order = [r["scenario"]["kernel"] for r in records]
    assert kernels_in_order == [k for k in KERNELS for _ in range(2)]  # blocks, in the spec's order
    boots: dict[str, set] = {}
    for rec in records:
        m, kernel = rec["metadata"], rec["scenario"]["kernel"]
        assert m["kernel"]["name"] == kernel and m["kernel"]["origin"] == "debian" and m["kernel"]["package"]
        assert m["testbed"]["sender_kernel"].startswith(RELEASE[kernel]) == m["kernel"]["release"].startswith(
            RELEASE[kernel]) is True
        assert rec["run_id"].startswith(kernel + "-")
        if rec["scenario"]["flow"]["cca"] == "bbr":
            assert (m["cca"]["bbr_version"], m["cca"]["patched"]) == (1, False)
        boots.setdefault(kernel, set()).add(m["testbed"]["sender_boot_id"])
    assert all(len(ids) == 1 for ids in boots.values()), boots  # one boot per kernel block
    assert len(set().union(*boots.values())) == 3
    assert tbmod.load(testbed.name).local.qemu_pids["emulator"] == emulator_pid  # only the sender rebooted
