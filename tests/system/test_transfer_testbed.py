"""rsync over SSH on the local testbed, for real: the sender VM copies a file through the emulator (netem, tbf)
to an sshd started for the run in the receiver's network namespace.

- At 0 % loss, under a deadline policy and with the socket sampler, the copy completes; the file's sha256
  is the same on both ends (the sender's file hashed again now, the receiver's copy when it arrived); the
  SSH connection's socket and ss both say it carried the asked congestion control; the emulator counted
  the copy's packets (so it went through the experiment link, not the management network).
- A small campaign at 30 % loss runs both workloads end to end: the copy completes with equal checksums
  and netem dropped about 30 % of the data packets.
- A copy that outlives ``transfer_timeout_s`` is a result: ok, timed out, the bytes that did arrive.
- While the experiment link loses 50 % and a copy crawls across it, the testbed's management SSH answers.
- A bad ``file_mb``, a loss of 60 % and an unknown workload are refused before anything changes.
- SIGTERM while a copy runs stops both ends (sshd, rsync, ssh) and restores the testbed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from bbrlab.campaign import loop as campaign
from bbrlab.campaign import spec as campaign_spec
from bbrlab.campaign.options import CampaignOptions
from bbrlab.contention.deadline import show_policies
from bbrlab.core.hosts import SSHHost
from bbrlab.link import emulator as link
from bbrlab.run.runner import Runner, run_once
from bbrlab.scenario.scenario import Contention, Flow, Link, RsyncParams, Scenario
from tests.stalls import run_once_as_a_campaign_would

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

pytestmark = [pytest.mark.system, pytest.mark.testbed]

BBRLAB = str(Path(sys.executable).with_name("bbrlab"))


def _rsync(cca: str, file_mb: float, timeout_s: float, **kw) -> Flow:
    return Flow(cca, RsyncParams(file_mb=file_mb, transfer_timeout_s=timeout_s), **kw)


def _sender_sha256(testbed, path: str) -> str:
    return testbed.sender.host.output(["sha256sum", path], timeout=300).split()[0]


def test_copy_at_no_loss_arrives_whole_through_the_experiment_link(testbed, tmp_path):
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=20), Contention(10, 50), _rsync("bbr", 4, 120, sample_ms=200, sampler="ss"))
    rec, run_dir = run_once_as_a_campaign_would(testbed, scenario, tmp_path / "run")
    assert rec["status"] == "ok", rec["reason"]
    meta = rec["metadata"]
    t = meta["transfer"]
    assert t["completed"] and not t["timed_out"] and t["bytes_delivered"] == 4_000_000
    assert t["checksum_match"] and t["receiver_sha256"] == t["file_sha256"]
    assert _sender_sha256(testbed, f"/var/cache/bbrlab/transfer/random-{4_000_000}.bin") == t["receiver_sha256"]
    assert meta["cca"]["socket"] == "bbr" and meta["cca"]["ss_seen"] == ["bbr"]
    assert t["socket"]["local_port"] == meta["flow"]["client_ports"][0] and meta["sampling"]["rows"] > 0
    assert t["ssh"]["cipher"] and t["ssh"]["kex"]
    assert (meta["flow"]["receiver_user"], meta["flow"]["receiver_user_note"]) == ("bbrlab-rx", None)
    assert meta["flow"]["receiver_caps"] == []  # rrsync behind sshd keeps no capability
    assert 0 < t["goodput_mbit"] <= 20 and t["completion_s"] == t["elapsed_s"] > 0
    assert meta["contention"]["evidence"]["policy_held"]
    assert meta["link"]["loss"]["entered"] >= 4_000_000 / 1500  # every data packet crossed the emulator
    written = {p.name for p in run_dir.iterdir()}
    assert {"transfer.json", "rsync.log", "ss.log"} <= written and "iperf.json" not in written


def test_both_workloads_at_30_pct_loss_end_to_end(testbed, tmp_path):
    spec = campaign_spec.CampaignSpec.from_dict({
        "name": "loss30", "ccas": ["bbr"], "timeslices_ms": [10], "cpu_shares_pct": [100], "rtts_ms": [20],
        "rates_mbit": [20], "losses_pct": [30], "workloads": ["iperf3", "rsync"], "file_mb": 0.3,
        "transfer_timeout_s": 300, "duration_s": 5, "repetitions": 1, "max_attempts": 1})
    runner = Runner(testbed)
    try:
        status = campaign.run_campaign(spec, tmp_path, runner, options=QUIET)
    finally:
        runner.close()
    failed = [json.loads(p.read_text())["reason"] for p in tmp_path.glob("failed/*/record.json")]
    assert status.done == 2, failed
    records = {r["scenario"]["flow"].get("workload", "iperf3"): r
               for r in (json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/record.json"))}
    t = records["rsync"]["metadata"]["transfer"]
    assert t["completed"] and t["checksum_match"] and t["bytes_delivered"] == 300_000
    for r in records.values():
        loss = r["metadata"]["link"]["loss"]
        assert loss["configured_fraction"] == 0.3 and loss["netem_dropped"] > 0  # and within 5 sigma: the run checks it
    assert records["iperf3"]["metadata"]["cca"]["iperf_sender"] == "bbr"
    assert records["rsync"]["metadata"]["cca"]["socket"] == "bbr"


def test_a_copy_past_its_timeout_is_recorded_as_timed_out(testbed, tmp_path):
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=2), Contention(10, 100), _rsync("cubic", 4, 8))
    rec = run_once(testbed, scenario, tmp_path)
    assert rec["status"] == "ok", rec["reason"]
    t = rec["metadata"]["transfer"]
    assert t["timed_out"] and not t["completed"] and t["completion_s"] is None and t["checksum_match"] is None
    assert 0 < t["bytes_delivered"] < 4_000_000  # 8 s at 2 Mbit/s cannot carry 4 MB
    assert t["elapsed_s"] >= 8 and t["goodput_mbit"] == pytest.approx(t["bytes_delivered"] * 8 / t["elapsed_s"] / 1e6)
    assert rec["metadata"]["cca"]["socket"] == "cubic"


def _management_round_trips(testbed, stop: threading.Event, seconds: list[float]) -> None:
    """A fresh SSH connection to each VM's management port, one command, timed; until ``stop``."""
    while not stop.is_set():
        for role in (testbed.sender, testbed.emulator):
            h = role.host
            fresh = SSHHost(name=f"{role.name}-mgmt", address=h.address, port=h.port, key_path=h.key_path,
                            known_hosts=h.known_hosts, connect_timeout_s=30)
            t0 = time.monotonic()
            try:
                assert fresh.output(["echo", "alive"], timeout=30) == "alive"
            finally:
                fresh.close()
            seconds.append(time.monotonic() - t0)


def test_management_ssh_answers_while_the_experiment_link_loses_half_its_packets(testbed, tmp_path):
    """The copy crawls for at most 12 s: the test asserts that the management SSH answers while it does, not how
    far the copy gets; four round trips take a few seconds of the run's 20 s or more."""
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=20, loss_model="uniform", loss_pct=50), Contention(10, 100),
                        _rsync("cubic", 2, 12))
    stop, seconds, errors = threading.Event(), [], []

    def probe():
        try:
            _management_round_trips(testbed, stop, seconds)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        rec = run_once(testbed, scenario, tmp_path)
    finally:
        stop.set()
        prober.join(timeout=120)
    assert not errors, errors
    assert rec["status"] == "ok", rec["reason"]
    assert rec["metadata"]["link"]["loss"]["configured_fraction"] == 0.5
    assert rec["metadata"]["transfer"]["bytes_delivered"] < 2_000_000 or rec["metadata"]["transfer"]["completed"]
    assert len(seconds) >= 4, seconds
    assert max(seconds) < 20, seconds  # TCG guests on a busy machine answer in seconds; the lossy link adds nothing


def _qdiscs(testbed) -> dict:
    shown = link.show(testbed.emulator.host, testbed.emulator.ports)
    keys = ("kind", "handle", "parent", "root", "options")
    return {ifname: [{k: q.get(k) for k in keys} for q in qdiscs] for ifname, qdiscs in shown.items()}


@pytest.mark.parametrize("over, field", [
    ({"workloads": ["rsync"], "file_mb": 0}, "file_mb"),
    ({"workloads": ["rsync"], "losses_pct": [0, 60]}, "losses_pct[1]"),
    ({"workloads": ["iperf3", "scp"]}, "workloads[1]"),
])
def test_bad_transfer_spec_refused_before_anything_changes(testbed, tmp_path, over, field):
    before, threads = _qdiscs(testbed), testbed.sender.vcpu_threads()
    policies = show_policies(testbed.sender.hypervisor, threads)
    spec = {"name": "bad-transfer", "testbed": testbed.name, "ccas": ["bbr"], "timeslices_ms": [10],
            "cpu_shares_pct": [25], "rtts_ms": [20], "rates_mbit": [20], "repetitions": 1, **over}
    path, out = tmp_path / "bad.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(spec))
    res = subprocess.run([BBRLAB, "campaign", "run", str(path), "--out", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1 and f"{field} = " in res.stderr, res.stderr
    assert not out.exists()
    assert _qdiscs(testbed) == before and show_policies(testbed.sender.hypervisor, threads) == policies
    leftovers = testbed.sender.host.output(["sh", "-c", "ls -d /tmp/bbrlab-rsync.* 2>/dev/null; exit 0"])
    assert leftovers == ""


def _local_rsync_dirs() -> set[str]:
    return {str(p) for p in Path(tempfile.gettempdir()).glob("bbrlab-rsync-*")}


def test_sigterm_mid_copy_stops_both_ends_and_restores_the_testbed(testbed, tmp_path):
    """``bbrlab campaign run`` is signalled while a copy crawls (under a deadline policy): the receiver's sshd,
    the sender's rsync and ssh, their private directories, the policy and the qdiscs are all gone after. The stop
    does not wait for the copy in flight (tests/system/test_ssh_interrupt_testbed.py): this test took 62 s when it
    did, 28 s since."""
    import signal

    spec = {"name": "sigterm-copy", "testbed": testbed.name, "ccas": ["cubic"], "timeslices_ms": [10],
            "cpu_shares_pct": [50], "rtts_ms": [20], "rates_mbit": [2], "workloads": ["rsync"], "file_mb": 8,
            "transfer_timeout_s": 120, "repetitions": 1, "max_attempts": 1}
    path, out = tmp_path / "spec.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(spec))
    local_before = _local_rsync_dirs()
    proc = subprocess.Popen([BBRLAB, "campaign", "run", str(path), "--out", str(out), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sender = testbed.sender.host
    try:
        deadline = time.monotonic() + 300
        while not sender.run(["pgrep", "-x", "rsync"], check=False, timeout=30).ok:  # the copy is under way
            assert proc.poll() is None, f"campaign ended early: {proc.communicate()}"
            assert time.monotonic() < deadline, "no rsync started within 300 s"
            time.sleep(0.5)
        # the client's key is on the sender only: its local copy was gone once copied (a SIGKILL leaves none)
        assert _local_rsync_dirs() <= local_before, _local_rsync_dirs() - local_before
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert not testbed.receiver.host.run(["ss", "-ltnH", "(", "sport", "=", ":5022", ")"]).stdout.strip()
    gone = time.monotonic() + 30  # the sender's client ends once the receiver's side is gone
    while sender.run(["pgrep", "-x", "rsync"], check=False, timeout=30).ok:
        assert time.monotonic() < gone, sender.output(["ps", "-eo", "pid,etimes,args"])
        time.sleep(1)
    assert sender.output(["sh", "-c", "ls -d /tmp/bbrlab-rsync.* 2>/dev/null; exit 0"]) == ""
    assert not any(link.is_ours(q) for qs in link.show(testbed.emulator.host, testbed.emulator.ports).values()
                   for q in qs)
    assert not any(p.is_deadline for p in show_policies(testbed.sender.hypervisor, testbed.sender.vcpu_threads()).values())
    assert not (out / "runs").exists() or not list((out / "runs").iterdir())
