"""Issue 17 on the real local testbed: the README's commands as written, the testbed found without
naming it, commands that wait for a campaign's lock, a status that leaves the campaign alone, the
admission check against this host, and images kept for running testbeds of any state root.

The session fixture holds the testbed's lock for the whole session, as a campaign would: commands run
by these tests as pytest's children share it, while commands started outside pytest's process tree
(:class:`Outsider`, through ``setsid -f``) meet it as another user's shell would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from bbrlab.contention.deadline import show_policies
from bbrlab.contention.limits import read_kernel_limits
from bbrlab.core.hosts import LocalHost
from bbrlab.link import emulator as link
from bbrlab.testbed.lock import set_activity
from tests.polling import wait_for
from tests.readme_commands import README_COMMANDS

pytestmark = [pytest.mark.system, pytest.mark.testbed]

ROOT = Path(__file__).resolve().parents[2]
BBRLAB = str(Path(sys.executable).with_name("bbrlab"))
WRAPPER = """
import pathlib, subprocess, sys
d = pathlib.Path(sys.argv[1])
with open(d / "out", "w") as out, open(d / "err", "w") as err:
    p = subprocess.Popen(sys.argv[2:], stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    (d / "pid").write_text(str(p.pid))
    rc = p.wait()
(d / "rc").write_text(str(rc))
"""


class Outsider:
    """``bbrlab ARGS`` started outside pytest's process tree, so the session's lock is someone else's to it."""

    def __init__(self, tmp_path: Path, *args: str, env: dict):
        self.dir = tmp_path / f"outsider-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir()
        subprocess.run(["setsid", "-f", sys.executable, "-c", WRAPPER, str(self.dir), BBRLAB, *args],
                       env=env, check=True, timeout=30)
        self.pid = int(wait_for(lambda: (self.dir / "pid").is_file() and (self.dir / "pid").read_text(),
                                "the outsider to start", 60.0, poll_s=0.1))

    def err(self) -> str:
        return (self.dir / "err").read_text()

    def out(self) -> str:
        return (self.dir / "out").read_text()

    def rc(self, deadline_s: float = 300.0) -> int:
        return int(wait_for(lambda: (self.dir / "rc").is_file() and (self.dir / "rc").read_text(),
                            f"bbrlab {self.dir.name} to end", deadline_s, poll_s=0.1))

    def running(self) -> bool:
        return not (self.dir / "rc").is_file()


@pytest.fixture
def env(testbed) -> dict:
    return {**os.environ, "BBRLAB_TESTBED": testbed.name}


@pytest.fixture
def campaign_holds(testbed):
    """The session holds the lock; make it say what a campaign says (bbrlab.campaign.loop.announcing)."""
    set_activity(testbed.name, "campaign run", campaign="demo", out="runs/demo", run_id="cubic-ts1ms-sh25-x",
                 attempt=1, index=3, planned=48)
    yield
    set_activity(testbed.name, "pytest session")


def _snapshot(testbed) -> dict:
    """What the commands under test could change: the vCPU threads' policies, the emulator's qdiscs,
    the bbr2b module's parameters."""
    threads = testbed.sender.vcpu_threads()
    qdiscs = link.show(testbed.emulator.host, testbed.emulator.ports)
    params = testbed.sender.host.output(["sh", "-c", "grep -s . /sys/module/bbr2b/parameters/* || true"])
    return {"policies": show_policies(testbed.sender.hypervisor, threads),
            "qdiscs": {i: [(q.get("kind"), q.get("handle"), q.get("options")) for q in qs] for i, qs in qdiscs.items()},
            "params": params}


# -- a look at the testbed does not disturb the campaign holding it -------------------------------------------

def test_status_names_the_campaign_holding_the_testbed_and_asks_the_guests_nothing(testbed, env, campaign_holds,
                                                                                  tmp_path):
    as_json = Outsider(tmp_path, "testbed", "status", "--json", env=env)
    assert as_json.rc() == 0, as_json.err()
    st = json.loads(as_json.out())
    assert "roles" not in st
    assert st["busy"]["activity"] == "campaign run" and st["busy"]["run_id"] == "cubic-ts1ms-sh25-x"
    assert os.getpid() in st["busy"]["pids"]
    text = Outsider(tmp_path, "testbed", "status", env=env)
    assert text.rc() == 0
    assert f"in use by pid {os.getpid()}" in text.out() and "campaign run demo, run 3/48 cubic-ts1ms-sh25-x" in text.out()
    forced = Outsider(tmp_path, "testbed", "status", "--json", "--force", env=env)
    assert forced.rc() == 0, forced.err()
    assert json.loads(forced.out())["roles"]["sender"]["reachable"]


@pytest.mark.parametrize("args", [["testbed", "shell", "sender", "--", "true"], ["link", "show"],
                                  ["kernel", "status"]])
def test_commands_on_the_guests_are_refused_while_a_campaign_holds_it(testbed, env, campaign_holds, tmp_path, args):
    refused = Outsider(tmp_path, *args, env=env)
    assert refused.rc() == 1
    assert "in use by pid" in refused.err() and "run 3/48" in refused.err() and "--force" in refused.err()
    forced = Outsider(tmp_path, *args[:2], "--force", *args[2:], env=env)
    assert forced.rc() == 0, forced.err()


@pytest.mark.parametrize("args", [
    ["contention", "set", "--timeslice", "1ms", "--share", "25%"],
    ["contention", "clear"],
    ["kernel", "set", "deficit_gain=739"],
    ["kernel", "load"],
    ["link", "set", "--rtt", "20ms", "--rate", "50mbit"],
    ["link", "clear"],
    ["testbed", "up"],
], ids=lambda a: " ".join(a[:2]))
def test_changes_wait_for_the_lock_and_change_nothing_meanwhile(testbed, env, campaign_holds, tmp_path, args):
    before = _snapshot(testbed)
    waiting = Outsider(tmp_path, *args, env=env)
    wait_for(lambda: "in use by pid" in waiting.err(), "the command to say the testbed is in use", 120, poll_s=0.1)
    assert "campaign run demo, run 3/48" in waiting.err() and "waiting" in waiting.err()
    time.sleep(2)
    assert waiting.running()
    assert _snapshot(testbed) == before
    os.kill(waiting.pid, signal.SIGINT)  # Ctrl-C gives up waiting
    assert waiting.rc(30) == 130
    assert _snapshot(testbed) == before


# -- the testbed is found without naming it -----------------------------------------------------------------

def test_the_running_testbed_is_found_without_naming_it(testbed, tmp_path):
    """README: after `bbrlab testbed up`, `bbrlab contention ...` needs no --testbed (it used to demand one)."""
    from bbrlab.testbed.local.state import state_dir

    root = tmp_path / "state"
    (root / "testbeds").mkdir(parents=True)
    (root / "testbeds" / testbed.name).symlink_to(state_dir(testbed.name))  # the only testbed recorded there
    env = {k: v for k, v in os.environ.items() if k != "BBRLAB_TESTBED"}
    env["BBRLAB_STATE_DIR"] = str(root)
    res = subprocess.run([BBRLAB, "contention", "show", "--json"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert [t["tid"] for t in json.loads(res.stdout)["threads"]] == testbed.sender.vcpu_threads()
    res = subprocess.run([BBRLAB, "testbed", "status", "--json"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0 and json.loads(res.stdout)["name"] == testbed.name


# -- the README, as written ------------------------------------------------------------------------------------

def test_readme_commands_work_as_written(testbed, env, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "specs").symlink_to(ROOT / "specs")
    for command in README_COMMANDS:
        argv = command.split()
        argv[0] = BBRLAB
        if command.startswith("bbrlab campaign run"):
            _run_campaign_until_a_run_is_recorded(argv, work, env)
            continue
        res = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 0, f"{command}: {res.stderr[-2000:]}"
        if command == "bbrlab contention set --timeslice 1ms --share 25%":
            assert "SCHED_DEADLINE" in res.stdout or "deadline" in res.stdout.lower()
    assert json.loads(subprocess.run([BBRLAB, "campaign", "status", "runs/demo", "--json"], cwd=work, env=env,
                                     capture_output=True, text=True, timeout=60).stdout)["done"] >= 1


def _run_campaign_until_a_run_is_recorded(argv: list[str], work: Path, env: dict) -> None:
    """`bbrlab campaign run specs/demo.yaml --out runs/demo` as written, stopped with Ctrl-C once a run is
    recorded (the whole demo takes about half an hour; make demo runs it). The demo has ``blocks: 2``, so its first
    run is block 0 on a sender booted afresh for it, with the emulator left as it was: this is where ``make test``
    checks a block's reboot (tests/system/test_blocks_testbed.py, two blocks, is in ``make test-slow``)."""
    boot_before = {role: _boot_id(role, work, env) for role in ("sender", "emulator")}
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: list((work / "runs/demo/runs").glob("*/record.json")) or proc.poll() is not None,
                 "the first run of the demo campaign", 600, poll_s=0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert "The same command resumes it" in err
    (record,) = [json.loads(p.read_text()) for p in (work / "runs/demo/runs").glob("*/record.json")][:1]
    meta = record["metadata"]
    assert (meta["block"]["block"], meta["block"]["blocks"], meta["block"]["fresh_boot"]) == (0, 2, True)
    assert meta["timing"]["block_boot_s"] > 0
    assert meta["testbed"]["sender_boot_id"] not in (boot_before["sender"], None)  # a boot made for the block
    assert meta["testbed"]["emulator_boot_id"] == boot_before["emulator"]  # only the sender rebooted


def _boot_id(role: str, work: Path, env: dict) -> str:
    """The role's kernel boot id, asked through ``bbrlab testbed shell`` as a user would."""
    res = subprocess.run([BBRLAB, "testbed", "shell", role, "--", "cat", "/proc/sys/kernel/random/boot_id"], cwd=work,
                         env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


# -- admission against this host, before anything runs ------------------------------------------------------

def test_campaign_refuses_shares_the_hypervisor_cannot_admit_before_anything_changes(testbed, tmp_path):
    """A testbed file whose sender lists more vCPU threads than the host can run at 70 % each: refused
    with the host's own numbers, before the campaign directory exists or a policy changes."""
    limits = read_kernel_limits(LocalHost())
    n = int(limits.capacity_cpus / 0.7) + 1
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(n)]  # real threads to stand as vCPUs
    try:
        tids = [p.pid for p in sleepers]
        before = show_policies(LocalHost(), tids)
        lab = yaml.safe_load(Path(testbed.spec.source).read_text())
        lab["roles"]["sender"]["vcpu"] = {"thread_ids": tids}
        (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
        spec = {"name": "adm", "testbed": "lab.yaml", "ccas": ["cubic"], "timeslices_ms": [10],
                "cpu_shares_pct": [70], "rtts_ms": [20], "rates_mbit": [100], "repetitions": 1, "duration_s": 5}
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))  # lab.yaml: relative to the spec
        cwd = tmp_path / "elsewhere"
        cwd.mkdir()
        res = subprocess.run([BBRLAB, "campaign", "run", str(tmp_path / "spec.yaml"), "--out", "out"],
                             cwd=cwd, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "BBRLAB_STATE_DIR": str(tmp_path / "state")})  # the pins stay here
        assert res.returncode == 1, res.stderr
        assert "cpu_shares_pct[0] with timeslices_ms[0]" in res.stderr and f"{n} vCPU thread(s)" in res.stderr
        assert not (cwd / "out").exists()
        assert show_policies(LocalHost(), tids) == before
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


# -- the shared image cache keeps what running testbeds use, whatever their state root ---------------------------

def test_an_image_a_running_testbed_boots_from_is_in_use_from_any_state_root(testbed, tmp_path, monkeypatch):
    from bbrlab.testbed.local import image

    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path / "elsewhere"))  # no testbed recorded here
    assert str(Path(testbed.local.image).resolve()) in image._images_in_use()
