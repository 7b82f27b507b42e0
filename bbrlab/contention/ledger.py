"""What a contention session is about to change on this machine, written down before it changes it, so that
recovery undoes what bbrlab itself left and nothing else.

A session writes an entry (:func:`write`) before its first change and removes it (:func:`drop`) once all is
given back. An entry is a JSON file in bbrlab's private state directory (``/run/bbrlab/contention/`` for root,
beside the testbed locks: :func:`bbrlab.core.lockdir.lock_dir`), mode 0600, holding its owner
(:class:`~bbrlab.core.owners.Owner`: machine, boot, pid and start time, so a pid handed to a new process since
is not taken for the owner) and what the session changes (the cgroup it makes, the threads it pins and their
CPU masks before). Recovery (:func:`left`) reads the entries whose owner is gone and acts on what they name.

Nothing a process of another user can write is believed: a command line, a cgroup's name or a file
outside the directory never direct recovery; an entry that is not a regular file of this user, mode 0600, is
refused (reported, not followed), and so is a directory that is not this user's or is writable by others.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from bbrlab.core.errors import TestbedError
from bbrlab.core.owners import Owner

#: The kinds of entry: a cgroup of the cfs-quota/cfs-burst/credit models, competing-load's loops and pins.
KINDS = ("cgroup", "load")
#: An entry is at most this large; a larger file is refused unread [bytes].
MAX_ENTRY_BYTES = 64 * 1024

_counter = count(1)


def state_dir() -> Path:
    """The private directory of the entries (made 0700; refused if not this user's, a symlink, or writable by
    others)."""
    from bbrlab.core.lockdir import lock_dir

    base = lock_dir() / "contention"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise TestbedError(f"cannot create bbrlab's state directory {base}: {e.strerror}") from None
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise TestbedError(f"{base} is not a private directory of uid {os.geteuid()} (mode "
                           f"{stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}, or a symbolic link): refusing it")
    return base


@dataclass(frozen=True)
class Entry:
    """One entry: its ``path``, ``kind``, ``owner`` and what it names (``data``, the kind's own fields)."""

    path: Path
    kind: str
    owner: Owner
    data: dict


def write(kind: str, data: dict) -> Entry:
    """Write a new entry of this process (before the change it names)."""
    if kind not in KINDS:
        raise ValueError(f"not a kind of entry: {kind!r}")
    owner = Owner.current()
    path = state_dir() / f"{kind}-{owner.pid}-{owner.ticks}-{next(_counter)}.json"
    entry = Entry(path, kind, owner, dict(data))
    _store(entry)
    return entry


def update(entry: Entry, data: dict) -> Entry:
    """Replace what ``entry`` names (atomically: a reader sees the old or the new, whole)."""
    new = Entry(entry.path, entry.kind, entry.owner, dict(data))
    _store(new)
    return new


def _store(entry: Entry) -> None:
    text = json.dumps({"owner": entry.owner.stamp(), "kind": entry.kind, "data": entry.data})
    tmp = entry.path.with_name(f".{entry.path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, entry.path)


def drop(entry: Entry) -> None:
    """Remove ``entry`` (all it named is given back)."""
    try:
        entry.path.unlink()
    except FileNotFoundError:
        pass


def read(path: Path) -> Entry:
    """The entry in ``path``; :class:`TestbedError` saying why when it is refused (not a regular file of this
    user with mode 0600, too large, or not an entry)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise TestbedError(f"{path}: cannot open it ({e.strerror}; a symbolic link is refused)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o600:
            raise TestbedError(f"{path}: not a regular file of uid {os.geteuid()} with mode 0600 (uid {st.st_uid}, "
                               f"mode {stat.S_IMODE(st.st_mode):o}): refused")
        if st.st_size > MAX_ENTRY_BYTES:
            raise TestbedError(f"{path}: {st.st_size} bytes, more than an entry's {MAX_ENTRY_BYTES}: refused")
        raw = f.read(MAX_ENTRY_BYTES + 1)
    try:
        d = json.loads(raw)
        owner, kind, data = Owner.parse(d["owner"]), d["kind"], d["data"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise TestbedError(f"{path}: not a bbrlab ledger entry: refused") from None
    if owner is None or kind not in KINDS or not isinstance(data, dict):
        raise TestbedError(f"{path}: not a bbrlab ledger entry: refused")
    return Entry(path, kind, owner, data)


@dataclass(frozen=True)
class Found:
    """The entries of one kind whose owner is gone (``entries``), and why others were refused (``refused``)."""

    entries: list[Entry]
    refused: list[str]


def left(kind: str, *, include_live_owners: bool = False) -> Found:
    """The entries of ``kind`` whose owner is gone (all of them, ``include_live_owners``), and the refused."""
    entries, refused = [], []
    base = state_dir()
    for path in sorted(base.glob(f"{kind}-*.json")):
        try:
            entry = read(path)
        except TestbedError as e:
            refused.append(str(e))
            continue
        if entry.kind != kind:
            refused.append(f"{path}: names kind {entry.kind!r} under a {kind!r} name: refused")
        elif include_live_owners or entry.owner.gone():
            entries.append(entry)
    return Found(entries, refused)


def ours(pid: int) -> bool:
    """Whether process (or thread) ``pid`` runs as this user (root for recovery): its real, effective, saved and
    filesystem uids all this process's effective uid."""
    me = str(os.geteuid())
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return all(u == me for u in line.split()[1:5])
    except OSError:
        pass
    return False
