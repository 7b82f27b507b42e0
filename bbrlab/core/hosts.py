"""Running commands on a host: this machine, a network namespace on it, or an SSH host.

Commands are always argument lists. For SSH (and for invoke, which goes through a shell)
the list is joined with :func:`shlex.join`, so a value such as ``bbr; touch /tmp/x`` arrives
as one literal argument and is never interpreted by a shell.

``LocalHost`` uses invoke's ``Context``; ``SSHHost`` uses fabric's ``Connection`` with the
host key pinned from a known_hosts file (a host whose key is not there is refused).

Both are configured explicitly (:func:`invoke_config`, :func:`fabric_config`): no configuration file
(``/etc/invoke.yaml``, ``~/.invoke.yaml``, ``~/.fabric.yaml``, ``~/.ssh/config``, ...) and no
environment variable changes what bbrlab runs or how it connects: no dry run, no echo, no agent
forwarding, no gateway or proxy command.

A Ctrl-C (SIGINT) during a local command stops the command (SIGINT, then SIGKILL after
:data:`INTERRUPT_GRACE_S`) and raises ``KeyboardInterrupt`` in bbrlab; invoke alone would only pass
``^C`` to the command's stdin and wait on.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BbrlabError


@dataclass(frozen=True)
class Result:
    """What one command did."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class CommandError(BbrlabError):
    """A command exited non-zero (or timed out) where success was required."""

    def __init__(self, result: Result, note: str = ""):
        self.result = result
        tail = (result.stderr.strip() or result.stdout.strip())[-800:]
        what = note or f"exit code {result.exit_code}"
        super().__init__(f"[{result.host}] {shlex.join(result.argv)} failed ({what}): {tail}")


class CommandTimeout(CommandError):
    """A command did not finish within its timeout."""


class HeldCommand:
    """A command left running with its stdin open (:meth:`Host.hold_open`): it can tell us lines on its
    stdout, and it sees end of file on its stdin when we :meth:`close` it, or when this process dies (the
    kernel closes our end of the pipe, or the SSH connection). A lock held by such a command on a host
    lasts exactly as long as the process that asked for it."""

    def readline(self, timeout_s: float) -> str:
        """The next line the command prints ('' once it has exited without one)."""
        raise NotImplementedError

    def close(self, wait_s: float = 10.0) -> int | None:
        """End of file on the command's stdin; wait up to ``wait_s`` for it to exit; its exit code."""
        raise NotImplementedError


class _LocalHeld(HeldCommand):
    def __init__(self, argv: tuple[str, ...]):
        import subprocess

        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    def readline(self, timeout_s: float) -> str:
        import select

        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError(f"no line from {self._proc.args[0]} within {timeout_s} s")
        return self._proc.stdout.readline()

    def close(self, wait_s: float = 10.0) -> int | None:
        import subprocess

        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            return self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            return self._proc.wait()
        finally:
            self._proc.stdout.close()


class _SSHHeld(HeldCommand):
    def __init__(self, transport, command: str):
        self._chan = transport.open_session()
        self._chan.exec_command(command)
        self._buffer = b""

    def readline(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line from the command on the SSH channel within {timeout_s} s")
            self._chan.settimeout(left)
            try:
                chunk = self._chan.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                break
            self._buffer += chunk
        line, sep, self._buffer = self._buffer.partition(b"\n")
        return (line + sep).decode(errors="replace")

    def close(self, wait_s: float = 10.0) -> int | None:
        try:
            self._chan.shutdown_write()  # EOF on the command's stdin
            deadline = time.monotonic() + wait_s
            while not self._chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.02)
            return self._chan.recv_exit_status() if self._chan.exit_status_ready() else None
        except OSError:
            return None
        finally:
            self._chan.close()


#: Seconds a local command has to end after the SIGINT bbrlab forwards on Ctrl-C, before SIGKILL.
INTERRUPT_GRACE_S = 3.0

#: How bbrlab runs commands, whatever a user's configuration says (merged over invoke's defaults).
RUN_SETTINGS = {
    "dry": False, "echo": False, "echo_stdin": False, "hide": True, "warn": True, "pty": False, "fallback": False,
    "replace_env": False, "env": {}, "shell": "/bin/bash", "disown": False, "asynchronous": False, "watchers": [],
}


def invoke_config():
    """invoke's configuration for local commands: built-in defaults and :data:`RUN_SETTINGS` only.

    ``lazy=True`` reads no system or user file, and no ``INVOKE_*`` variable is loaded (that only
    happens through invoke's own command-line program)."""
    from invoke import Config

    return Config(lazy=True, overrides={"run": dict(RUN_SETTINGS), "timeouts": {"command": None},
                                        "sudo": {"password": None, "user": None}})


def fabric_config():
    """fabric's configuration for SSH hosts: no fabric file, no ssh_config, no agent forwarding, no gateway."""
    from fabric import Config
    from paramiko.config import SSHConfig

    return Config(lazy=True, ssh_config=SSHConfig(), overrides={
        "run": dict(RUN_SETTINGS), "timeouts": {"command": None, "connect": None}, "forward_agent": False,
        "gateway": None, "load_ssh_configs": False, "ssh_config_path": None, "connect_kwargs": {},
        "inline_ssh_env": True, "sudo": {"password": None, "user": None},
    })


def _interruptible_runner(context):
    """invoke's local runner for commands started in a process group of their own (see
    :meth:`LocalHost._execute`): on Ctrl-C it stops the whole group and then lets KeyboardInterrupt
    through; a timeout kills the whole group too, so no grandchild keeps the output pipes open."""
    from invoke.runners import Local

    class GroupLocal(Local):
        interrupted = False
        _kill_timer: threading.Timer | None = None

        def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
            first = not self.interrupted
            self.interrupted = True
            self._stop() if first else self._signal_group(signal.SIGKILL)

        def wait(self) -> None:
            try:
                super().wait()
            except KeyboardInterrupt:
                raise  # invoke calls send_interrupt and waits on
            except BaseException:  # another signal's exception (bbrlab.core.signals.Interrupted): stop, then unwind
                self._stop()
                raise

        def _stop(self) -> None:
            """SIGINT to the command's group now, SIGKILL after INTERRUPT_GRACE_S."""
            self._signal_group(signal.SIGINT)
            if self._kill_timer is None:
                self._kill_timer = threading.Timer(INTERRUPT_GRACE_S, self._signal_group, (signal.SIGKILL,))
                self._kill_timer.daemon = True
                self._kill_timer.start()

        def stop(self) -> None:
            if self._kill_timer is not None:  # the command ended: its pid may be reused, signal nothing more
                self._kill_timer.cancel()
            super().stop()

        def kill(self) -> None:
            self._signal_group(signal.SIGKILL)

        def _signal_group(self, sig: int) -> None:
            if self.process is not None:
                try:
                    os.killpg(self.process.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass  # the group is gone already

    return GroupLocal(context)


def _argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str):
        raise TypeError("commands are argument lists, not strings (use ['ip', 'link'], not 'ip link')")
    out = tuple(str(a) for a in argv)
    if not out:
        raise ValueError("empty command")
    return out


class Streaming:
    """A command started by :meth:`Host.stream`: its output goes into a file on this machine as it comes.

    :meth:`wait` says how it ended (its exit code) or None while it runs; :meth:`close` lets go of it (the
    command itself is stopped by whoever started it, e.g. through a stop file)."""

    def __init__(self, local_path: Path):
        self.local_path = Path(local_path)

    def wait(self, timeout_s: float | None = 0) -> int | None:
        """The exit code once the command has ended and its output is in the file; None if it still runs
        after ``timeout_s`` (0: do not wait; None: wait as long as it takes)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop reading its output (whatever it writes from now on is lost)."""


class _LocalStreaming(Streaming):
    """A process on this machine writing straight into the file."""

    def __init__(self, local_path: Path, process):
        super().__init__(local_path)
        self.process = process

    def wait(self, timeout_s: float | None = 0) -> int | None:
        import subprocess

        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class _ChannelStreaming(Streaming):
    """A command on an SSH host: a thread copies its channel's output into the file as it arrives, so
    neither the host nor this process holds more than the channel's window."""

    CHUNK_BYTES = 1 << 16

    def __init__(self, local_path: Path, channel):
        super().__init__(local_path)
        self.channel = channel
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._copy, name=f"bbrlab-stream-{self.local_path.name}", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        try:
            with open(self.local_path, "ab") as out:
                while data := self.channel.recv(self.CHUNK_BYTES):
                    out.write(data)
                    out.flush()
            self.exit_code = self.channel.recv_exit_status()
        except BaseException as e:  # noqa: BLE001 - reported by wait() in the caller's thread
            self.error = e

    def wait(self, timeout_s: float | None = 0) -> int | None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return None
        if self.error is not None:
            raise BbrlabError(f"the output of a command could not be copied into {self.local_path}: "
                              f"{self.error}") from self.error
        return self.exit_code

    def close(self) -> None:
        self.channel.close()
        self._thread.join(10)


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
        cmd = shlex.join(_argv(argv))
        script = f"nohup setsid {cmd} > {shlex.quote(log_path)} 2>&1 < /dev/null & echo $!"
        return int(self.output(["sh", "-c", script], sudo=sudo, timeout=30))

    def stream(self, argv: Sequence[str], local_path: str | Path) -> Streaming:
        """Start ``argv`` and put its output (stdout and stderr) into ``local_path`` on THIS machine while it
        runs (the file is truncated first): the host keeps none of it, however long it runs."""
        raise NotImplementedError

    def read_text(self, path: str, *, sudo: bool = False) -> str:
        return self.run(["cat", path], sudo=sudo).stdout

    def write_text(self, path: str, text: str, *, sudo: bool = False) -> None:
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
        world-writable directory that another user could plant a link at."""
        if not purpose.isidentifier():
            raise ValueError(f"purpose must be a short identifier, not {purpose!r}")
        path = self.output(["mktemp", "-d", "-t", f"bbrlab-{purpose}.XXXXXXXX"], timeout=30)
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
        return self.run(["test", "-e", path], check=False).ok

    def sysctl(self, key: str) -> str:
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
        shutil.copyfile(remote_path, local_path)

    def stream(self, argv: Sequence[str], local_path: str | Path) -> Streaming:
        """The command in a session of its own (its pid leads its process group), output into the file."""
        import subprocess

        with open(local_path, "wb") as out:
            process = subprocess.Popen([*self.prefix, *_argv(argv)], stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        return _LocalStreaming(Path(local_path), process)


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
            # Pin host keys: only what the testbed recorded is trusted, nothing is added silently.
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            if self.known_hosts:
                client.load_host_keys(os.path.expanduser(self.known_hosts))
            else:
                client.load_system_host_keys()
            self._conn = conn
        return self._conn

    def _execute(self, argv, *, timeout, stdin):
        from invoke.exceptions import CommandTimedOut

        kw = dict(hide=True, warn=True, in_stream=False, pty=False)
        if stdin is not None:
            import io

            kw["in_stream"] = io.StringIO(stdin)
        try:
            r = self._connection().run(shlex.join(argv), timeout=timeout, **kw)
        except CommandTimedOut as e:
            return -1, e.result.stdout, e.result.stderr, True
        return r.exited, r.stdout, r.stderr, False

    def _is_root(self) -> bool:
        return self.user == "root"

    def _hold_open(self, argv: tuple[str, ...]) -> HeldCommand:
        conn = self._connection()
        conn.open()
        return _SSHHeld(conn.client.get_transport(), shlex.join(argv))

    def put(self, local_path: str | Path, remote_path: str) -> None:
        self._connection().put(str(local_path), remote_path)

    def get(self, remote_path: str, local_path: str | Path) -> None:
        self._connection().get(remote_path, str(local_path))

    def stream(self, argv: Sequence[str], local_path: str | Path) -> Streaming:
        """The command on a channel of its own (sshd makes it a session leader); its stdout and stderr are
        copied into the file by a thread as they arrive."""
        Path(local_path).write_bytes(b"")
        conn = self._connection()
        conn.open()
        channel = conn.client.get_transport().open_session()
        channel.set_combine_stderr(True)
        channel.exec_command(shlex.join(_argv(argv)))
        return _ChannelStreaming(Path(local_path), channel)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def local_user() -> str:
    return getpass.getuser()

