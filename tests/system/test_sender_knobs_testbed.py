"""Module parameters and sender sysctls as dimensions (issue #38), for real on the suite's local testbed (Debian 6.1
sender guest under TCG, bbr2b loaded by `testbed up`): a campaign's one run of bbr2b with deficit_gain 512 and
tcp_limit_output_bytes 262144, neither its default, records what it asked and read back, its probe saw the values
set, and the sender holds its own values again afterwards; a run whose body fails, or that names a parameter the
module lacks, leaves them as they were, and the campaign's preflight refuses that name before any run.
"""

from __future__ import annotations

import json

import pytest

from bbrlab.analysis import data
from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.preflight import check_knobs
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.run import senderknobs
from bbrlab.run.runner import Runner
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario

pytestmark = [pytest.mark.system, pytest.mark.testbed]

GAIN = "/sys/module/bbr2b/parameters/deficit_gain"
LIMIT_NAME = "net.ipv4.tcp_limit_output_bytes"
LIMIT = "/proc/sys/net/ipv4/tcp_limit_output_bytes"


def _values(host) -> list[str]:
    """deficit_gain and tcp_limit_output_bytes as the sender holds them now."""
    return host.output(["cat", GAIN, LIMIT], timeout=30).split()


def test_a_campaign_run_sets_reads_back_records_and_restores_a_parameter_and_a_sysctl(testbed, tmp_path):
    host = testbed.sender.host
    before = _values(host)
    assert before != ["512", "262144"], before
    spec = CampaignSpec.from_dict({
        "name": "knobs", "testbed": testbed.name, "ccas": ["bbr2b"], "timeslices_ms": [10], "cpu_shares_pct": [100],
        "rtts_ms": [20], "rates_mbit": [50], "repetitions": 1, "duration_s": 2, "max_attempts": 2,
        "cca_params": {"bbr2b": {"deficit_gain": [512]}}, "sender_sysctls": {LIMIT_NAME: [262144]}})
    runner = Runner(testbed)
    try:
        campaign.run_campaign(spec, tmp_path, runner, options=CampaignOptions(progress=False))
    finally:
        runner.close()
    (path,) = sorted((tmp_path / "runs").glob("*/record.json"))
    record = json.loads(path.read_text())
    assert record["status"] == "ok", record["reason"]
    meta = record["metadata"]
    print(f"knobs={meta['knobs']} sender_knobs_s={meta['timing']['sender_knobs_s']} "
          f"restore_s={meta['timing']['restore_s']} run_wall_s={meta['timing']['run_wall_s']}")
    assert meta["knobs"] == {"module": "bbr2b",
                             "params": {"deficit_gain": {"asked": 512, "before": before[0], "read": "512"}},
                             "sysctls": {LIMIT_NAME: {"asked": 262144, "before": before[1], "read": "262144"}}}
    assert meta["module"]["params"]["deficit_gain"] == 512  # the probe, after the values were set, saw them
    assert meta["sysctls"]["sender"][LIMIT_NAME] == "262144"
    assert meta["cca"]["iperf_sender"] == "bbr2b"
    assert record["scenario"]["cca_params"] == {"deficit_gain": 512}
    assert record["scenario"]["sender_sysctls"] == {LIMIT_NAME: 262144}
    assert record["run_id"].startswith("bbr2b-deficit_gain512-") and "-limit_output_bytes262144-r00-" in record["run_id"]
    assert _values(host) == before  # restored
    runs = data.load(tmp_path, cache=False).runs
    assert list(runs["cca_params"]) == ["deficit_gain=512"]
    assert list(runs["sender_sysctls"]) == [f"{LIMIT_NAME}=262144"]


def test_a_failing_body_and_an_unknown_parameter_leave_the_sender_as_it_was(testbed):
    host = testbed.sender.host
    before = _values(host)
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(10, 100), Flow("bbr2b"),
                        cca_params={"deficit_gain": 600}, sender_sysctls={LIMIT_NAME: 131072})
    with pytest.raises(RuntimeError, match="the run broke"):
        with senderknobs.held(host, scenario):
            assert _values(host) == ["600", "131072"]
            raise RuntimeError("the run broke")
    assert _values(host) == before
    typo = Scenario(scenario.link, scenario.contention, scenario.flow,
                    cca_params={"deficit_gain": 600, "deficit_gian": 1}, sender_sysctls={LIMIT_NAME: 131072})
    with pytest.raises(senderknobs.SenderKnobsError, match="module bbr2b has no parameter deficit_gian"):
        with senderknobs.held(host, typo):
            pytest.fail("the block ran")
    assert _values(host) == before
    spec = CampaignSpec.from_dict({
        "name": "typo", "ccas": ["bbr2b"], "timeslices_ms": [10], "cpu_shares_pct": [100], "rtts_ms": [20],
        "rates_mbit": [50], "cca_params": {"bbr2b": {"deficit_gian": [1]}}})
    with pytest.raises(ValidationError, match="cca_params.bbr2b.deficit_gian"):
        check_knobs(spec, testbed)  # the campaign's preflight refuses it before its first run
    check_knobs(CampaignSpec.from_dict({**spec.to_dict(), "cca_params": {"bbr2b": {"deficit_gain": [1]}},
                                        "sender_sysctls": {LIMIT_NAME: [1]}}), testbed)
    assert _values(host) == before
