"""The lock of a lab's hosts, held on the hosts themselves, and who set what on them.

A testbed's lock on this machine (:mod:`bbrlab.testbed.lock`) keeps two processes here from driving one
testbed; it cannot see a driver on another machine. A lab's emulator (its bottleneck) and the host that runs
its sender VM therefore carry a lock of their own: :func:`hold` starts, over the SSH connection bbrlab
already has to the host, a command that takes an ``flock`` on ``/run/bbrlab/host.lock`` there, writes who
holds it (:func:`owner_record`: a random per-process token, this machine's name, pid, command, testbed) to
``/run/bbrlab/host.owner``, and then just waits for end of file on its stdin. The lock is held exactly as long
as that command runs, which is as long as this process keeps the SSH session open: a clean exit closes it,
and so does the kernel when this process dies (even by SIGKILL), so sshd ends the command and the kernel on
the host drops the lock. A second driver is told who holds the host and waits (or gives up after its
timeout), on any machine.

A lock can also be lost while this process lives: a network blip ends the SSH connection (the host's sshd
then ends the command and another driver may take the host), and fabric would quietly open a new connection
for the next command. So the connection carries keepalives (:func:`bbrlab.core.hosts.keep_alive`), each
acquisition writes a token of its own into the owner record (``hold``), and :func:`check_held` (called by the
runner before each run and again before the run is recorded) asks the command holding the lock, through its
own channel, whether the lock file is still the one it locked and the owner record still this acquisition's. When not, it raises
:class:`HostLockLost`: the attempt fails with that reason, and the next check takes the lock again if the host
is free (the runner then sets the link afresh), or fails naming who holds it now.

:func:`mark` notes on a host which session set something there (the emulator's qdiscs, see
:func:`bbrlab.link.emulator.check_ports_free`); :func:`mark_of` reads the note back and says whether that session
still holds the host, so a live campaign's qdiscs are never taken for another's.

The directory on the host is created 0700 and refused when it is a link, not owned by the user bbrlab
logs in as, or writable by others. ``flock`` (util-linux) and coreutils are all it needs there.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bbrlab.core.commands import HeldCommand
from bbrlab.core.errors import TestbedError
from bbrlab.core.hosts import Host, SSHHost

#: Where the lock and the notes live on a host (a tmpfs on Linux: gone after a reboot, like every holder).
REMOTE_DIR = "/run/bbrlab"
LOCK_FILE = "host.lock"
OWNER_FILE = "host.owner"
#: This process's token: what its lock and its notes on every host are recognised by.
SESSION_TOKEN = secrets.token_hex(12)
#: Seconds between two attempts while another driver holds a host.
POLL_S = 2.0
#: Seconds the command holding a lock has to answer a check through its channel before the lock counts as lost.
ANSWER_TIMEOUT_S = 15.0
#: The longest owner record read back from a host.
MAX_RECORD_BYTES = 4096

#: $1 directory, $2 our owner record (one line of JSON). Prints REFUSED/BUSY <record>/LOCKED, then holds the
#: lock until its stdin ends, answering each line <nonce> it reads with HELD <nonce> while the lock file is still
#: the one it locked and the owner record still ours (GONE <nonce> <why> when not). A constant script: values
#: arrive as arguments, never in the script's text.
_HOLD = r"""
dir=$1 owner=$2
umask 077
mkdir -p -- "$dir" 2>/dev/null
if [ -L "$dir" ] || [ ! -d "$dir" ] || [ "$(stat -c %u -- "$dir")" != "$(id -u)" ]; then
    echo "REFUSED $dir is not a directory of $(id -un) (a symbolic link?)"; exit 71
fi
if [ $(( 0$(stat -c %a -- "$dir") & 022 )) -ne 0 ]; then echo "REFUSED $dir is writable by others"; exit 71; fi
exec 9<>"$dir/host.lock" || { echo "REFUSED cannot open $dir/host.lock"; exit 72; }
if ! flock -n 9; then
    printf 'BUSY %s\n' "$(head -c 4096 -- "$dir/host.owner" 2>/dev/null | tr -d '\n')"
    exit 75
fi
printf '%s, "host_pid": %d}\n' "${owner%\}}" $$ > "$dir/host.owner.$$" && mv -f -- "$dir/host.owner.$$" "$dir/host.owner"
echo LOCKED
while IFS= read -r nonce; do
    if [ "$(stat -L -c %d:%i /proc/self/fd/9)" != "$(stat -c %d:%i -- "$dir/host.lock" 2>/dev/null)" ]; then
        echo "GONE $nonce $dir/host.lock is no longer the file this lock is on"
    else
        case "$(head -c 4096 -- "$dir/host.owner" 2>/dev/null)" in
            "${owner%\}},"*) echo "HELD $nonce" ;;
            *) echo "GONE $nonce $dir/host.owner names another holder" ;;
        esac
    fi
done
rm -f -- "$dir/host.owner"
"""

#: $1 the pid of a hold of ours that outlived its SSH connection on the host, $2 its ``hold`` token. Ends it
#: (the lock goes with it: only that shell has the lock open) once /proc shows it is that very hold.
_RECLAIM = r"""
pid=$1 hold=$2
case $pid in ''|*[!0-9]*) exit 64;; esac
tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "\"hold\": \"$hold\"" || exit 0
kill -TERM "$pid" 2>/dev/null
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done
exit 1
"""

#: $1 directory, $2 a note's file name or ''. Prints MARK <note> and, while someone holds the host, HELD <record>.
_PEEK = r"""
dir=$1 note=$2
[ -n "$note" ] && printf 'MARK %s\n' "$(head -c 4096 -- "$dir/$note" 2>/dev/null | tr -d '\n')"
if [ -f "$dir/host.lock" ] && ! flock -n "$dir/host.lock" true 2>/dev/null; then
    printf 'HELD %s\n' "$(head -c 4096 -- "$dir/host.owner" 2>/dev/null | tr -d '\n')"
fi
exit 0
"""

#: $1 directory, $2 file name, $3 the note ('' removes it).
_MARK = r"""
dir=$1 name=$2 text=$3
umask 077
mkdir -p -- "$dir" || exit 1
[ -L "$dir" ] && { echo "$dir is a symbolic link" >&2; exit 1; }
if [ -z "$text" ]; then rm -f -- "$dir/$name"; exit 0; fi
printf '%s\n' "$text" > "$dir/$name.$$" && mv -f -- "$dir/$name.$$" "$dir/$name"
"""


class HostBusy(TestbedError):
    """Another driver holds a lab host; ``holder`` is its owner record."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder

    def __reduce__(self):
        return type(self), (str(self), self.holder)


class HostLockLost(TestbedError):
    """The lock this process held on a lab host is gone (or was never taken): nothing may run on that host,
    nor be recorded, without it."""


def owner_record(testbed: str, activity: str = "") -> dict:
    """Who we are, as a host's lock records it; ``hold`` tells this acquisition from any other."""
    argv = " ".join(str(a) for a in sys.argv)[:300]
    return {"token": SESSION_TOKEN, "hold": secrets.token_hex(8), "driver": socket.gethostname(),
            "pid": os.getpid(), "argv": argv, "testbed": testbed, "activity": activity,
            "since": round(time.time(), 3)}


def _parse(text: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}
    return data if isinstance(data, dict) else {"unreadable": text[:200]}


def describe(owner: dict) -> str:
    """One line about a host's holder: ``pid 123 on lab-pc (bbrlab campaign run ...), testbed lab-a, since 12:03:04``."""
    if "unreadable" in owner or not owner:
        return "a process that left no readable record"
    text = f"pid {owner.get('pid')} on {owner.get('driver')}"
    if owner.get("argv"):
        text += f" ({str(owner['argv'])[:160]})"
    if owner.get("testbed"):
        text += f", testbed {owner['testbed']}"
    if owner.get("activity"):
        text += f": {owner['activity']}"
    if isinstance(owner.get("since"), int | float):
        text += f", since {dt.datetime.fromtimestamp(owner['since']).strftime('%Y-%m-%d %H:%M:%S')}"
    return text


def where(host: Host) -> str:
    """How a host is named in messages: ``emulator (root@10.0.0.5:22)``."""
    if isinstance(host, SSHHost):
        return f"{host.name} ({host.user}@{host.address}:{host.port})"
    return host.name


def _key(host: Host, directory: str) -> tuple:
    if isinstance(host, SSHHost):
        return ("ssh", host.address, host.port, directory)
    return ("local", getattr(host, "netns", ""), directory)


@dataclass
class _Hold:
    """A lock this process holds on a host: the command holding it, and why it was found lost (until taken
    again)."""

    host: Host
    directory: str
    record: dict
    cmd: HeldCommand | None
    depth: int = 1
    lost: str | None = None


_held: dict[tuple, _Hold] = {}


def _peek(host: Host, directory: str, note: str = "") -> tuple[dict | None, dict | None]:
    """``(note, holder)`` on ``host``: the note's content (None when absent), the holder's record (None when free)."""
    res = host.run(["sh", "-c", _PEEK, "bbrlab-peek", directory, note], sudo=True, timeout=30)
    marked = held = None
    for line in res.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "MARK" and rest.strip():
            marked = _parse(rest)
        elif kind == "HELD":
            held = _parse(rest) if rest.strip() else {}
    return marked, held


def holder(host: Host, directory: str = REMOTE_DIR) -> dict | None:
    """The record of whoever holds ``host`` now (``{}`` when it left none), or None when nobody does."""
    return _peek(host, directory)[1]


def _try(host: Host, directory: str, record: dict):
    """One attempt: ``(held_command, None)`` when we have the lock, ``(None, holder)`` when another has it."""
    cmd = host.hold_open(["sh", "-c", _HOLD, "bbrlab-hostlock", directory, json.dumps(record)], sudo=True)
    try:
        line = cmd.readline(60.0).strip()
    except BaseException:
        cmd.close(wait_s=2)
        raise
    if line == "LOCKED":
        return cmd, None
    cmd.close(wait_s=5)
    kind, _, rest = line.partition(" ")
    if kind == "BUSY":
        return None, _parse(rest) if rest.strip() else {}
    raise TestbedError(f"cannot take the lock of {where(host)}: {rest or line or 'no answer (is flock there?)'}")


@contextlib.contextmanager
def hold(host: Host, *, testbed: str, activity: str = "", timeout_s: float = 3600.0, note=None,
         directory: str = REMOTE_DIR) -> Iterator[dict]:
    """Hold ``host``'s lock for the ``with`` block; yields our owner record.

    While another driver holds it, says who (to ``note``, default stderr) and tries again every
    :data:`POLL_S` seconds; after ``timeout_s`` raises :class:`HostBusy` naming the holder (``timeout_s=0``:
    at once). Re-entrant within this process.
    """
    key = _key(host, directory)
    current = _held.get(key)
    if current is not None:
        current.depth += 1
        try:
            yield current.record
        finally:
            current.depth -= 1
        return
    record = owner_record(testbed, activity)
    entry = _held[key] = _Hold(host, directory, record, _acquire(host, directory, record, timeout_s, note))
    try:
        yield record
    finally:
        _held.pop(key, None)
        if entry.cmd is not None:
            entry.cmd.close()


def _acquire(host: Host, directory: str, record: dict, timeout_s: float, note) -> HeldCommand:
    """Take the lock (see :func:`hold`): the command holding it."""
    deadline = time.monotonic() + timeout_s
    told = False
    while True:
        cmd, other = _try(host, directory, record)
        if cmd is not None:
            return cmd
        if other.get("token") == SESSION_TOKEN:
            raise TestbedError(f"{where(host)} is held by this very process under another name (two roles of "
                               "the testbed on one host?)")
        if time.monotonic() >= deadline:
            raise HostBusy(f"{where(host)} is in use by another bbrlab: {describe(other)}; not driving it "
                           f"(waited {timeout_s:.0f} s)", other)
        if not told:
            print(f"{where(host)} is in use by another bbrlab: {describe(other)}; waiting for it (Ctrl-C to "
                  "give up)", file=note or sys.stderr, flush=True)
            told = True
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


# -- a lock lost while held --------------------------------------------------------------------------------
def _lost_reason(entry: _Hold) -> str | None:
    """Why ``entry``'s lock is no longer ours, or None while it is: the command holding it on the host must
    answer a fresh nonce through its own channel that the lock file is still the one it locked and the owner
    record there still this acquisition's (one round trip on a channel already open)."""
    why = entry.cmd.gone() if entry.cmd is not None else "it was not taken again"
    if why:
        return f"the command holding it ended: {why}"
    nonce = secrets.token_hex(6)
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    try:
        entry.cmd.send(f"{nonce}\n")
        while True:
            kind, _, rest = entry.cmd.readline(max(0.0, deadline - time.monotonic())).strip().partition(" ")
            if not kind:
                return "the command holding it ended without answering"
            got, _, why = rest.partition(" ")
            if got == nonce:
                return None if kind == "HELD" else f"the host says: {why}"
    except Exception as e:  # noqa: BLE001 - no answer, whatever the cause, means we cannot vouch for it
        return f"the command holding it did not answer within {ANSWER_TIMEOUT_S:.0f} s: {type(e).__name__}: {e}"


def _drop(entry: _Hold) -> None:
    """Let go of a lost lock's command and of the host's connection (the next command opens a new one)."""
    cmd, entry.cmd = entry.cmd, None
    with contextlib.suppress(Exception):
        if cmd is not None:
            cmd.close(wait_s=0)
    with contextlib.suppress(Exception):
        entry.host.close()


def _retake(entry: _Hold) -> None:
    """Take a lost lock again at once (no waiting), or raise :class:`HostLockLost` saying why not."""
    record = {**entry.record, "hold": secrets.token_hex(8), "since": round(time.time(), 3)}
    try:
        cmd, other = _try(entry.host, entry.directory, record)
        if cmd is None and _ours_orphaned(other, entry):
            cmd, other = _reclaim(entry, other, record)
    except Exception as e:  # noqa: BLE001 - the host is unreachable still, or refuses: the run cannot go on
        with contextlib.suppress(Exception):
            entry.host.close()
        raise HostLockLost(f"the lock of {where(entry.host)} was lost ({entry.lost}) and cannot be taken again: "
                           f"{type(e).__name__}: {e}") from None
    if cmd is None:
        whose = ("this process's earlier hold is still on the host and could not be ended"
                 if other.get("token") == SESSION_TOKEN else f"another bbrlab holds it now: {describe(other)}")
        raise HostLockLost(f"the lock of {where(entry.host)} was lost ({entry.lost}) and cannot be taken again: "
                           f"{whose}")
    entry.cmd, entry.record, entry.lost = cmd, record, None


def _ours_orphaned(other: dict, entry: _Hold) -> bool:
    """Whether the host's holder is the very acquisition we lost (its SSH session on the host outlived our
    side of the connection: a blip the host's sshd has not noticed)."""
    return other.get("token") == SESSION_TOKEN and other.get("hold") == entry.record["hold"]


def _reclaim(entry: _Hold, other: dict, record: dict):
    """End our own orphaned hold on the host (:data:`_RECLAIM`), then try once more; ``(cmd, holder)``."""
    try:
        entry.host.run(["sh", "-c", _RECLAIM, "bbrlab-reclaim", str(int(other.get("host_pid"))), entry.record["hold"]],
                       sudo=True, timeout=30)
    except (TypeError, ValueError):
        return None, other  # no pid recorded (an older bbrlab's record): wait for the host's sshd
    return _try(entry.host, entry.directory, record)


def check_held(tb, directory: str | None = None) -> bool:
    """Make sure this process still holds the lock of every host of :func:`lab_hosts`, before a run and
    before its record is made; raises :class:`HostLockLost` naming the host and why when one is lost (or was
    never taken). A lock found lost by an earlier call is taken again first, if the host is free (our own hold
    left orphaned on the host by a blip is ended first): then returns True, and what this process set on the
    hosts may have been changed meanwhile (set it again). ``directory``: the lock's (default
    :data:`REMOTE_DIR`)."""
    retaken = False
    for host in lab_hosts(tb):
        entry = _held.get(_key(host, directory or REMOTE_DIR))
        if entry is None:
            raise HostLockLost(f"this process does not hold the lock of {where(host)}: a lab's host is driven "
                               "only while its lock is held (bbrlab.testbed.hostlock.holding)")
        if entry.lost is not None:
            _retake(entry)
            retaken = True
            continue
        why = _lost_reason(entry)
        if why is not None:
            entry.lost = why
            _drop(entry)
            raise HostLockLost(f"lost the lock of {where(host)}: {why}. Another bbrlab may have driven the host "
                               "since (a network blip?); the next attempt takes the lock again if the host is free")
    return retaken


def lab_hosts(tb) -> list[Host]:
    """The hosts of a lab testbed that carry a lock of their own: its emulator and its sender's hypervisor
    host, when they are reached over SSH (once each, however many roles they play). A local testbed has
    none: its VMs answer only on this machine, whose own lock covers them."""
    if tb.kind == "local":
        return []
    hosts: dict[tuple, Host] = {}
    for host in (tb.emulator.host, tb.sender.hypervisor):
        if isinstance(host, SSHHost):
            hosts.setdefault(_key(host, REMOTE_DIR), host)
    return list(hosts.values())


@contextlib.contextmanager
def holding(tb, *, activity: str = "", timeout_s: float = 3600.0, note=None) -> Iterator[None]:
    """Hold the lock of every host of :func:`lab_hosts` for the ``with`` block (nothing for a local testbed)."""
    with contextlib.ExitStack() as stack:
        for host in lab_hosts(tb):
            stack.enter_context(hold(host, testbed=tb.name, activity=activity, timeout_s=timeout_s, note=note))
        yield


# -- notes of who set what on a host ---------------------------------------------------------------------------
def mark(host: Host, name: str, details: dict | None = None, directory: str = REMOTE_DIR) -> None:
    """Note on ``host`` (file ``name`` next to its lock) that this session set something there."""
    record = {"token": SESSION_TOKEN, "driver": socket.gethostname(), "pid": os.getpid(), **(details or {}),
              "since": round(time.time(), 3)}
    host.run(["sh", "-c", _MARK, "bbrlab-mark", directory, name, json.dumps(record)], sudo=True, timeout=30)


def unmark(host: Host, name: str, directory: str = REMOTE_DIR) -> None:
    """Remove the note ``name`` from ``host``."""
    host.run(["sh", "-c", _MARK, "bbrlab-mark", directory, name, ""], sudo=True, timeout=30)


def mark_of(host: Host, name: str, directory: str = REMOTE_DIR) -> tuple[dict | None, bool]:
    """``(note, live)``: the note ``name`` on ``host`` (None when there is none), and whether the session that
    wrote it is another one that still holds the host's lock (then what it set there is still its own)."""
    note, held = _peek(host, directory, name)
    if note is None:
        return None, False
    token = note.get("token")
    live = token is not None and token != SESSION_TOKEN and held is not None and held.get("token") == token
    return note, live
