"""Signals that end a measurement: SIGINT (Ctrl-C), SIGTERM (kill, a scheduler), SIGHUP (a dropped SSH session).

Inside :func:`interruptible` each of them raises :class:`Interrupted` in the main thread, wherever it is.
Because it is an exception, every ``finally`` and every context manager on the way out runs: the deadline
policy comes off the vCPU threads, the qdiscs come off the emulator, the iperf3 server and the sampler stop.
:class:`Interrupted` derives from ``BaseException``, so ``except Exception`` (a run's failure handling)
does not swallow it, and the campaign knows not to count the interrupted run as an attempt.

Python runs a signal's handler between two bytecodes of the main thread, wherever it is; when that is inside a
weakref callback or a ``__del__`` (the garbage collector runs them at any allocation), Python prints the
exception and drops it. The signal is then kept as pending, and :func:`checkpoint` (the campaign loop calls it
after each committed run) raises it there.

A second signal while the first is being handled does not raise again (that would cut the restoring
short); it is noted and the process ends once the restoring is done. Python only delivers signals to
the main thread; elsewhere :func:`interruptible` changes nothing. A process forked from ours inherits the
handler; there it ends the process as the default action would (:func:`die_as_default`).

A long command (a build step: debootstrap, make, mke2fs) is run with :func:`run_group`: it leads a process
group of its own, and when the call ends early (a signal's :class:`Interrupted`, a timeout) the whole group
is stopped, so nothing it started goes on writing into a work folder that is being removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: The signals that end a campaign (and the exit status a shell reports for each: 128 + number).
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def die_as_default(signum: int) -> None:
    """End this process as ``signum``'s default action would. For a process forked from one that installed a
    handler (libraries fork helpers, e.g. pyroute2 to open a socket in a network namespace): the handler
    must not run its owner's code there, which would carry on the owner's work in the helper."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # in case the default action is to ignore it


#: What a stop says of the run in flight when the signal was taken after a committed run (:func:`checkpoint`).
BETWEEN_RUNS = "it stopped between two runs, so no run was lost"


class Interrupted(BaseException):  # noqa: N818 - like KeyboardInterrupt, it names an event
    """A signal asked bbrlab to stop; ``signum`` is which one."""

    def __init__(self, signum: int, *, between_runs: bool = False):
        self.signum = signum
        self.between_runs = between_runs  # raised by checkpoint(): after a committed run, none in flight
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        """The exit status a shell gives a process this signal ended: 128 + ``signum`` (130 for SIGINT)."""
        return 128 + self.signum


_state = threading.local()


def _active() -> bool:
    return getattr(_state, "depth", 0) > 0


def checkpoint() -> None:
    """Raise :class:`Interrupted` here when a signal arrived inside :func:`interruptible` and its exception
    has not ended the work: Python dropped it (raised in a weakref callback or a ``__del__``). Once."""
    signum = getattr(_state, "pending", None)
    if signum is not None and _active():
        _state.pending = None
        raise Interrupted(signum, between_runs=True)


@contextmanager
def interruptible() -> Iterator[None]:
    """While active, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (once). Nests: an inner
    ``interruptible()`` inside an active one changes nothing. An ignored signal stays ignored."""
    if threading.current_thread() is not threading.main_thread() or _active():
        yield
        return
    raised: list[int] = []
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:
            die_as_default(signum)  # a fork of ours (pyroute2's namespace helper) ends as it would without us
        if raised:
            print(f"bbrlab: {signal.Signals(signum).name} received; still restoring the testbed",
                  file=sys.stderr, flush=True)
            return
        raised.append(signum)
        _state.pending = signum  # for checkpoint(), should Python drop the exception raised here
        raise Interrupted(signum)

    previous = {}
    for sig in HANDLED:
        prev = signal.getsignal(sig)
        if prev in (signal.SIG_IGN, None):
            continue
        previous[sig] = prev
        signal.signal(sig, handler)
    _state.depth, _state.pending = 1, None
    try:
        yield
    finally:
        _state.depth, _state.pending = 0, None
        for sig, prev in previous.items():
            signal.signal(sig, prev)


def raise_in_thread(thread_id: int, exc_type: type[BaseException]) -> bool:
    """Raise ``exc_type`` (a class taking no arguments) in thread ``thread_id`` at its next Python instruction,
    as a signal does in the main thread: the thread's ``finally`` blocks and context managers run on the way
    out. A thread blocked in a C call gets it when the call returns. True when the thread exists.

    The caller must make sure the thread is still in code that expects the exception, and that thread must
    call :func:`clear_pending` once it leaves that code (an exception not yet delivered would land elsewhere).
    """
    import ctypes

    n = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))
    if n > 1:  # cannot happen for one thread id; undo rather than hit several threads
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
    return n == 1


def clear_pending() -> None:
    """Drop an exception :func:`raise_in_thread` set for the calling thread and not yet delivered."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)


#: Seconds a stopped command's process group gets between SIGTERM and SIGKILL (make deletes its half-made
#: targets on SIGTERM).
STOP_GRACE_S = 5.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop ``proc`` (started with ``start_new_session=True``) and everything in its process group: SIGTERM,
    then SIGKILL to whatever is left after ``grace_s``; ``proc`` is reaped."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, else its zombie keeps the group "alive"
            if not _group_alive(pgid):
                break
            time.sleep(0.02)
        else:
            continue
        break
    proc.wait()


def run_group(argv: list[str], *, timeout: float | None = None, grace_s: float = STOP_GRACE_S,
              **popen_kw) -> subprocess.CompletedProcess:
    """Like :func:`subprocess.run` (``capture_output``, ``text``, ``cwd``, ``stdout`` ... as keywords), but the
    command leads its own process group, which is stopped as a whole (:func:`stop_group`) when the call
    ends early: :class:`Interrupted`, a timeout (:class:`subprocess.TimeoutExpired`, raised as ``run``
    raises it), any other exception."""
    if popen_kw.pop("capture_output", False):
        popen_kw.setdefault("stdout", subprocess.PIPE)
        popen_kw.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.Popen(argv, start_new_session=True, **popen_kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_group(proc, grace_s)
        raise
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@contextmanager
def restore_on_signals(restore: Callable[[], None]) -> Iterator[None]:
    """While active, SIGTERM, SIGINT and SIGHUP first call ``restore`` and then act as before.

    After restoring, a previous Python handler is called (inside a campaign: :mod:`bbrlab.core.signals`, which
    ends the run); otherwise SIGINT raises ``KeyboardInterrupt`` and SIGTERM/SIGHUP raise
    ``SystemExit(128 + signal)``, so ``finally`` blocks and outer
    context managers still run. An ignored signal stays ignored. Signals can only be handled in the
    main thread; elsewhere this does nothing (the ``finally`` of :func:`bbrlab.contention.deadline.contended` still restores
    on exceptions).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    busy = threading.Lock()

    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:  # a forked helper must not restore its parent's threads
            die_as_default(signum)
        if not busy.acquire(blocking=False):
            return  # a second signal while restoring: let the first one finish the job
        try:
            restore()
        finally:
            busy.release()
        prev = previous[signum]
        if callable(prev):
            prev(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        prev = signal.getsignal(sig)
        if prev in (signal.SIG_IGN, None):
            continue
        previous[sig] = prev
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)
