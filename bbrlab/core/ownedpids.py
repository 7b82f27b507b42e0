"""Signalling a process bbrlab started, never another that was handed its pid since.

A pid kept from a spawn (or read from a pid file) names the process bbrlab started only while that process
runs: once it has ended, the kernel may give the number to any new process. So a stop that waits for a
process and then sends SIGKILL to its pid (or its session) checks first that the pid still names the process
that started at the same time (``/proc/<pid>/stat``, clock ticks since boot; see :mod:`bbrlab.core.owners`).

- :class:`Spawned`: a started process's pid and start ticks.
- :data:`KILL_OURS_SH`: the shell functions ``start_ticks PID``, ``same PID TICKS`` and ``kill_ours PID TICKS`` for scripts run on
  a host (a guest, over SSH), pasted before the script that uses them; with them ``pid_line PID`` and
  ``read_pid_line FILE``, which write and read the one form a pid is kept in (a pid file, a spawn's answer):
  ``<pid> <start ticks>``.
- :func:`parse_pid_line`: that form read here, in Python.
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
#: ``pid_line PID`` prints ``<pid> <start ticks>`` (the ticks empty when PID is gone already); ``read_pid_line
#: FILE`` sets ``pid`` and ``ticks`` from a file holding that line (both empty while there is none).
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
pid_line() {
    echo "$1 $(start_ticks "$1")"
}
read_pid_line() {
    pid=; ticks=
    read -r pid ticks < "$1" 2>/dev/null
    return 0
}
"""


def parse_pid_line(text: str, where: str = "pid line") -> Spawned:
    """``<pid> <start ticks>`` (what ``pid_line`` wrote) as :class:`Spawned`; the ticks are None where the line
    has none (the process had ended before they were read). :class:`ValueError` naming ``where`` for a line
    without a positive pid first."""
    words = text.split()
    if not words or not words[0].isdigit() or int(words[0]) <= 0:
        raise ValueError(f"{where}: {text.strip()[:80]!r} is not '<pid> <start ticks>'")
    ticks = words[1] if len(words) > 1 and words[1].isdigit() else None
    return Spawned(int(words[0]), int(ticks) if ticks is not None else None)


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
