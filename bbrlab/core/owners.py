"""Who made a leftover, and whether that process is gone: the test behind every sweep of things a killed
bbrlab process left (a half-built cache entry, a run's private directory on a receiver).

A process is named by its pid *and* its start time (``/proc/<pid>/stat``, clock ticks since boot), so a
pid the kernel handed to a new process since is not taken for the old one; and by the machine and the
boot it ran in (``/etc/machine-id``, ``/proc/sys/kernel/random/boot_id``), so an owner on another
machine is never judged from here, and an owner from before a reboot is known to be gone.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from functools import lru_cache

#: How a stamp starts; the rest is ``machine boot pid start_ticks``.
STAMP_WORD = "bbrlab-owner"
_STAMP = re.compile(rf"^{STAMP_WORD} ([0-9A-Za-z._-]{{1,64}}) ([0-9a-f-]{{1,64}}) (\d{{1,10}}) (\d{{1,20}})$")


@lru_cache(maxsize=1)
def machine_id() -> str:
    """This machine's id (``/etc/machine-id``; the host name where there is none)."""
    try:
        text = open("/etc/machine-id").read().strip()
    except OSError:
        text = ""
    return text if re.fullmatch(r"[0-9A-Za-z._-]{1,64}", text) else re.sub(r"[^0-9A-Za-z._-]", "_",
                                                                           socket.gethostname())[:64] or "-"


def boot_id() -> str:
    """This boot's id (changes at every boot)."""
    return open("/proc/sys/kernel/random/boot_id").read().strip()


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, ticks: int) -> bool:
    """True while the process that had ``pid`` and started at ``ticks`` still runs (not a recycled pid)."""
    return pid > 0 and start_ticks(pid) == ticks


@dataclass(frozen=True)
class Owner:
    """A process on some machine: what a leftover is stamped with."""

    machine: str
    boot: str
    pid: int
    ticks: int

    @classmethod
    def current(cls) -> Owner:
        """This process."""
        pid = os.getpid()
        return cls(machine_id(), boot_id(), pid, start_ticks(pid) or 0)

    def stamp(self) -> str:
        """One line: ``bbrlab-owner <machine> <boot> <pid> <start ticks>``."""
        return f"{STAMP_WORD} {self.machine} {self.boot} {self.pid} {self.ticks}"

    @classmethod
    def parse(cls, line: str) -> Owner | None:
        """The owner a stamp line names, or None for anything else."""
        m = _STAMP.match(line.strip())
        return cls(m.group(1), m.group(2), int(m.group(3)), int(m.group(4))) if m else None

    def gone(self) -> bool:
        """True when this process certainly no longer runs: it ran on this machine, and either in an earlier
        boot or its pid now names no process or another one. An owner on another machine is never gone here
        (nothing here can tell)."""
        if self.machine != machine_id():
            return False
        return self.boot != boot_id() or not alive(self.pid, self.ticks)


def users_of(path: str | os.PathLike) -> list[int]:
    """Processes on this machine still working in the folder ``path``: their command line names something
    inside it, or their working directory is inside it (an orphaned build step of a killed build)."""
    folder = os.fsencode(os.path.realpath(path))
    inside = folder + b"/"
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            args = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            cwd = os.fsencode(os.readlink(f"/proc/{entry}/cwd"))
        except OSError:
            continue  # gone, or a kernel thread
        if cwd == folder or cwd.startswith(inside) or any(a == folder or inside in a for a in args):
            found.append(int(entry))
    return sorted(found)
