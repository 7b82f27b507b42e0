"""Signalling a process bbrlab started, never another that was handed its pid since.

A pid kept from a spawn (or read from a pid file) names the process bbrlab started only while that process
runs: once it has ended, the kernel may give the number to any new process. So a stop that waits for a
process and then sends SIGKILL to its pid (or its session) checks first that the pid still names the process
that started at the same time (``/proc/<pid>/stat``, clock ticks since boot; see :mod:`bbrlab.core.owners`).

- :class:`Spawned`: a started process's pid and start ticks.
- :data:`KILL_OURS_SH`: the shell functions ``start_ticks PID``, ``same PID TICKS`` and ``kill_ours PID TICKS`` for scripts run on
  a host (a guest, over SSH), pasted before the script that uses them.
- :func:`signal_if_same`: the same check here, in Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import owners


@dataclass(frozen=True)
class Spawned:
    """A process started in the background: its ``pid`` and ``start_ticks`` (None where they could not be
    read: the process had already ended)."""

    pid: int
    start_ticks: int | None


#: ``start_ticks PID`` prints when PID started (field 22 of /proc/PID/stat; the fields are counted after the
#: command name's closing parenthesis, as a name may hold spaces), or nothing when there is no such process.
#: ``same PID TICKS`` succeeds while PID names the process that started at TICKS (always, for an empty TICKS).
#: ``kill_ours PID TICKS`` sends SIGKILL to PID's process group and to PID when PID still names the process
#: that started at TICKS; otherwise (it ended, and the pid may be another's now) it sends nothing. An empty
#: TICKS (a caller that could not read them) kills as before: the group and the pid.
KILL_OURS_SH = r"""
start_ticks() {
    line=
    read -r line < "/proc/$1/stat" 2>/dev/null || return 0
    set -- ${line##*) }
    echo "${20}"
}
same() {
    [ -z "$2" ] || [ "$(start_ticks "$1")" = "$2" ]
}
kill_ours() {
    same "$1" "$2" || return 0
    kill -KILL -- "-$1" 2>/dev/null; kill -KILL "$1" 2>/dev/null
    return 0
}
"""


def signal_if_same(pid: int, ticks: int | None, sig: int) -> bool:
    """Send ``sig`` to ``pid`` when it still names the process that started at ``ticks`` (None: any process with
    that pid, for a caller that never knew them); True when it was sent."""
    if pid <= 0 or (ticks is not None and owners.start_ticks(pid) != ticks):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True
