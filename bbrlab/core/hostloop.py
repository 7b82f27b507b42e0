"""A bash loop on a host that acts on a fixed schedule until its stop file appears, and how it is stopped.

Two loops are built on it: the ``ss`` socket sampler (:mod:`bbrlab.sampling.sampler`, inside the contended sender)
and the rsync progress poller (:mod:`bbrlab.run.progress`, on the receiver). Both must cost as little as they
can where they run and can never outlive a run:

- :data:`SCHEDULE_BASH` defines the bash function ``on_schedule CMD [ARG...]``: it runs the command at
  ``t0 + k x interval_us`` (t0: when it starts) and skips the ticks it missed instead of drifting or
  catching up; it returns when ``$stop_file`` exists or ``$stop_after_s`` have passed. Time comes from
  ``$EPOCHREALTIME`` and the pause is ``read -t`` on a pipe nobody writes to: no process per tick.
- :func:`stop_and_fetch` asks such a loop to stop (its stop file), waits for its last tick (at most 10 s,
  then SIGKILL to its session, when its pid still names the loop: :mod:`bbrlab.core.ownedpids`) and prints
  its log, in one command: round trips to a contended guest are slow.
"""

from __future__ import annotations

from .commands import Result
from .hosts import Host
from .ownedpids import KILL_OURS_SH

#: ``running PID`` succeeds while PID exists and is not a zombie. A spawned process is reparented to the
#: host's init when its shell exits; until init reaps it, ``kill -0`` alone would call a zombie alive.
RUNNING_SH = r"""
running() {
    kill -0 "$1" 2>/dev/null || return 1
    state=
    read -r _ _ state _ < "/proc/$1/stat" 2>/dev/null
    [ "$state" != Z ]
}
"""

#: bash, to paste into a loop's script: ``on_schedule CMD [ARG...]`` (see the module docstring). The script
#: sets ``interval_us``, ``stop_after_s`` and ``stop_file`` first; the function uses the globals ``now``,
#: ``next``, ``pause`` and ``wait_us`` and the fd ``pause_fd``.
SCHEDULE_BASH = r"""
exec {pause_fd}<> <(:)
now_us() { local t=$EPOCHREALTIME; printf -v "$1" '%s' "${t/[.,]/}"; }
on_schedule() {
    local start end
    now_us start; next=$start; end=$(( start + stop_after_s * 1000000 ))
    while [[ ! -e $stop_file ]]; do
        now_us now
        (( now >= end )) && break
        "$@"
        next=$(( next + interval_us ))
        now_us now
        if (( next <= now )); then next=$(( next + ((now - next) / interval_us + 1) * interval_us )); fi
        wait_us=$(( next - now ))
        printf -v pause '%d.%06d' $(( wait_us / 1000000 )) $(( wait_us % 1000000 ))
        read -r -t "$pause" -u "$pause_fd" _ || :
    done
}
"""

#: $1 stop file, $2 pid, $3 log, $4 print the log (1) or not (0), $5 the pid's start ticks (may be empty).
_STOP = RUNNING_SH + KILL_OURS_SH + r"""
touch "$1"
i=0
while running "$2" && same "$2" "$5" && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill_ours "$2" "$5"
if [ "$4" = 1 ]; then cat "$3" || exit 1; fi
exit 0
"""


def stop_and_fetch(host: Host, stop_path: str, pid: int, log_path: str, *, fetch: bool,
                   start_ticks: int | None = None) -> Result:
    """Stop the loop ``pid`` on ``host`` through its stop file (it finishes its tick and writes what it
    writes at the end; after 10 s it is killed, when ``pid`` still names the process that started at
    ``start_ticks``) and, with ``fetch``, return its log as the result's stdout. The caller judges
    ``result.ok`` (False: the log could not be read)."""
    ticks = "" if start_ticks is None else str(int(start_ticks))
    return host.run(["sh", "-c", _STOP, "bbrlab-stop", stop_path, str(pid), log_path, "1" if fetch else "0", ticks],
                    timeout=60, check=False)
