"""Commands as bbrlab runs them, on any host: their result and errors, a command held open while a block
runs, output streamed line by line, and the explicit invoke/fabric configuration every command gets.

The hosts that run them are :mod:`bbrlab.core.hosts`. Both are configured explicitly
(:func:`invoke_config`, :func:`fabric_config`): no configuration file and no environment variable changes
what bbrlab runs or how it connects. A Ctrl-C (SIGINT) during a local command stops the command (SIGINT,
then SIGKILL after :data:`INTERRUPT_GRACE_S`) and raises ``KeyboardInterrupt`` in bbrlab.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
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
        """Whether the command exited with status 0."""
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

    def send(self, text: str) -> None:
        """Write ``text`` to the command's stdin at once (no buffering on our side)."""
        raise NotImplementedError

    def close(self, wait_s: float = 10.0) -> int | None:
        """End of file on the command's stdin; wait up to ``wait_s`` for it to exit; its exit code."""
        raise NotImplementedError

    def gone(self) -> str | None:
        """Why the command no longer runs for us (it exited, its SSH connection closed), or None while it does.
        Asks nothing of the host: what this side has been told."""
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

    def send(self, text: str) -> None:
        self._proc.stdin.write(text)
        self._proc.stdin.flush()

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

    def gone(self) -> str | None:
        code = self._proc.poll()
        return None if code is None else f"it exited (status {code})"


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

    def send(self, text: str) -> None:
        self._chan.sendall(text.encode())

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

    def gone(self) -> str | None:
        transport = self._chan.get_transport()
        if transport is None or not transport.is_active():
            return "its SSH connection is closed"
        if self._chan.exit_status_ready():
            return f"it exited on the host (status {self._chan.recv_exit_status()}; -1: killed by a signal)"
        if self._chan.closed or self._chan.eof_received:
            return "its SSH channel was closed"
        return None


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
        "runners": {"remote": interruptible_remote()},
    })


def interruptible_remote():
    """fabric's remote runner, which a signal's exception (:class:`bbrlab.core.signals.Interrupted`) ends at once.

    invoke waits for a command's output readers before the exception leaves ``run``, and a reader waits for the
    SSH channel's end of file, so a signalled campaign used to wait for the remote command to finish: 38 s of an
    rsync copy (2026-12-02). Here the channel is closed first; the readers see its end and the exception unwinds.
    The remote command is not waited for: the run's own clean-up (the receiver's sshd killed, the deadline
    policy removed) ends what depends on it. Ctrl-C that reaches invoke as KeyboardInterrupt is left to invoke."""
    from fabric.runners import Remote

    class InterruptibleRemote(Remote):
        def wait(self) -> None:
            try:
                super().wait()
            except KeyboardInterrupt:
                raise
            except BaseException:
                channel = getattr(self, "channel", None)
                if channel is not None:
                    with contextlib.suppress(Exception):
                        channel.close()
                raise

    return InterruptibleRemote


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
    command itself is stopped by whoever started it, e.g. through a stop file). With a byte cap
    (``max_bytes``) at most that many bytes reach the file: the rest is not read, the command's output is cut
    (it gets SIGPIPE at its next write; a command on this machine is killed), ``capped`` turns True and
    :meth:`wait` gives :data:`CAPPED_EXIT`."""

    capped: bool = False

    def __init__(self, local_path: Path):
        self.local_path = Path(local_path)

    def wait(self, timeout_s: float | None = 0) -> int | None:
        """The exit code once the command has ended and its output is in the file; None if it still runs
        after ``timeout_s`` (0: do not wait; None: wait as long as it takes)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop reading its output (whatever it writes from now on is lost)."""


#: What :meth:`Streaming.wait` gives for a command whose output reached the byte cap (no exit code is one).
CAPPED_EXIT = -1
COPY_CHUNK_BYTES = 1 << 16


def copy_capped(read, out, max_bytes: int | None) -> bool:
    """Copy chunks from ``read(n)`` into the open file ``out`` until ``read`` gives nothing or ``max_bytes`` have
    been written; True when the cap ended it (bytes beyond it are not read)."""
    written = 0
    while data := read(COPY_CHUNK_BYTES):
        if max_bytes is not None and written + len(data) > max_bytes:
            out.write(data[:max_bytes - written])
            out.flush()
            return True
        out.write(data)
        out.flush()
        written += len(data)
    return False


class _LocalStreaming(Streaming):
    """A process on this machine writing straight into the file, or (with a byte cap) into a pipe a thread
    copies into the file up to the cap."""

    def __init__(self, local_path: Path, process, max_bytes: int | None = None):
        super().__init__(local_path)
        self.process = process
        self._thread = None
        if process.stdout is not None:
            self._thread = threading.Thread(target=self._copy, args=(max_bytes,), daemon=True,
                                            name=f"bbrlab-stream-{self.local_path.name}")
            self._thread.start()

    def _copy(self, max_bytes: int | None) -> None:
        with open(self.local_path, "ab") as out:
            self.capped = copy_capped(lambda n: os.read(self.process.stdout.fileno(), n), out, max_bytes)
        if self.capped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.stdout.close()

    def wait(self, timeout_s: float | None = 0) -> int | None:
        import subprocess

        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return None
        return CAPPED_EXIT if self.capped else code

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self._thread is not None:
            self._thread.join(10)


class _ChannelStreaming(Streaming):
    """A command on an SSH host: a thread copies its channel's output into the file as it arrives (up to the
    byte cap), so neither the host nor this process holds more than the channel's window."""

    CHUNK_BYTES = COPY_CHUNK_BYTES

    def __init__(self, local_path: Path, channel, max_bytes: int | None = None):
        super().__init__(local_path)
        self.channel = channel
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._copy, args=(max_bytes,), daemon=True,
                                        name=f"bbrlab-stream-{self.local_path.name}")
        self._thread.start()

    def _copy(self, max_bytes: int | None) -> None:
        try:
            with open(self.local_path, "ab") as out:
                self.capped = copy_capped(self.channel.recv, out, max_bytes)
            if self.capped:
                self.channel.close()  # the command's next write fails: it ends (SIGPIPE)
                self.exit_code = CAPPED_EXIT
            else:
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
