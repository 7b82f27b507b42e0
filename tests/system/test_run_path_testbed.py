"""The run path on the local testbed: signals restore the testbed, failures say where they happened, a sender
that refuses the memoryless-TCP sysctl fails the run, and no per-run file sits at a predictable /tmp name.

Everything here runs for real: ``bbrlab campaign run`` as a subprocess signalled mid-transfer, SSH to a port
where nothing listens, a read-only bind mount over the sysctl inside the sender VM, symlinks planted in the
receiver's and the sender's /tmp.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bbrlab.analysis import records_reader
from bbrlab.campaign import directory
from bbrlab.campaign import loop as campaign
from bbrlab.campaign import spec as campaign_spec
from bbrlab.campaign.options import CampaignOptions
from bbrlab.contention.deadline import show_policies
from bbrlab.core import machine
from bbrlab.core.hosts import LocalHost, SSHHost
from bbrlab.link import emulator as link
from bbrlab.run import record, sender
from bbrlab.run.linkcheck import validate as validate_link
from bbrlab.run.runner import Runner, run_once
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

pytestmark = [pytest.mark.system, pytest.mark.testbed]

BBRLAB = str(Path(sys.executable).with_name("bbrlab"))
SYSCTL = "/proc/sys/net/ipv4/tcp_no_metrics_save"


def _deadline_on(testbed) -> bool:
    policies = show_policies(testbed.sender.hypervisor, testbed.sender.vcpu_threads())
    return any(p.is_deadline for p in policies.values())


def _bbrlab_qdiscs(testbed) -> dict:
    shown = link.show(testbed.emulator.host, testbed.emulator.ports)
    return {i: [q["kind"] for q in qs if link.is_ours(q)] for i, qs in shown.items() if any(map(link.is_ours, qs))}


def _leftover_dirs(testbed) -> str:
    """Private per-run directories left in the sender VM (ours alone; the receiver namespace shares this
    machine's /tmp with other testbeds' runs, so it is not checked this way)."""
    return testbed.sender.host.output(["sh", "-c", "ls -d /tmp/bbrlab-sampler.* /tmp/bbrlab-iperf3.* 2>/dev/null; exit 0"])


# SIGHUP takes the same path as SIGTERM (one handler for both); it runs with the slow tests to keep make test
# within its budget.
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_signal_mid_transfer_restores_the_testbed_and_resume_completes(testbed, tmp_path, sig):
    # One run: the signal ends it mid-transfer and the resume runs it again (a second run, about 20 s, showed no
    # more of the mechanism).
    spec = {"name": f"signal-{sig.name.lower()}", "testbed": testbed.name, "ccas": ["cubic"],
            "timeslices_ms": [1], "cpu_shares_pct": [25], "rtts_ms": [20], "rates_mbit": [50], "repetitions": 1,
            "duration_s": 8, "sample_ss_ms": 200, "max_attempts": 1}
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "campaign"
    argv = [BBRLAB, "campaign", "run", str(spec_path), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not _deadline_on(testbed):  # the first run's transfer is under way
            assert proc.poll() is None, f"campaign ended early: {proc.communicate()}"
            assert time.monotonic() < deadline, "no contended transfer started within 300 s"
            time.sleep(0.1)
        assert _bbrlab_qdiscs(testbed), "the link should be set while the transfer runs"
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, stderr[-2000:]
    assert f"interrupted by {sig.name}" in stderr and "resumes" in stderr
    assert not _deadline_on(testbed)
    assert _bbrlab_qdiscs(testbed) == {}
    assert _leftover_dirs(testbed) == ""
    assert not list((out / "runs").glob("*")) if (out / "runs").exists() else True
    assert not (out / "failed").exists()  # the interrupted run is not an attempt

    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    st = directory.status(out)
    assert (st.planned, st.done, st.failed_attempts) == (1, 1, 0)
    plan = json.loads((out / "plan.json").read_text())
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(r["run_id"] for r in plan["runs"])
    for path in (out / "runs").glob("*/record.json"):  # every phase of the run is timed: they add up to its wall
        timing = json.loads(path.read_text())["metadata"]["timing"]
        phases = sum(v for k, v in timing.items() if k.endswith("_s") and k not in ("run_wall_s", "attempt_wall_s",
                                                                                   "between_s"))
        assert abs(timing["run_wall_s"] - phases) <= 0.05 * timing["run_wall_s"], timing
        assert timing["attempt_wall_s"] >= timing["run_wall_s"]


def test_an_ssh_failure_is_recorded_with_where_it_happened(testbed, tmp_path):
    """The sender is addressed at a port where no SSH server listens: a real connection failure."""
    import dataclasses
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # free once closed: nothing listens there
    host = testbed.sender.host
    broken = dataclasses.replace(testbed, sender=dataclasses.replace(
        testbed.sender, host=SSHHost(name="sender", address="127.0.0.1", port=dead_port, key_path=host.key_path,
                                     known_hosts=host.known_hosts, connect_timeout_s=3)))
    spec = campaign_spec.CampaignSpec.from_dict({"name": "ssh-fails", "ccas": ["cubic"], "timeslices_ms": [1],
                                            "cpu_shares_pct": [100], "rtts_ms": [20], "rates_mbit": [50],
                                            "repetitions": 1, "duration_s": 2, "max_attempts": 1})
    runner = Runner(broken)
    made = []
    campaign.run_campaign(spec, tmp_path, runner, options=CampaignOptions(progress=False), on_run=made.append)
    (rec,) = made
    assert rec["status"] == "failed"
    assert " (at " in rec["reason"] and ".py:" in rec["reason"] and " in " in rec["reason"], rec["reason"]
    assert record.load_record(tmp_path / "failed" / f"{spec.plan()[0].run_id}.a1")["reason"] == rec["reason"]


def test_a_refused_sysctl_on_the_sender_fails_the_run(testbed, tmp_path):
    s = testbed.sender.host
    s.run(["sh", "-c", f"echo 0 > {SYSCTL} && mount --bind {SYSCTL} {SYSCTL} && mount -o remount,bind,ro {SYSCTL}"])
    try:
        with pytest.raises(sender.SenderNotReady, match="tcp_no_metrics_save"):
            sender.prepare(s)
        rec = run_once(testbed, Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(1, 100), Flow("cubic", IperfParams(2))),
                       tmp_path)
        assert rec["status"] == "failed" and "SenderNotReady" in rec["reason"] and "sender.py" in rec["reason"]
        assert rec["metadata"]["testbed"]["name"] == testbed.name  # what was measured before still recorded
        assert not (tmp_path / "iperf.json").exists()  # no transfer ran
    finally:
        s.run(["sh", "-c", f"umount {SYSCTL}; echo 1 > {SYSCTL}"], check=False)
    assert sender.prepare(s).sysctls["net.ipv4.tcp_no_metrics_save"] == "1"


def test_a_fresh_record_names_its_machine(testbed, tmp_path):
    """The local testbed's sender VM runs on this machine: a 2 s run's record names it as bbrlab.core.machine
    reads it here (CPU model and speed, CPUs, kernel, anonymised machine and boot id), and the runs table's
    machine column reads its label."""
    rec = run_once(testbed, Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(1, 100), Flow("cubic", IperfParams(2))),
                   tmp_path)
    assert rec["status"] == "ok", rec["reason"]
    named = rec["metadata"]["testbed"]["machine"]
    here = machine.measure(LocalHost("here")).to_dict()
    same = ("label", "cpu_model", "cpu_mhz_nominal", "cpu_mhz_max", "cpus", "machine_id", "boot_id", "kernel")
    assert {k: named[k] for k in same} == {k: here[k] for k in same}
    assert named["machine_id"] and named["boot_id"] and named["cpu_mhz_current"] > 0
    summary = records_reader.iperf_summary(json.loads((tmp_path / "iperf.json").read_text()))
    assert records_reader.run_row(rec, summary, str(tmp_path))["machine"] == here["label"]


def test_no_per_run_file_at_a_predictable_tmp_name(testbed, tmp_path):
    """Links planted where earlier versions wrote (/tmp/bbrlab-iperf3-server-<run>.log on the receiver,
    /tmp/bbrlab-ss-<run>.log and .stop on the sender) are not followed; per-run files go to private
    directories that are gone after the run."""
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(1, 100),
                        Flow("cubic", IperfParams(2), sample_ms=100, sampler="ss"))
    run_id = scenario.run_id
    victim = "/root/bbrlab-victim"
    plant = (f'echo keep > {victim} && ln -sfn {victim} /tmp/bbrlab-iperf3-server-{run_id}.log && '
             f'ln -sfn {victim} /tmp/bbrlab-ss-{run_id}.log && ln -sfn {victim} /tmp/bbrlab-ss-{run_id}.stop')
    for host in (testbed.receiver.host, testbed.sender.host):
        host.run(["sh", "-c", plant])
    try:
        rec = run_once(testbed, scenario, tmp_path)
        assert rec["status"] == "ok", rec["reason"]
        for host in (testbed.receiver.host, testbed.sender.host):
            assert host.output(["cat", victim]) == "keep"
        assert _leftover_dirs(testbed) == ""
    finally:
        for host in (testbed.receiver.host, testbed.sender.host):
            host.run(["sh", "-c", f"rm -f {victim} /tmp/bbrlab-iperf3-server-{run_id}.log /tmp/bbrlab-ss-{run_id}.*"],
                     check=False)


def test_link_validate_refuses_while_the_sender_is_contended(testbed):
    from bbrlab.contention.deadline import contended
    from bbrlab.core.errors import TestbedError

    with contended(testbed.sender.hypervisor, testbed.sender.vcpu_threads(), Contention(10, 50)):
        with pytest.raises(TestbedError, match="SCHED_DEADLINE"):
            validate_link(testbed, Link(rtt_ms=20, rate_mbit=50))
    assert not _deadline_on(testbed)
