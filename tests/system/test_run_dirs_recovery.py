"""Receivers leave nothing, for real: a run's sshd started as the rsync workload starts it (bbrlab.run.sshd.server in
the receiver's network namespace, the sender's client files beside it), its owner process SIGKILLed, then the
recovery a campaign runs before its first run (bbrlab.run.transfer.recover, which bbrlab.run.recovery.recover calls).

Afterwards the dead run's private directories (the receiver's keys and the data it received, the sender's
private key) and its sshd are gone; the directory and sshd of a run whose owner is alive, a directory stamped
by another machine and a directory of another user are untouched. Two namespaces joined by a veth stand
in for the testbed's sender and receiver (no VM needed for this).
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
from types import SimpleNamespace

import pytest

from bbrlab.run import sshd, transfer
from tests.veth import veth_pair

pytestmark = pytest.mark.system

OWNER = """
import json, sys, time
from bbrlab.run import sshd, transfer
from bbrlab.core.hosts import NetnsHost
rx, tx = NetnsHost(name="receiver", netns=sys.argv[1]), NetnsHost(name="sender", netns=sys.argv[2])
with sshd.server(rx, sys.argv[3], [transfer.RRSYNC, "-wo", "{dest}"], lifetime_s=300) as server:
    with transfer.client_files(tx, server) as client_dir:
        rx.run(["sh", "-c", 'head -c 200000 /dev/urandom > "$1"', "x", server.dest_dir + "/transfer.bin"])
        print(json.dumps({"dir": server.directory, "pid": server.pid, "client_dir": client_dir}), flush=True)
        time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _sshd_pids_of(directory: str) -> list[int]:
    """The sshd (and its timeout wrapper) started with ``directory``'s config."""
    needle = f"{directory}/sshd_config".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    out.append(int(entry))
            except OSError:
                pass
    return out


def _foreign_dir(stamp: str, uid: int = 0) -> Path:
    """A directory named like a run's sshd directory, stamped ``stamp``, owned by ``uid``."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bbrlab-sshd.{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    (path / "owner").write_text(stamp + "\n")
    (path / "host_ed25519_key").write_text("not ours to remove\n")
    os.chown(path, uid, uid)
    return path


def test_recovery_removes_a_killed_runs_directories_and_sshd_and_nothing_else():
    with veth_pair("rd", "10.93.0.1", "10.93.0.2") as pair:
        owner = subprocess.Popen([sys.executable, "-c", OWNER, pair.receiver.netns, pair.sender.netns, "10.93.0.2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = owner.stdout.readline()
            assert line, owner.stderr.read()
            dead = json.loads(line)
        finally:
            owner.send_signal(signal.SIGKILL)
            owner.wait(timeout=30)
        dead_dir, dead_client = Path(dead["dir"]), Path(dead["client_dir"])
        dead_pids = _sshd_pids_of(dead["dir"])
        assert (dead_dir / "dest" / "transfer.bin").stat().st_size == 200_000
        assert (dead_dir / "client_ed25519_key").is_file() and (dead_client / "id_ed25519").is_file()
        assert dead_pids and all(_alive(p) for p in dead_pids), "the killed run's sshd should outlive its owner"

        other_machine = _foreign_dir("bbrlab-owner someothermachine 0f0f0f0f-0000-0000-0000-000000000000 1 1")
        this_machine = Path("/etc/machine-id").read_text().strip()  # an earlier boot: gone, were it ours
        other_user = _foreign_dir(f"bbrlab-owner {this_machine} 0f0f0f0f-0000 1 1", uid=65534)
        try:
            _recover_and_check(pair, dead_dir, dead_client, dead_pids, other_machine, other_user)
        finally:
            for path in (other_machine, other_user):
                subprocess.run(["rm", "-rf", "--", str(path)], check=True)


def _recover_and_check(pair, dead_dir: Path, dead_client: Path, dead_pids: list[int], other_machine: Path,
                       other_user: Path) -> None:
    with sshd.server(pair.receiver, "10.93.0.2", [transfer.RRSYNC, "-wo", "{dest}"], port=5023,
                     lifetime_s=120) as live:  # a run whose owner (this test) is alive
        testbed = SimpleNamespace(receiver=SimpleNamespace(host=pair.receiver), sender=SimpleNamespace(host=pair.sender))
        found = transfer.recover(testbed)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in dead_pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not dead_dir.exists() and not dead_client.exists()
        assert not any(_alive(p) for p in dead_pids)
        assert str(dead_dir) in found.run_dirs_removed.receiver
        assert str(dead_client) in found.run_dirs_removed.sender
        assert Path(live.directory, "host_ed25519_key").is_file() and _alive(live.pid)
        assert pair.receiver.run(["ss", "-ltnH", "sport = :5023"]).stdout.strip(), "the live sshd was touched"
        for path in (other_machine, other_user):
            assert (path / "host_ed25519_key").read_text() == "not ours to remove\n"
