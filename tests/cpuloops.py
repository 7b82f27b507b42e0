"""Stand-ins for vCPU threads in the contention tests that run on this machine without QEMU: processes of one
thread each, pinned to one CPU (this process's last allowed one)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from bbrlab.contention import cgroups


def pinned(argv: list[str]) -> subprocess.Popen:
    """``argv`` started and pinned to this process's last allowed CPU."""
    p = subprocess.Popen(argv)
    os.sched_setaffinity(p.pid, {max(os.sched_getaffinity(0))})
    return p


@contextmanager
def busy_loop() -> Iterator[subprocess.Popen]:
    """One shell busy loop (one thread: the loop forks nothing) on one CPU, killed at the end; any bbrlab cgroup
    this process made is removed then too."""
    p = pinned(["sh", "-c", "while :; do :; done"])
    try:
        yield p
    finally:
        p.kill()
        p.wait()
        for own in cgroups.leftovers(include_live_owners=True):
            if own.entry.owner.pid == os.getpid():
                cgroups.remove(own)
