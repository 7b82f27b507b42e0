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
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from pathlib import Path

from bbrlab.core.scenario import Scenario

#: What a run's setup and teardown may take beyond its transfer: the link, the clocks, the sampler, the
#: deadline policy, the server, copying the files back; measured overheads are 2-16 s on a 10 s run
#: (1.22-2.63x, issue 35), so this leaves an order of magnitude.
SETUP_ALLOWANCE_S = 180.0
#: The transfer's share of the bound: its duration times this (a sampled 10 s run took 2.29x at the median).
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


def attempt_bound_s(scenario: Scenario) -> float:
    """The longest one attempt of ``scenario`` may take on its testbed, from its start to its outcome:
    :data:`SETUP_ALLOWANCE_S` + :data:`DURATION_FACTOR` x the transfer's duration, + :data:`REBOOT_ALLOWANCE_S`
    when it names a sender kernel."""
    bound = SETUP_ALLOWANCE_S + DURATION_FACTOR * float(scenario.flow.duration_s)
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
