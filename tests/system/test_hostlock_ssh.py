"""Issue 35 item 3 over real SSH: a lab host's lock that is lost ends the run, and is taken again after.

The lab host is this machine's own OpenSSH server, started for each test in a network namespace of its own and
reached over a veth pair (so the path can be cut like a real network), with fresh host and client keys and the
host key pinned as bbrlab pins a lab's. The lock lives in a temporary directory instead of ``/run/bbrlab``, so
tests of several developers do not meet. The testbed is a stand-in naming that host as a lab's emulator and
hypervisor (what :func:`bbrlab.testbed.hostlock.lab_hosts` and the runner read of it); the SSH connection,
the lock on the host, and the commands holding it are real.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from bbrlab.campaign.loop import Attempt, InProcess
from bbrlab.core import hosts
from bbrlab.core.hosts import SSHHost
from bbrlab.run.runner import Runner
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario
from bbrlab.testbed import hostlock
from tests.polling import wait_for

pytestmark = pytest.mark.system

SSHD_PORT = 2222


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """``(host, link, sshd log, lock directory)``: an sshd in namespace ``bbhl-<random>`` at 10.253.x.2, this
    side of the veth (``link``) at 10.253.x.1."""
    rand = uuid.uuid4().hex[:6]
    ns, here, there = f"bbhl-{rand}", f"vhl{rand}a", f"vhl{rand}b"
    net = f"10.253.{int(rand[:2], 16)}"
    conf = tmp_path / "sshd"
    conf.mkdir(mode=0o700)
    host_pub = _keygen(conf / "host_key")
    (conf / "authorized_keys").write_text(_keygen(conf / "client_key").strip() + "\n")
    (conf / "known_hosts").write_text(f"[{net}.2]:{SSHD_PORT} {host_pub}\n")
    (conf / "sshd_config").write_text("\n".join([
        f"ListenAddress {net}.2", f"Port {SSHD_PORT}", f"HostKey {conf}/host_key",
        f"AuthorizedKeysFile {conf}/authorized_keys", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        "UseDNS no", f"PidFile {conf}/sshd.pid", "LogLevel DEBUG1", ""]))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # OpenSSH's privilege-separation directory
    _ip("netns", "add", ns)
    sshd = None
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"{net}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", ns, "addr", "add", f"{net}.2/30", "dev", there)
        _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        log = conf / "sshd.log"
        with open(log, "wb") as out:
            sshd = subprocess.Popen(["ip", "netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e", "-f",
                                     str(conf / "sshd_config")], stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: _listening(f"{net}.2", SSHD_PORT), "the lab's sshd to listen", 15)
        host = SSHHost(name="emulator", address=f"{net}.2", port=SSHD_PORT, user="root",
                       key_path=str(conf / "client_key"), known_hosts=str(conf / "known_hosts"))
        lock_dir = str(tmp_path / "lock")
        monkeypatch.setattr(hostlock, "REMOTE_DIR", lock_dir)  # the runner's checks look here, not /run/bbrlab
        try:
            yield host, here, log, lock_dir
        finally:
            host.close()
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(10)
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _listening(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def _testbed(host: SSHHost) -> SimpleNamespace:
    """A lab testbed whose emulator and sender hypervisor are ``host`` (as the runner and hostlock read it)."""
    return SimpleNamespace(kind="lab", name="lab-t", emulator=SimpleNamespace(host=host, ports=("eth1", "eth2")),
                           sender=SimpleNamespace(hypervisor=host))


def _holding_pid(lock_dir: str) -> int:
    """The pid of the shell holding the lock on the host, as its owner record says (the host is this machine)."""
    return json.loads((Path(lock_dir) / hostlock.OWNER_FILE).read_text())["host_pid"]


def _kill_holder(lock_dir: str) -> int:
    """SIGKILL the lock-holding command on the host (its process group: the shell and its cat); returns when
    it has exited, so the kernel has dropped its lock."""
    pid = _holding_pid(lock_dir)
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    wait_for(lambda: not _alive(pid), f"the holding shell {pid} to exit", 10)
    return pid


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_killed_holder_fails_the_next_check_and_the_lock_is_taken_again(lab):
    host, _, _, lock_dir = lab
    tb = _testbed(host)
    with hostlock.hold(host, testbed="lab-t", directory=lock_dir) as first:
        assert hostlock.check_held(tb) is False  # held: nothing to say
        _kill_holder(lock_dir)
        with pytest.raises(hostlock.HostLockLost, match=f"lost the lock of emulator \\(root@{host.address}:"):
            hostlock.check_held(tb)  # main: no check at all, the campaign carries on without the lock
        assert hostlock.check_held(tb) is True  # the next attempt takes it again
        again = hostlock.holder(host, lock_dir)
        assert again["token"] == hostlock.SESSION_TOKEN and again["hold"] != first["hold"]
        assert hostlock.check_held(tb) is False
    assert hostlock.holder(host, lock_dir) is None  # the lock taken again is released with the block


def test_a_run_whose_lock_is_lost_is_a_failed_attempt_with_the_reason(lab, tmp_path, monkeypatch):
    """Lost before the run: the attempt fails before anything runs. Lost during it: the run's own steps end,
    but it is not recorded ok. Both as the campaign loop records any failed attempt."""
    host, _, _, lock_dir = lab
    runner = Runner(_testbed(host))
    ran = []

    def run(scenario, out, meta, *, ports):  # the run's recipe; the lock is lost while it runs
        ran.append(scenario.run_id)
        if len(ran) == 2:
            _kill_holder(lock_dir)

    monkeypatch.setattr(runner, "run", run)
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(10, 50), Flow("cubic", IperfParams(5)))
    (tmp_path / "campaign").mkdir()
    executor = InProcess(runner, tmp_path / "campaign")
    with hostlock.hold(host, testbed="lab-t", directory=lock_dir):
        assert executor.run(Attempt("r", 1, scenario, 0)).status == "ok" and len(ran) == 1
        _kill_holder(lock_dir)
        lost = executor.run(Attempt("r", 2, scenario, 0))
        assert lost.status == "failed" and len(ran) == 1  # failed before the run started
        assert lost.reason.startswith(f"HostLockLost: lost the lock of emulator (root@{host.address}:")
        assert "the next attempt takes the lock again" in lost.reason
        during = executor.run(Attempt("r", 3, scenario, 0))  # takes it again, then loses it in the run
        assert len(ran) == 2 and during.status == "failed" and "HostLockLost: lost the lock" in during.reason
        assert "run_wall_s" in during.metadata["timing"]  # the run's own metadata is kept with the failure
        assert executor.run(Attempt("r", 4, scenario, 0)).status == "ok" and len(ran) == 3


def test_the_lock_connection_sends_keepalives(lab, monkeypatch):
    host, _, log, lock_dir = lab
    monkeypatch.setattr(hosts, "KEEPALIVE_S", 1)
    with hostlock.hold(host, testbed="lab-t", directory=lock_dir):
        transport = host._connection().client.get_transport()
        assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == hosts.DEAD_AFTER_S * 1000
        assert transport.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        # sshd logs each global request it is sent; paramiko's keepalive is keepalive@lag.net
        wait_for(lambda: b"keepalive@lag.net" in log.read_bytes(), "a keepalive at the lab's sshd", 15)


def test_after_a_network_blip_the_lost_lock_fails_the_run_and_our_orphan_on_the_host_is_ended(lab, monkeypatch):
    """The path to the host is down until this side's keepalives go unanswered for DEAD_AFTER_S and
    the kernel gives the connection up; the host's sshd (no ClientAlive) notices nothing, so the old hold still
    holds the lock there. The next check fails the run; the one after ends that orphan and takes the lock."""
    host, link, _, lock_dir = lab
    monkeypatch.setattr(hosts, "KEEPALIVE_S", 1)
    monkeypatch.setattr(hosts, "DEAD_AFTER_S", 3)
    tb = _testbed(host)
    with hostlock.hold(host, testbed="lab-t", directory=lock_dir):
        orphan = _holding_pid(lock_dir)
        transport = host._connection().client.get_transport()
        _ip("link", "set", link, "down")  # the cable out: nothing goes through, and the host is not told
        try:  # main: no keepalive, so an idle connection never notices (and fabric reconnects later)
            wait_for(lambda: not transport.is_active(), "this side to give the dead connection up", 30)
        finally:
            _ip("link", "set", link, "up")
        wait_for(lambda: _listening(host.address, SSHD_PORT), "the path to the host to be back", 15)
        assert _alive(orphan)  # the host still holds the lock for a connection that is gone
        with pytest.raises(hostlock.HostLockLost, match="its SSH connection is closed"):
            hostlock.check_held(tb)
        assert hostlock.check_held(tb) is True
        assert not _alive(orphan) and _holding_pid(lock_dir) != orphan
        assert hostlock.check_held(tb) is False


def test_a_lock_file_removed_on_the_host_is_a_lost_lock(lab):
    """Someone removes the lock file on the host (a clean-up of /run): a second driver could now lock a new file
    of that name, so the holder's answer says its lock is no longer the host's."""
    host, _, _, lock_dir = lab
    tb = _testbed(host)
    with hostlock.hold(host, testbed="lab-t", directory=lock_dir):
        (Path(lock_dir) / hostlock.LOCK_FILE).unlink()
        with pytest.raises(hostlock.HostLockLost, match="host.lock is no longer the file this lock is on"):
            hostlock.check_held(tb)
