"""An SSH server for one run on the receiver, bound to its experiment address: rsync's far end.

:func:`server` starts OpenSSH's ``sshd`` on the receiver (locally: inside the receiver's network namespace)
for the ``with`` block, with everything of its own in a private directory (``mktemp -d``, removed after):

- a fresh ed25519 host key, whose public half the sender's client pins (``StrictHostKeyChecking yes``);
- a fresh ed25519 client key pair: the public half is the only authorized key, restricted to one forced
  command (``restrict,command="..."``: :data:`RECEIVE_GUARD`, then rsync's ``rrsync -wo -munge`` into the
  directory's ``dest/``), so the sender can write plain files there and do nothing else; the private half
  goes to the sender for the run;
- the login account: :data:`LOGIN_USER`, unprivileged, made when missing (:mod:`bbrlab.run.rxuser`); ``dest/``
  is its own, the directory passable (0710) by its group, everything else root's;
- its own configuration (``sshd -f``): listening on the experiment address only, never on the management
  network, public-key authentication only, that one account (root only where it could not be made), no
  forwarding, no PAM, no DNS, pre-authentication bounded (``LoginGraceTime``, ``MaxStartups``).
  ``StrictModes no``: the files live in the private directory, whose parent (/tmp) is world-writable,
  which sshd's ownership walk would otherwise refuse.

sshd runs in the foreground under coreutils ``timeout`` (it can never outlive the run), logging to the
private directory; it is ready when its port listens. OpenSSH needs its privilege-separation directory
(``/run/sshd``, which Debian's service creates at boot): it is created when missing.

The private directory holds keys and the data received, and a run killed outright (SIGKILL) cannot
remove it. So its first file is ``owner``, a stamp naming the process that drives the run
(:class:`bbrlab.core.owners.Owner`), and the recovery before a campaign's first run removes every such
directory whose owner is gone (:func:`bbrlab.core.leftdirs.sweep`), after killing the processes still working
in it (the sshd under ``timeout``, a progress poller).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hosts import Host

from . import iperf, rxuser

#: The port of the run's sshd on the receiver's experiment address (not 22: a lab receiver's own sshd
#: may listen there on every address).
DEFAULT_PORT = 5022
SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = "/run/sshd"
#: The user the client logs in as: the unprivileged account of :mod:`bbrlab.run.rxuser`. sshd runs as
#: root (it must, to switch users); this account only ever runs the forced command, so what a client sends
#: lands as that user's files. Root (:data:`ROOT`) only where the account cannot be made; the record says why.
LOGIN_USER = rxuser.NAME
ROOT = rxuser.ROOT
#: Seconds an unauthenticated connection may take to log in when the caller gives no bound, and how many
#: such connections may wait at once (sshd's ``MaxStartups``): the run's client needs one.
LOGIN_GRACE_S = 120
MAX_STARTUPS = 3


class SshdError(BbrlabError):
    """The run's sshd could not be started on the receiver."""


@dataclass(frozen=True)
class SshServer:
    """A running sshd for one run: where it listens, what the client needs, and where files land."""

    host: Host
    pid: int
    address: str
    port: int
    directory: str
    host_key_pub: str  # "ssh-ed25519 AAAA... comment": pinned by the client
    client_key: str  # OpenSSH private key text the client authenticates with
    user: str = LOGIN_USER
    user_note: str | None = None  # why the receiver runs as root, when it does
    group: str = ROOT  # the login user's group

    @property
    def account(self) -> rxuser.RxUser:
        """Who the client's forced command runs as."""
        return rxuser.RxUser(self.user, self.group, self.user_note)

    @property
    def dest_dir(self) -> str:
        """Where the forced command lets the client write."""
        return f"{self.directory}/dest"

    @property
    def log_path(self) -> str:
        """The file on the receiver holding sshd's output (``-e``: its log), removed with the directory."""
        return f"{self.directory}/sshd.log"

    def known_hosts_line(self, alias: str) -> str:
        """The client's ``known_hosts`` line pinning this server's host key under ``alias``."""
        return f"{alias} {' '.join(self.host_key_pub.split()[:2])}\n"


def config_text(directory: str, address: str, port: int, user: str = LOGIN_USER,
                login_grace_s: int = LOGIN_GRACE_S) -> str:
    """sshd_config of the run's server (see the module docstring). Before authentication a connection has
    ``login_grace_s`` seconds and at most :data:`MAX_STARTUPS` may wait at once."""
    return "\n".join([
        "# bbrlab: one run's sshd (bbrlab.run.sshd)",
        f"ListenAddress {address}:{port}",
        f"HostKey {directory}/host_ed25519_key",
        f"AuthorizedKeysFile {directory}/authorized_keys",
        "AuthorizedPrincipalsFile none", "PidFile none",
        "AuthenticationMethods publickey", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "HostbasedAuthentication no", "PermitEmptyPasswords no",
        "PermitRootLogin " + ("forced-commands-only" if user == ROOT else "no"), f"AllowUsers {user}",
        "UsePAM no", "UseDNS no", "StrictModes no", "PermitUserEnvironment no", "PermitUserRC no",
        "AllowTcpForwarding no", "AllowStreamLocalForwarding no", "AllowAgentForwarding no", "X11Forwarding no",
        "PermitTunnel no", "GatewayPorts no", "PermitTTY no", "PrintMotd no", "PrintLastLog no", "Banner none",
        # a handshake across a link losing half its packets can take long: the caller's bound is the run's
        f"LoginGraceTime {int(login_grace_s)}", "ClientAliveInterval 0", "TCPKeepAlive yes",
        f"MaxStartups {MAX_STARTUPS}", "MaxSessions 1",
        "LogLevel VERBOSE", "",
    ])


#: $1 directory (its owner stamp already in it: ``Host.private_dir``), $2 the sshd_config text, $3 the authorized
#: key's options, $4 the login user and $5 its group (both empty for root), $6 the receive guard's text. In one
#: command (every step is a command, and content never goes through stdin, which invoke forwards slowly):
#: a host key and a client key (ssh-keygen), the destination directory, the one
#: authorized key, the config, and the privilege-separation directory sshd insists on. Prints the host's
#: public key, then the client's private key.
_SETUP = r"""
set -eu
d=$1
umask 077
mkdir "$d/dest"
ssh-keygen -q -t ed25519 -N '' -C bbrlab-run-sshd -f "$d/host_ed25519_key"
ssh-keygen -q -t ed25519 -N '' -C bbrlab-run-client -f "$d/client_ed25519_key"
printf '%s %s\n' "$3" "$(cut -d' ' -f1,2 "$d/client_ed25519_key.pub")" > "$d/authorized_keys"
printf '%s' "$2" > "$d/sshd_config"
printf '%s' "$6" > "$d/receive_guard.py"
if [ -n "$4" ]; then
    # the login user may pass through the directory (not list it), read its authorized key and the guard,
    # and write in dest/ alone; the keys, config and log stay root's
    chgrp "$5" "$d" "$d/authorized_keys" "$d/receive_guard.py"
    chmod 0710 "$d"; chmod 0640 "$d/authorized_keys" "$d/receive_guard.py"
    chown "$4:$5" "$d/dest"
fi
[ -d /run/sshd ] || install -d -m 0755 /run/sshd
cat "$d/host_ed25519_key.pub" "$d/client_ed25519_key"
"""

#: The forced command's first part, run by the login user before ``rrsync``: it reads the client's rsync
#: command (``SSH_ORIGINAL_COMMAND``) and refuses every option that would keep the sender's permissions
#: (set-uid bits), owners, groups, devices, special files, ACLs or extended attributes, follow a link on
#: either end (``-KLk``) or undo rrsync's ``-munge``; then it runs the rest of its arguments (``rrsync -wo
#: -munge DIR``). Older rrsyncs let ``-a`` through whole; rsync 3.5's drops devices itself, and none strips
#: a set-uid bit.
RECEIVE_GUARD = r"""
import os, re, sys

REFUSED_LETTERS = "pogDAXEKLk"
REFUSED_LONG = {"perms", "owner", "group", "devices", "specials", "super", "fake-super", "usermap",
                "groupmap", "chown", "chmod", "acls", "xattrs", "executability", "copy-devices",
                "write-devices",
                "no-munge-links", "copy-links", "copy-unsafe-links", "copy-dirlinks", "keep-dirlinks"}


def refuse(why):
    print(f"bbrlab receiver: {why}", file=sys.stderr)
    sys.exit(1)


words = os.environ.get("SSH_ORIGINAL_COMMAND", "").split()
if words[:2] != ["rsync", "--server"]:
    refuse("only a push with rsync is accepted here")
for word in words[2:]:
    if word == ".":
        break
    if word.startswith("--"):
        name = word[2:].split("=", 1)[0]
        if name in REFUSED_LONG:
            refuse(f"option --{name} is refused (no permissions, owners, groups, devices or special files)")
    elif word.startswith("-"):
        letters = re.sub(r"e\d*\.\w*$", "", word[1:])
        bad = sorted(set(letters) & set(REFUSED_LETTERS))
        if bad:
            refuse(f"option -{bad[0]} is refused (no permissions, owners, groups, devices or special files)")
os.execv(sys.argv[1], sys.argv[1:])
"""


def key_options(forced_command: Sequence[str]) -> str:
    """The authorized key's options: ``restrict`` (no forwarding, pty, rc) and the forced command."""
    command = shlex.join(forced_command)
    if '"' in command or "\n" in command:
        raise ValidationError("forced_command", command, "a command without double quotes or newlines")
    return f'restrict,command="{command}"'


def _setup(host: Host, directory: str, config: str, options: str, user: str = ROOT,
           group: str | None = None) -> tuple[str, str]:
    """(host key pub, client private key), everything made in ``directory`` on ``host``; ``dest/`` owned
    by ``user`` (and the directory passable by its ``group``) unless it is root."""
    login = ("", "") if user == ROOT else (user, group or user)
    out = host.output(["sh", "-c", _SETUP, "bbrlab-sshd-setup", directory, config, options, *login, RECEIVE_GUARD],
                      timeout=60)
    lines = out.splitlines()
    if len(lines) < 3 or not lines[1].startswith("-----BEGIN OPENSSH PRIVATE KEY-----"):
        raise SshdError(f"ssh-keygen on {host.name} printed no key pair: {out[:200]!r}")
    return lines[0], "\n".join(lines[1:]) + "\n"


def wait_listening(host: Host, port: int, pid: int, log_path: str, *, timeout_s: float, poll_s: float = 0.05) -> None:
    """Poll until ``port`` listens on ``host``; raise :class:`SshdError` with sshd's log if it exits or the
    deadline passes."""
    deadline = time.monotonic() + timeout_s
    while not iperf.listening(host, port):
        if not iperf.alive(host, pid) or time.monotonic() > deadline:
            log = host.run(["cat", log_path], check=False, timeout=10).stdout.strip()[-600:]
            raise SshdError(f"sshd on {host.name} did not listen on port {port} within {timeout_s:g} s: {log}")
        time.sleep(poll_s)


def guarded(forced_command: Sequence[str], directory: str) -> list[str]:
    """``forced_command`` behind :data:`RECEIVE_GUARD` (written to ``directory``), run with the receiver's
    python3 in isolated mode."""
    return ["/usr/bin/python3", "-I", f"{directory}/receive_guard.py", *forced_command]


@contextmanager
def server(host: Host, address: str, forced_command: Sequence[str], *, port: int = DEFAULT_PORT,
           lifetime_s: float = 600.0, ready_timeout_s: float = 15.0, login_grace_s: float = LOGIN_GRACE_S,
           user: str = LOGIN_USER) -> Iterator[SshServer]:
    """sshd on ``host``, listening on ``address:port`` for the ``with`` block (see the module docstring).

    ``forced_command`` is what the client's key may run, behind :data:`RECEIVE_GUARD`; ``{dest}`` in it is
    replaced by the directory files may be written to. The client logs in as ``user`` (made when missing,
    :func:`~bbrlab.run.rxuser.receiver_user`; root with a note where it cannot be). Unauthenticated
    connections get ``login_grace_s``. A port already listening is refused (a stray server would take
    the run's connection). Stopped, and its directory removed, when the block ends, whatever happened.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValidationError("port", port, "a TCP port number from 1 to 65535")
    if iperf.listening(host, port):
        raise SshdError(f"port {port} on {host.name} is already in use (a stray sshd of an earlier run?)")
    account = rxuser.receiver_user(host, user) if user != ROOT else rxuser.AS_ROOT
    login, group, note = account.name, account.group, account.note
    with host.private_dir("sshd") as directory:
        command = guarded([part.replace("{dest}", f"{directory}/dest") for part in forced_command], directory)
        config = config_text(directory, address, port, login, max(1, round(login_grace_s)))
        host_pub, client_key = _setup(host, directory, config, key_options(command), login, group)
        log_path = f"{directory}/sshd.log"
        argv = ["timeout", "--kill-after=5", f"{lifetime_s:.0f}", SSHD, "-D", "-e", "-f", f"{directory}/sshd_config"]
        spawned = host.spawn_process(argv, log_path)
        try:
            wait_listening(host, port, spawned.pid, log_path, timeout_s=ready_timeout_s)
            yield SshServer(host, spawned.pid, address, port, directory, host_pub, client_key, login, note,
                            account.group)
        finally:
            iperf.stop(host, spawned.pid, start_ticks=spawned.start_ticks)
            kill_strays(host, port)  # a connection's own sshd process outlives the listener


def kill_strays(host: Host, port: int = DEFAULT_PORT) -> list[int]:
    """Kill (SIGKILL) sshd processes with a socket on ``port`` in ``host``'s network namespace (a killed
    run's server); return their pids. Found with ``ss -p``, so nothing outside that namespace is seen."""
    out = "".join(host.run(argv, check=False, timeout=20).stdout for argv in (
        ["ss", "-ltnpH", "(", "sport", "=", f":{port}", ")"], ["ss", "-tnpH", "(", "sport", "=", f":{port}", ")"]))
    pids = sorted({int(m.group(1)) for m in re.finditer(r'"sshd",pid=(\d+)', out)})
    for pid in pids:
        host.run(["kill", "-KILL", str(pid)], check=False, timeout=10)
    return pids
