"""Running commands on a host: this machine, a network namespace on it, or an SSH host.

Commands are always argument lists. For SSH (and for invoke, which goes through a shell)
the list is joined with :func:`shlex.join`, so a value such as ``bbr; touch /tmp/x`` arrives
as one literal argument and is never interpreted by a shell.

``LocalHost`` uses invoke's ``Context``; ``SSHHost`` uses fabric's ``Connection`` with the
host key pinned from a known_hosts file (a host whose key is not there is refused). Every SSH connection sends
a keepalive after :data:`KEEPALIVE_S` seconds of silence, and the kernel gives it up once data has gone
unacknowledged for :data:`DEAD_AFTER_S` seconds: a firewall or NAT keeps an idle connection (and with it the
lock a lab host holds for us, :mod:`bbrlab.testbed.hostlock`), and a dead one is noticed rather than waited on.

Both are configured explicitly (:func:`invoke_config`, :func:`fabric_config`): no configuration file
(``/etc/invoke.yaml``, ``~/.invoke.yaml``, ``~/.fabric.yaml``, ``~/.ssh/config``, ...) and no
environment variable changes what bbrlab runs or how it connects: no dry run, no echo, no agent
forwarding, no gateway or proxy command.

A Ctrl-C (SIGINT) during a local command stops the command (SIGINT, then SIGKILL after
:data:`bbrlab.core.commands.INTERRUPT_GRACE_S`) and raises ``KeyboardInterrupt`` in bbrlab; invoke alone would only pass
``^C`` to the command's stdin and wait on.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import owners
from .commands import (
    CommandError,
    CommandTimeout,
    HeldCommand,
    Result,
    Streaming,
    _argv,
    _ChannelStreaming,
    _interruptible_runner,
    _LocalHeld,
    _LocalStreaming,
    _SSHHeld,
    fabric_config,
    invoke_config,
)
from .errors import BbrlabError
from .ownedpids import KILL_OURS_SH, Spawned, parse_pid_line

#: Seconds of silence on an SSH connection before a keepalive goes out (paramiko's transport keepalive).
KEEPALIVE_S = 10
#: Seconds data (a keepalive) may go unacknowledged before the kernel closes the connection (TCP_USER_TIMEOUT).
DEAD_AFTER_S = 60


#: $1 the mktemp template, $2 the owner stamp: a fresh 0700 directory with the stamp as its first file; its path.
_PRIVATE_DIR_SH = 'd=$(mktemp -d -t "$1") && umask 077 && printf "%s\\n" "$2" > "$d/owner" && printf "%s\\n" "$d"'


@dataclass
class Host:
    """Something that runs commands. Subclasses implement :meth:`_execute`."""

    name: str

    is_local: bool = field(default=False, init=False)

    # -- the verbs -------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = 60,
        check: bool = True,
        sudo: bool = False,
        stdin: str | None = None,
    ) -> Result:
        """Run ``argv`` to completion. ``check`` raises :class:`CommandError` on failure."""
        args = _argv(argv)
        if sudo and not self._is_root():
            args = ("sudo", "-n", *args)
        t0 = time.monotonic()
        code, out, err, timed_out = self._execute(args, timeout=timeout, stdin=stdin)
        res = Result(self.name, args, code, out, err, time.monotonic() - t0)
        if timed_out:
            raise CommandTimeout(res, f"timed out after {timeout} s")
        if check and not res.ok:
            raise CommandError(res)
        return res

    def output(self, argv: Sequence[str], **kw) -> str:
        """Run and return stdout, stripped."""
        return self.run(argv, **kw).stdout.strip()

    def spawn(self, argv: Sequence[str], log_path: str, *, sudo: bool = False) -> int:
        """Start ``argv`` in the background, detached, output to ``log_path``; return its pid."""
        return self.spawn_process(argv, log_path, sudo=sudo).pid

    def spawn_process(self, argv: Sequence[str], log_path: str, *, sudo: bool = False) -> Spawned:
        """:meth:`spawn`, returning the pid with the process's start ticks: what a later stop checks before it
        sends SIGKILL (:mod:`bbrlab.core.ownedpids`)."""
        cmd = shlex.join(_argv(argv))
        script = (KILL_OURS_SH + f"nohup setsid {cmd} > {shlex.quote(log_path)} 2>&1 < /dev/null &\n"
                  'pid_line $!')
        return parse_pid_line(self.output(["sh", "-c", script], sudo=sudo, timeout=30), f"spawn of {argv[0]}")

    def stream(self, argv: Sequence[str], local_path: str | Path, *, max_bytes: int | None = None) -> Streaming:
        """Start ``argv`` and put its output (stdout and stderr) into ``local_path`` on THIS machine while it
        runs (the file is truncated first): the host keeps none of it, however long it runs. With ``max_bytes``
        the file gets at most that many bytes and the command's output is cut there (:class:`Streaming`)."""
        raise NotImplementedError

    def read_text(self, path: str, *, sudo: bool = False) -> str:
        """The whole text of file ``path`` on the host (``cat``, as root with ``sudo``); raises
        :class:`CommandError` when it cannot be read."""
        return self.run(["cat", path], sudo=sudo).stdout

    def write_text(self, path: str, text: str, *, sudo: bool = False) -> None:
        """Replace file ``path`` on the host with ``text``, fed to ``cat`` on its stdin (as root with
        ``sudo``). For sysfs and procfs values use :meth:`write_value`."""
        self.run(["sh", "-c", 'cat > "$1"', "sh", path], stdin=text, sudo=sudo)

    def write_value(self, path: str, value: object, *, sudo: bool = False) -> None:
        """Write one short value to a pseudo-file (sysfs, procfs) in ONE write() call, as an argument.

        :meth:`write_text` streams stdin, which invoke forwards a byte at a time: ``cat`` can then write
        ``2`` and the newline separately, and the kernel refuses the lone newline (EINVAL).
        """
        self.run(["sh", "-c", 'printf "%s\\n" "$2" > "$1"', "sh", path, str(value)], sudo=sudo)

    @contextmanager
    def private_dir(self, purpose: str) -> Iterator[str]:
        """A fresh directory only we can use (``mktemp -d``: unpredictable name, mode 0700), removed at
        the end of the ``with`` block. Per-run files (logs, stop files) go there, never at names in a
        world-writable directory that another user could plant a link at. Its first file, ``owner``, written
        in the same command, names this process, so that a run killed outright leaves nothing that the next
        campaign's recovery does not remove (:mod:`bbrlab.core.leftdirs`)."""
        if not purpose.isidentifier():
            raise ValueError(f"purpose must be a short identifier, not {purpose!r}")
        path = self.output(["sh", "-c", _PRIVATE_DIR_SH, "bbrlab-mktemp", f"bbrlab-{purpose}.XXXXXXXX",
                            owners.Owner.current().stamp()], timeout=30)
        if not path.startswith("/"):
            raise BbrlabError(f"[{self.name}] mktemp -d printed {path!r}, not a directory path")
        try:
            yield path
        finally:
            self.run(["rm", "-rf", "--one-file-system", "--", path], check=False, timeout=30)

    def hold_open(self, argv: Sequence[str], *, sudo: bool = False) -> HeldCommand:
        """Start ``argv`` and keep it running with its stdin open until :meth:`HeldCommand.close` (or until
        this process ends). For what must last exactly as long as we do, such as a lock held on the host."""
        args = _argv(argv)
        if sudo and not self._is_root():
            args = ("sudo", "-n", *args)
        return self._hold_open(args)

    def _hold_open(self, argv: tuple[str, ...]) -> HeldCommand:
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists on the host (``test -e``, as the connecting user)."""
        return self.run(["test", "-e", path], check=False).ok

    def sysctl(self, key: str) -> str:
        """The value of sysctl ``key`` on the host (``sysctl -n``, stripped); raises :class:`CommandError` for
        an unknown key."""
        return self.output(["sysctl", "-n", key])

    # -- to implement ----------------------------------------------------------------------
    def _execute(self, argv: tuple[str, ...], *, timeout, stdin) -> tuple[int, str, str, bool]:
        raise NotImplementedError

    def _is_root(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (no-op for local hosts)."""


@dataclass
class LocalHost(Host):
    """This machine, through invoke's ``Context``. ``prefix`` wraps every command (e.g. netns)."""

    name: str = "localhost"
    prefix: tuple[str, ...] = ()

    def __post_init__(self):
        self.is_local = True

    def _execute(self, argv, *, timeout, stdin):
        from invoke import Context
        from invoke.exceptions import CommandTimedOut

        # setsid: the command leads a process group of its own (invoke's shell execs into it), which
        # the runner can stop as a whole on Ctrl-C or a timeout.
        cmd = "exec setsid --wait " + shlex.join((*self.prefix, *argv))
        kw = dict(hide=True, warn=True, in_stream=False, pty=False)
        if stdin is not None:
            import io

            kw["in_stream"] = io.StringIO(stdin)
        runner = _interruptible_runner(Context(config=invoke_config()))
        try:
            r = runner.run(cmd, timeout=timeout, **kw)
        except CommandTimedOut as e:
            return -1, e.result.stdout, e.result.stderr, True
        finally:
            if runner.interrupted:  # the command is stopped; now the Ctrl-C is bbrlab's
                raise KeyboardInterrupt
        return r.exited, r.stdout, r.stderr, False

    def _is_root(self) -> bool:
        return os.geteuid() == 0

    def _hold_open(self, argv: tuple[str, ...]) -> HeldCommand:
        return _LocalHeld((*self.prefix, *argv))

    def put(self, local_path: str | Path, remote_path: str) -> None:
        """Copy a file here, keeping its mode (as fabric's ``put`` does for an SSH host)."""
        shutil.copyfile(local_path, remote_path)
        shutil.copymode(local_path, remote_path)

    def get(self, remote_path: str, local_path: str | Path) -> None:
        """Copy file ``remote_path`` of this machine to ``local_path`` (contents only, not the mode)."""
        shutil.copyfile(remote_path, local_path)

    def stream(self, argv: Sequence[str], local_path: str | Path, *, max_bytes: int | None = None) -> Streaming:
        """The command in a session of its own (its pid leads its process group), output into the file (through
        a pipe and a copying thread with ``max_bytes``)."""
        import subprocess

        with open(local_path, "wb") as out:
            process = subprocess.Popen([*self.prefix, *_argv(argv)], stdin=subprocess.DEVNULL,
                                       stdout=out if max_bytes is None else subprocess.PIPE,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        return _LocalStreaming(Path(local_path), process, max_bytes)


@dataclass
class NetnsHost(LocalHost):
    """A network namespace on this machine (``ip netns exec NS``): a receiver without a VM."""

    netns: str = ""

    def __post_init__(self):
        super().__post_init__()
        if not self.netns:
            raise ValueError("NetnsHost needs a netns name")
        self.prefix = ("ip", "netns", "exec", self.netns)


@dataclass
class SSHHost(Host):
    """A host reached over SSH with fabric. The host key must be in ``known_hosts``."""

    address: str = ""
    user: str = "root"
    port: int = 22
    key_path: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: float = 10.0

    def __post_init__(self):
        self._conn = None
        self._pinned = None  # the known_hosts file's (inode, size, mtime) when its keys were read

    def _pin_state(self) -> tuple | None:
        """The ``known_hosts`` file's (inode, size, mtime), or None without one: it changes when the testbed
        pins a new host key, which it does when it boots the VM afresh (a campaign's block, in any process)."""
        if not self.known_hosts:
            return None
        try:
            st = os.stat(os.path.expanduser(self.known_hosts))
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _connection(self):
        if self._conn is None:
            import paramiko
            from fabric import Connection

            kwargs = {"look_for_keys": False, "allow_agent": self.key_path is None}
            if self.key_path:
                kwargs["key_filename"] = [self.key_path]
            conn = Connection(
                host=self.address, user=self.user, port=self.port, config=fabric_config(),
                connect_timeout=self.connect_timeout_s, connect_kwargs=kwargs, forward_agent=False,
            )
            client = conn.client
            # Pin host keys: only what the testbed recorded is trusted, nothing is added silently. A
            # ``known_hosts`` file is read by _opened() before each new connection; without one, the system's.
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            if not self.known_hosts:
                client.load_system_host_keys()
            self._conn = conn
        return self._conn

    def _opened(self):
        """The connection, open (a new one when it had closed), with keepalives on (:func:`keep_alive`). A new
        connection reads the pinned key from ``known_hosts`` again: a VM booted afresh (a campaign's block) gets
        a new host key that the testbed pins in that file, and a key read once would refuse it."""
        conn = self._connection()
        pinned = self._pin_state()
        if conn.is_connected and pinned != self._pinned:
            conn.close()  # the VM was booted afresh: this connection was to its old boot, dead or not yet noticed
        if not conn.is_connected:
            conn.close()  # one that died on its own still holds fabric's SFTP session on its dead transport
            if self.known_hosts:
                conn.client.get_host_keys().clear()
                conn.client.load_host_keys(os.path.expanduser(self.known_hosts))
                self._pinned = pinned
        conn.open()
        keep_alive(conn.client.get_transport())
        return conn

    def _execute(self, argv, *, timeout, stdin):
        from invoke.exceptions import CommandTimedOut

        kw = dict(hide=True, warn=True, in_stream=False, pty=False)
        if stdin is not None:
            import io

            kw["in_stream"] = io.StringIO(stdin)
        try:
            r = self._opened().run(shlex.join(argv), timeout=timeout, **kw)
        except CommandTimedOut as e:
            return -1, e.result.stdout, e.result.stderr, True
        return r.exited, r.stdout, r.stderr, False

    def _is_root(self) -> bool:
        return self.user == "root"

    def _hold_open(self, argv: tuple[str, ...]) -> HeldCommand:
        conn = self._opened()
        return _SSHHeld(conn.client.get_transport(), shlex.join(argv))

    def put(self, local_path: str | Path, remote_path: str) -> None:
        """Copy local file ``local_path`` to ``remote_path`` on the host over SFTP (fabric keeps its mode)."""
        self._opened().put(str(local_path), remote_path)

    def get(self, remote_path: str, local_path: str | Path) -> None:
        """Copy file ``remote_path`` of the host to ``local_path`` on this machine over SFTP."""
        self._opened().get(remote_path, str(local_path))

    def stream(self, argv: Sequence[str], local_path: str | Path, *, max_bytes: int | None = None) -> Streaming:
        """The command on a channel of its own (sshd makes it a session leader); its stdout and stderr are
        copied into the file by a thread as they arrive, up to ``max_bytes``."""
        Path(local_path).write_bytes(b"")
        conn = self._opened()
        channel = conn.client.get_transport().open_session()
        channel.set_combine_stderr(True)
        channel.exec_command(shlex.join(_argv(argv)))
        return _ChannelStreaming(Path(local_path), channel, max_bytes)

    def close(self) -> None:
        """Close the SSH connection if one is open; the next command opens a new one."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def keep_alive(transport) -> None:
    """Keepalives on an SSH ``transport`` (once per transport): an SSH keepalive after :data:`KEEPALIVE_S` s of
    silence, TCP keepalives on its socket, and TCP_USER_TIMEOUT of :data:`DEAD_AFTER_S` s, so a connection
    whose peer is gone fails within about a minute instead of TCP's quarter of an hour."""
    import socket

    if transport is None or getattr(transport, "_bbrlab_keepalive", False):
        return
    transport.set_keepalive(KEEPALIVE_S)
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", KEEPALIVE_S),
                            ("TCP_KEEPCNT", max(1, DEAD_AFTER_S // KEEPALIVE_S)),
                            ("TCP_USER_TIMEOUT", DEAD_AFTER_S * 1000)):
            if hasattr(socket, name):
                options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
        for level, option, value in options:
            try:
                sock.setsockopt(level, option, value)
            except OSError:  # a socket that is not TCP (a proxy's): the SSH keepalive still goes out
                break
    transport._bbrlab_keepalive = True


def local_user() -> str:
    """This machine's user name as :func:`getpass.getuser` gives it (``$LOGNAME``, ``$USER``, ..., else the
    password database entry of this process's uid)."""
    return getpass.getuser()

