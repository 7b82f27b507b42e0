"""The rsync receiver cannot escape its directory (issue 35, item 6), for real: the run's sshd started as the
rsync workload starts it (bbrlab.run.sshd.server with bbrlab.run.transfer.RECEIVE_COMMAND) in a network
namespace, and a real rsync over real ssh from another namespace with the run's client files. Two namespaces
joined by a veth stand in for the testbed's sender and receiver (no VM needed).

A client that pushes a symbolic link pointing outside, a device node and a set-uid file gets none of them
on the receiver as sent: ``rsync -a`` (permissions, owners, groups, devices) is refused outright, and what a
plain ``rsync -rl`` delivers is the login account's ordinary files (no set-uid bit, not root's) with its
link munged, so a later push through that link lands nowhere outside. Unauthenticated connections are cut
after the login grace time.
"""

from __future__ import annotations

import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from bbrlab.run import iperf, rxuser, sshd, transfer
from tests.veth import veth_pair

pytestmark = pytest.mark.system

SENDER_IP, RECEIVER_IP, PORT = "10.94.0.1", "10.94.0.2", 5024


def _push(pair, client_dir: str, *argv: str):
    """rsync on the sender with the run's ssh config (its connect helper, the pinned host key)."""
    return pair.sender.run(["env", "BBRLAB_CCA=cubic", "BBRLAB_SPORT=0", f"BBRLAB_SADDR={SENDER_IP}", "rsync",
                            "-e", f"ssh -F {client_dir}/ssh_config", *argv], check=False, timeout=60)


def _hostile_tree(root: Path, outside: Path) -> Path:
    src = root / "src"
    src.mkdir()
    (src / "plain.txt").write_text("data\n")
    (src / "suid").write_text("#!/bin/sh\nid\n")
    os.chmod(src / "suid", 0o4755)
    os.mknod(src / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (src / "escape").symlink_to(outside)
    return src


def _entries(dest: Path) -> dict[str, os.stat_result]:
    return {str(p.relative_to(dest)): os.lstat(p) for p in dest.rglob("*")}


def test_a_push_of_a_link_a_device_and_a_setuid_file_lands_tamed_or_not_at_all(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    src = _hostile_tree(tmp_path, outside)
    second = tmp_path / "second" / "escape"
    second.mkdir(parents=True)
    (second / "pwned").write_text("written through the link\n")
    with veth_pair("rc", SENDER_IP, RECEIVER_IP) as pair, \
            sshd.server(pair.receiver, RECEIVER_IP, transfer.RECEIVE_COMMAND, port=PORT,
                        lifetime_s=120) as server, \
            transfer.client_files(pair.sender, server) as client_dir:
        assert (server.user, server.user_note) == (sshd.LOGIN_USER, None)
        rx_uid = pwd.getpwnam(server.user).pw_uid
        dest = Path(server.dest_dir)
        assert os.lstat(dest).st_uid == rx_uid

        whole = _push(pair, client_dir, "-a", f"{src}/", f"{transfer.HOST_ALIAS}:")
        assert whole.exit_code != 0 and "refused" in whole.stderr, whole.stderr
        assert _entries(dest) == {}  # nothing of an -a push lands

        plain = _push(pair, client_dir, "-rl", f"{src}/", f"{transfer.HOST_ALIAS}:")
        assert plain.exit_code == 0, plain.stderr
        link = os.readlink(dest / "escape")
        through = _push(pair, client_dir, "-r", "--keep-dirlinks", f"{second.parent}/",
                        f"{transfer.HOST_ALIAS}:")
        assert through.exit_code != 0 and "refused" in through.stderr  # -K would follow the link
        through = _push(pair, client_dir, "-r", f"{second.parent}/", f"{transfer.HOST_ALIAS}:")
        landed = _entries(dest)
        print(f"-rl: link {link}; through the link: exit {through.exit_code}; landed "
              f"{ {k: oct(v.st_mode) for k, v in landed.items()} }")
        assert link.startswith("/rsyncd-munged/")
        assert {"plain.txt", "suid"} <= set(landed) and "null" not in landed
        for name, st in landed.items():
            assert st.st_uid == rx_uid and st.st_uid != 0, name
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), name
            assert not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)), name
        received = transfer.measure(pair.receiver, str(dest / "plain.txt"), 5, server.account)
        assert received.bytes == 5 and received.sha256 is not None
    assert list(outside.iterdir()) == []  # nothing went through the link
    assert not Path("/rsyncd-munged").exists()


def test_an_unauthenticated_connection_is_cut_after_the_login_grace_time():
    """sshd's LoginGraceTime bounds a connection that never authenticates (it was 0: unbounded). The bound
    is 2 s here; a connection that sends nothing is closed by sshd, not by the test."""
    probe = ("import socket, sys, time\n"
             "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)\n"
             "t0 = time.monotonic()\n"
             "while s.recv(4096): pass\n"
             "print(time.monotonic() - t0)\n")
    with veth_pair("rg", SENDER_IP, RECEIVER_IP) as pair, \
            sshd.server(pair.receiver, RECEIVER_IP, transfer.RECEIVE_COMMAND, port=PORT, lifetime_s=60,
                        login_grace_s=2):
        t0 = time.monotonic()
        res = pair.sender.run(["python3", "-c", probe, RECEIVER_IP, str(PORT)], check=False, timeout=60)
        elapsed = time.monotonic() - t0
    print(f"closed after {res.stdout.strip()} s (command {elapsed:.2f} s)")
    assert res.exit_code == 0, res.stderr
    assert 1.5 <= float(res.stdout) < 30


def _uids_of_tree(pid: int) -> dict[str, int]:
    """``{command name: real uid}`` of ``pid`` and its children (the server under ``timeout``)."""
    out = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        status = Path(f"/proc/{p}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        out[fields["Name"].strip()] = int(fields["Uid"].split()[0])
        for task in Path(f"/proc/{p}/task").iterdir():
            children = (task / "children").read_text().split()
            todo += [int(c) for c in children]
    return out


@pytest.mark.parametrize("cca", ["reno", "cubic"])
def test_iperf3s_server_runs_as_the_unprivileged_receiver_account(cca):
    """The run's iperf3 server (bbrlab.run.iperf.server, as a run starts it) serves a real 1 s test while
    running as bbrlab-rx; only its ``timeout`` wrapper is root's. It keeps CAP_NET_ADMIN (and nothing else)
    only when the kernel does not let every user set the test's congestion control (iperf3 sets the
    client's on its own socket too): reno is always allowed, cubic is not on this machine
    (``net.ipv4.tcp_allowed_congestion_control = reno bbr``)."""
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    with veth_pair("ri", SENDER_IP, RECEIVER_IP) as pair:
        with iperf.server(pair.receiver, lifetime_s=60, cca=cca) as server:
            uids = _uids_of_tree(server.pid)
            result = pair.sender.run(iperf.client_argv(RECEIVER_IP, cca=cca, duration_s=1), timeout=60)
    print(f"server processes and uids: {uids}; kept capabilities {server.caps}")
    assert (server.account.name, server.account.note) == (rxuser.NAME, None)
    assert uids["iperf3"] == pwd.getpwnam(rxuser.NAME).pw_uid != 0
    assert server.caps == (() if cca in allowed else ("net_admin",))
    parsed = iperf.parse_result(result.stdout)
    assert parsed.receiver_mbit > 0 and parsed.sender_tcp_congestion == cca


def test_an_account_that_cannot_be_had_falls_back_to_root_and_says_why():
    """A name useradd refuses, and an existing account with uid 0, give root with the reason (what a run's
    record then carries in metadata.flow.receiver_user_note); the real account is unprivileged."""
    from bbrlab.core.hosts import LocalHost

    host = LocalHost()
    refused = rxuser.receiver_user(host, "-no such user")
    assert refused.is_root and "-no such user" in refused.note and "ran as root" in refused.note
    zero = rxuser.receiver_user(host, "root")
    assert zero.is_root and zero.note
    ours = rxuser.receiver_user(host)
    assert (ours.name, ours.note) == (rxuser.NAME, None) and pwd.getpwnam(ours.name).pw_uid != 0
    assert ours.wrap(["id", "-u"])[:1] == ["setpriv"] and refused.wrap(["id", "-u"]) == ["id", "-u"]
    assert host.output(ours.wrap(["id", "-u"])) == str(pwd.getpwnam(ours.name).pw_uid)
