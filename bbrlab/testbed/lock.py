"""The machine-wide lock of the shared local testbed (``/tmp/bbrlab-testbed.lock``).

Anything that boots the local testbed or sends traffic through it holds this lock, either with
``flock /tmp/bbrlab-testbed.lock <command>`` around a whole command or with :func:`testbed_lock`
in Python. A process already running under the lock (its own or an ancestor's ``flock``) must
not wait for itself, so :func:`testbed_lock` first asks ``/proc/locks`` who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator

from ..errors import TestbedError

LOCK_PATH = "/tmp/bbrlab-testbed.lock"


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def lock_holders(path: str = LOCK_PATH) -> set[int]:
    """Pids holding an flock on ``path`` (from /proc/locks)."""
    try:
        ino = os.stat(path).st_ino
    except FileNotFoundError:
        return set()
    holders = set()
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
                continue
            if int(parts[5].rsplit(":", 1)[1]) == ino:
                holders.add(int(parts[4]))
    return holders


def held_by_us(path: str = LOCK_PATH) -> bool:
    """True when this process or one of its ancestors holds the lock."""
    return bool(lock_holders(path) & _ancestors(os.getpid()))


@contextlib.contextmanager
def testbed_lock(timeout_s: float = 3600.0, path: str = LOCK_PATH, note=None) -> Iterator[None]:
    """Hold the testbed lock for the ``with`` block (re-entrant across our own process tree)."""
    if held_by_us(path):
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TestbedError(f"{path} still held by pid(s) {sorted(lock_holders(path))} after "
                                       f"{timeout_s:.0f} s") from None
                if not told:
                    print(f"waiting for the testbed lock {path} (held by pid(s) {sorted(lock_holders(path))})",
                          file=note or sys.stderr, flush=True)
                    told = True
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)  # releases the flock
