"""Work folders and files in bbrlab's caches (``~/.cache/bbrlab``): named for the process making them, swept
when it is gone, and stamped when an entry is used.

A cache entry is built under a temporary name next to its final place and renamed into place when
complete, so a half-built entry never looks finished. The temporary name says who builds it:
``.build-<what>-<boot>.<pid>.<start ticks>-XXXXXXXX`` (:func:`work_dir`, :func:`work_file`). A build
stopped by a signal removes its own (:mod:`bbrlab.core.signals`); one killed outright (SIGKILL, power loss)
cannot, and :func:`sweep` removes it later: a work name whose process no longer runs
(:mod:`bbrlab.core.owners`) is stale; a build step still working in it (orphaned when its parent was killed)
is killed first. A work name of an older bbrlab, without an owner, is stale once it has
not changed for :data:`LEGACY_STALE_S`.

:func:`mark_used` sets an entry's modification time to now whenever a build or a lookup uses it, so
"least recently used" (what cache pruning removes first) is the oldest modification time.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

from . import owners

PREFIX = ".build-"
#: A work name without an owner (made before owners were named) is stale after this long unchanged.
LEGACY_STALE_S = 86400.0
_OWNED = re.compile(r"-([0-9a-f]{8})\.(\d{1,10})\.(\d{1,20})-[a-z0-9_]{8}$")


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/bbrlab``: where built and extracted things are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "bbrlab"


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def owner_prefix(prefix: str) -> str:
    """``prefix`` followed by this process's owner (``<boot>.<pid>.<start ticks>-``), for ``mkdtemp``/``mkstemp``:
    a name :func:`stale` can judge once the process is gone."""
    me = owners.Owner.current()
    return f"{prefix}{me.boot.replace('-', '')[:8]}.{me.pid}.{me.ticks}-"


def _prefix(what: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._%+-]", "_", what)[:120]
    return owner_prefix(f"{PREFIX}{safe}-")


def work_dir(parent: Path, what: str) -> Path:
    """A new, empty work folder in ``parent`` (created if needed) for building ``what``."""
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=_prefix(what), dir=parent))


def work_file(parent: Path, what: str) -> tuple[int, Path]:
    """A new, empty work file in ``parent``: ``(open descriptor, path)``."""
    parent.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=_prefix(what), dir=parent)
    return fd, Path(path)


def is_work_name(name: str, prefix: str = PREFIX) -> bool:
    """True for a name made by :func:`work_dir`/:func:`work_file` (or with :func:`owner_prefix` of ``prefix``)."""
    return name.startswith(prefix)


def stale(path: Path, now: float | None = None) -> bool:
    """True when the work folder or file ``path`` belongs to no running process."""
    m = _OWNED.search(path.name)
    if m is None:
        try:
            age_s = (now or time.time()) - path.lstat().st_mtime
        except FileNotFoundError:
            return False
        return age_s > LEGACY_STALE_S
    boot, pid, ticks = m.group(1), int(m.group(2)), int(m.group(3))
    if boot != owners.boot_id().replace("-", "")[:8]:
        return True  # made before this machine last booted
    return not owners.alive(pid, ticks)


def _kill_users(path: Path) -> None:
    for pid in owners.users_of(path):  # a build step the killed build left running would write on
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove(path: Path) -> None:
    """Remove a folder or file of the cache (a symbolic link is removed, never followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep(parent: Path, prefix: str = PREFIX) -> list[Path]:
    """Remove the stale work folders and files directly in ``parent`` whose names start with ``prefix``; return
    what went. Only this user's: in a shared folder (``/tmp``) another user's names are never touched. A
    ``parent`` that is a symbolic link is not swept, and a work name that is one is removed as a link."""
    if parent.is_symlink():
        return []  # never swept through a link: what it points to is not bbrlab's
    try:
        names = [p for p in parent.iterdir() if is_work_name(p.name, prefix)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    now = time.time()
    gone = []
    for path in sorted(names):
        if _owned_by_me(path) and stale(path, now):
            if not path.is_symlink():  # a link's users work in what it points to, which is not ours
                _kill_users(path)
            remove(path)
            gone.append(path)
    return gone


def _owned_by_me(path: Path) -> bool:
    try:
        return path.lstat().st_uid == os.geteuid()
    except FileNotFoundError:
        return False


def mark_used(path: Path) -> None:
    """Record that the cache entry ``path`` was used now (its modification time; see the module docstring)."""
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        pass  # read-only cache, or gone: only the pruning order suffers
