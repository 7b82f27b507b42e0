"""The bound every attempt of a run states, and what ends an attempt that outlives it on a Dask worker.

A run that hangs anywhere (a deadlock in the interpreter, a command whose timeout never fires, an SSH channel
that never answers) must not hold its testbed for good. Nothing inside the hung process can be trusted to
notice: a Python 3.11 worker deadlocked in the interpreter runs no Python at all, its timers included
(issue 35: 10 min 46 s in ``Thread.start()``). So the watchdog is the campaign's driver
(:class:`bbrlab.campaign.distributed.DaskExecutor`), and what it uses works without the hung process's help:

- each testbed worker arms, when it starts, a C-level stack dump on :data:`DUMP_SIGNAL` (``faulthandler``,
  which needs no GIL) into a file of its own working directory (:func:`arm_stack_dump`);
- when an attempt has run longer than its bound (:func:`attempt_bound_s`), the driver asks that worker's
  Nanny (a process of its own) to signal the worker, read the stacks and kill the worker
  (:func:`dump_and_kill`). The Nanny starts a new worker, whose plugin clears what the run left (the
  deadline policy, iperf3, the samplers) as after any killed worker; the driver records the attempt as
  failed with the stacks (``hang-stacks.txt`` in ``failed/<run_id>.a<N>/``) and the loop retries it.

A campaign on one testbed runs its attempts in its own main thread (:class:`bbrlab.campaign.loop.InProcess`):
there :func:`bounded` dumps every stack at the bound and raises :class:`AttemptHung` in the main thread through
a signal (which also ends a wait on a lock or a socket), so the run's own context managers restore the testbed
as for Ctrl-C, and the attempt is recorded failed. A hang that runs no Python in that process at all is
not ended there (no Dask profiler runs in it, the cause of the hang seen).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bbrlab.scenario.scenario import Scenario

#: What a run's setup and teardown may take beyond its transfer: the link, the clocks, the sampler, the
#: deadline policy, the server, copying the files back; measured overheads are 2-16 s on a 10 s run
#: (1.22-2.63x, issue 35), so this leaves an order of magnitude.
SETUP_ALLOWANCE_S = 180.0
#: The transfer's share of the bound: its limit times this (a sampled 10 s run took 2.29x its duration at the
#: median).
DURATION_FACTOR = 3.0
#: Added when the run names a sender kernel: the sender may be rebooted into it first
#: (:data:`bbrlab.testbed.local.lifecycle.SSH_DEADLINE_S`).
REBOOT_ALLOWANCE_S = 300.0
#: The signal a testbed worker dumps every thread's stack on.
DUMP_SIGNAL = signal.SIGUSR1
#: The dump's file name in the worker's working directory.
DUMP_FILE = "bbrlab-stacks.txt"
#: The most of the dump that goes into a record.
MAX_DUMP_BYTES = 256 * 1024
#: The signal :func:`bounded` ends a hung attempt in the main thread with.
HUNG_SIGNAL = signal.SIGUSR2
#: The file of a hung attempt's record with every thread's stack.
STACKS_FILE = "hang-stacks.txt"


class AttemptHung(BaseException):  # noqa: N818 - like Interrupted, it names an event
    """An attempt ran past its bound (:func:`bounded`). A ``BaseException``, so no ``except Exception`` of the
    run swallows it and goes on hanging; the campaign's executor records the attempt as failed."""

    def __init__(self, bound_s: float):
        self.bound_s = bound_s
        super().__init__(f"hung: the attempt ran past its bound of {bound_s:.0f} s; every thread's stack is "
                         f"in {STACKS_FILE}")


@contextmanager
def bounded(bound_s: float, stacks_dir: Path) -> Iterator[None]:
    """Run the block in this process's main thread for at most ``bound_s`` seconds: then a watchdog thread
    writes every thread's stack to ``stacks_dir``/:data:`STACKS_FILE` (``faulthandler``, which does not call
    ``sys._current_frames()``) and raises :class:`AttemptHung` in the main thread with :data:`HUNG_SIGNAL`,
    once. Elsewhere than in the main thread the block runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    done, fired, raised = threading.Event(), threading.Event(), []

    def on_signal(signum, frame):
        if fired.is_set() and not done.is_set() and not raised:
            raised.append(signum)
            raise AttemptHung(bound_s)

    def watch(main_id: int) -> None:
        if done.wait(bound_s):
            return
        with open(Path(stacks_dir) / STACKS_FILE, "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        fired.set()
        signal.pthread_kill(main_id, HUNG_SIGNAL)

    previous = signal.signal(HUNG_SIGNAL, on_signal)
    watcher = threading.Thread(target=watch, args=(threading.get_ident(),), name="bbrlab-attempt-watchdog",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(HUNG_SIGNAL, previous)
        if fired.is_set() and not raised:  # it ended as the bound came: no hang to keep stacks of
            (Path(stacks_dir) / STACKS_FILE).unlink(missing_ok=True)


def attempt_bound_s(scenario: Scenario) -> float:
    """The longest one attempt of ``scenario`` may take on its testbed, from its start to its outcome:
    :data:`SETUP_ALLOWANCE_S` + :data:`DURATION_FACTOR` x the transfer's own limit (what the runner gives the
    client: iperf3's duration + 15 s, rsync's ``transfer_timeout_s`` + 15 s, the flows beside it to their
    ends), + :data:`REBOOT_ALLOWANCE_S` when it names a sender kernel."""
    from bbrlab.run import iperf, workloads

    flow = scenario.flow
    limit_s = max([workloads.for_flow(flow).client_limit_s(flow)]
                  + [f.start_s + f.duration_s + iperf.CLIENT_MARGIN_S for f in scenario.flows])
    bound = SETUP_ALLOWANCE_S + DURATION_FACTOR * float(limit_s)
    return bound + (REBOOT_ALLOWANCE_S if scenario.kernel is not None else 0.0)


def arm_stack_dump(directory: str | Path) -> Path:
    """Have this process write every thread's stack to ``directory``/:data:`DUMP_FILE` on :data:`DUMP_SIGNAL`,
    from a C signal handler that runs even when no Python can (a deadlocked interpreter). The file is made
    anew, 0600, not through a symbolic link; it stays open for the process's life. Its path is returned."""
    path = Path(directory) / DUMP_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    faulthandler.register(DUMP_SIGNAL, file=os.fdopen(fd, "w"), all_threads=True, chain=False)
    return path


def dump_and_kill(dask_worker=None, settle_s: float = 2.0) -> dict:
    """``client.run(..., nanny=True)`` target, run in a testbed worker's Nanny: signal the worker to dump its
    stacks (:func:`arm_stack_dump`), read them once the file stops growing (at most ``settle_s``), then SIGKILL
    the worker. The Nanny starts a new one. Returns ``{"pid", "stacks"}`` (stacks '' when none came)."""
    nanny = dask_worker
    pid, workdir = nanny.pid, nanny.worker_dir
    stacks = ""
    if pid:
        path = Path(workdir or "") / DUMP_FILE
        before = _size(path)
        os.kill(pid, DUMP_SIGNAL)
        deadline, last = time.monotonic() + settle_s, before
        while time.monotonic() < deadline:
            time.sleep(0.1)
            size = _size(path)
            if size > before and size == last:
                break
            last = size
        stacks = _read_tail(path, before)
        os.kill(pid, signal.SIGKILL)
    return {"pid": pid, "stacks": stacks}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_tail(path: Path, start: int) -> str:
    """What was written to ``path`` after ``start`` bytes, at most :data:`MAX_DUMP_BYTES`."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(MAX_DUMP_BYTES).decode(errors="replace")
    except OSError:
        return ""
