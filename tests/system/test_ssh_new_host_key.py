"""A host booted afresh gets a new host key, pinned anew in its ``known_hosts``: a long-lived :class:`SSHHost` (the
session's testbed, a notebook's) reconnects with the new pin and still refuses a key that is not pinned.

Found by fresh clones' make test: the README's demo campaign runs in 2 blocks, each on a fresh boot of the
sender, and later tests that used the session's testbed object failed: first with ``BadHostKeyException`` (its
connection had read the old key once), then with "Socket is closed" (fabric kept the SFTP session of the dead
connection and the transfer's first file went to it). Here a real OpenSSH server on loopback (a free port, fresh keys) is
stopped and started again with another host key; nothing is mocked.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import paramiko
import pytest

from bbrlab.core.hosts import SSHHost
from tests.polling import wait_for

pytestmark = pytest.mark.system


def _keygen(path: Path) -> str:
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class _Sshd:
    """This machine's sshd on 127.0.0.1:``port`` with host key ``conf/host_key``, started and stopped."""

    def __init__(self, conf: Path, port: int):
        self.conf, self.port, self.proc = conf, port, None
        (conf / "sshd_config").write_text("\n".join([
            "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {conf}/host_key",
            f"AuthorizedKeysFile {conf}/authorized_keys", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "UseDNS no", f"PidFile {conf}/sshd.pid", "Subsystem sftp internal-sftp", ""]))

    def start(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # OpenSSH's privilege-separation directory
        self.proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(self.conf / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _listening(self.port), "sshd to listen", 15)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None
        wait_for(lambda: not _listening(self.port), "sshd to stop listening", 15)


def test_a_host_key_pinned_anew_is_read_when_the_connection_is_made_again(tmp_path):
    conf = tmp_path / "sshd"
    conf.mkdir(mode=0o700)
    port = _free_port()
    (conf / "authorized_keys").write_text(_keygen(conf / "client_key").strip() + "\n")
    known_hosts = conf / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {_keygen(conf / 'host_key')}\n")
    sshd = _Sshd(conf, port)
    sshd.start()
    host = SSHHost(name="sender", address="127.0.0.1", port=port, user="root", key_path=str(conf / "client_key"),
                   known_hosts=str(known_hosts))
    try:
        assert host.output(["echo", "first"]).strip() == "first"
        sent = tmp_path / "sent"
        sent.write_text("over SFTP\n")
        host.put(sent, str(tmp_path / "got-1"))  # fabric keeps this SFTP session on the connection
        sshd.stop()  # the VM reboots (the listener here; the session below): a new host key
        new_key = _keygen(conf / "host_key")
        sshd.start()
        host._connection().client.get_transport().close()  # the rebooted VM's end of the old connection is gone
        with pytest.raises(paramiko.BadHostKeyException):  # not yet pinned: refused
            host.output(["true"])
        known_hosts.write_text(f"[127.0.0.1]:{port} {new_key}\n")
        assert host.output(["echo", "second"]).strip() == "second"
        host.put(sent, str(tmp_path / "got-2"))  # a new SFTP session on the new connection, not the dead one's
        assert (tmp_path / "got-2").read_text() == "over SFTP\n"
        # Booted afresh again while the old connection still answers (its end not yet known to be gone, as a
        # guest's reboot under QEMU leaves it): the new pin alone makes the host connect to the new boot.
        before = host._connection().client.get_transport()
        sshd.stop()
        third_key = _keygen(conf / "host_key")
        sshd.start()
        known_hosts.write_text(f"[127.0.0.1]:{port} {third_key}\n")
        assert host.output(["echo", "third"]).strip() == "third"
        after = host._connection().client.get_transport()
        assert after is not before and not before.is_active()
        assert " ".join(after.get_remote_server_key().get_base64().split()) == third_key.split()[1]
    finally:
        host.close()
        sshd.stop()
