"""Locks of the testbeds on this machine: one per testbed, and one for the shared guest-image cache.

Anything that boots a testbed, changes it, or sends traffic through it holds that testbed's lock with
:func:`testbed_lock` (``with testbed_lock("local"): ...``). Testbeds of different names are independent
and can be driven at the same time; building the guest image takes :func:`image_lock`.

The lock files live in a directory only their owner can write: ``/run/bbrlab/`` for root, otherwise
``$XDG_RUNTIME_DIR/bbrlab/``. They are opened with ``O_NOFOLLOW`` and their owner is checked, so a
file or a symbolic link planted by another user is refused rather than followed (the old
``/tmp/bbrlab-testbed.lock``, mode 0666, invited that).

The lock is an ``flock``: the kernel releases it when the holder dies, even by SIGKILL. A process
already running under the lock (its own or an ancestor's) does not wait for itself: :func:`held_by_us`
asks ``/proc/locks`` who holds it. Next to each lock a holder writes what it is doing
(:func:`set_activity`), so ``bbrlab testbed status`` can say "a campaign holds the testbed, run 12/54"
without touching the testbed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bbrlab.core.errors import TestbedError
from bbrlab.core.lockdir import lock_dir

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def lock_path(name: str = "local") -> Path:
    """The lock file of testbed ``name``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TestbedError(f"not a testbed name for a lock: {name!r}")
    return lock_dir() / f"testbed-{name}.lock"


def open_lock_file(path: str | Path) -> int:
    """Open (or create, 0600) a lock file without following symbolic links, and check its owner."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TestbedError(f"cannot open the lock {path}: {e.strerror} (a symbolic link there is refused)") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise TestbedError(f"the lock {path} is not a regular file of ours (uid {st.st_uid}): refusing it")
    return fd


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


def _lock_file_id(field: str) -> tuple[int, int, int] | None:
    """``(major, minor, inode)`` of a /proc/locks file field ``MAJ:MIN:INODE`` (device numbers in hex)."""
    try:
        major, minor, inode = field.split(":")
        return int(major, 16), int(minor, 16), int(inode)
    except ValueError:
        return None


def lock_holders(path: str | Path) -> set[int]:
    """Pids holding an flock on the file at ``path`` (from /proc/locks), matched by device AND inode: an
    inode number alone also names files on every other file system (two tmpfs mounts count from 1 alike)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return set()
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    holders = set()
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
                continue
            if _lock_file_id(parts[5]) == want:
                holders.add(int(parts[4]))
    return holders


def held_by_us(path: str | Path) -> bool:
    """True when this process or one of its ancestors holds the lock at ``path``."""
    return bool(lock_holders(path) & _ancestors(os.getpid()))


def _activity_path(path: Path) -> Path:
    return path.with_suffix(".json")


def set_activity(name: str, activity: str, **details) -> None:
    """Say what the holder of testbed ``name``'s lock is doing (read by :func:`holder`)."""
    path = _activity_path(lock_path(name))
    info = {"pid": os.getpid(), "argv": sys.argv, "activity": activity, "since": time.time(), **details}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


def holder(name: str = "local") -> dict | None:
    """Who holds testbed ``name``'s lock and what it said it is doing; None when nobody holds it."""
    path = lock_path(name)
    pids = lock_holders(path)
    if not pids:
        return None
    info: dict = {"pids": sorted(pids)}
    try:
        said = json.loads(_activity_path(path).read_text())
    except (OSError, ValueError):
        said = None
    if isinstance(said, dict) and said.get("pid") in pids | set().union(*(_ancestors(p) for p in pids)):
        info.update({k: said.get(k) for k in ("activity", "argv", "since", "pid")})
        info.update({k: v for k, v in said.items() if k not in info})
    return info


@contextlib.contextmanager
def hold(path: str | Path, *, timeout_s: float = 3600.0, what: str = "the lock", note=None) -> Iterator[None]:
    """Hold the flock at ``path`` for the ``with`` block (re-entrant across our own process tree)."""
    if held_by_us(path):
        yield
        return
    fd = open_lock_file(path)
    try:
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TestbedError(f"{what} ({path}) still held by pid(s) {sorted(lock_holders(path))} "
                                       f"after {timeout_s:.0f} s") from None
                if not told:
                    print(f"waiting for {what} ({path}, held by pid(s) {sorted(lock_holders(path))})",
                          file=note or sys.stderr, flush=True)
                    told = True
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)  # releases the flock


def testbed_lock(name: str = "local", *, timeout_s: float = 3600.0, note=None):
    """Hold testbed ``name``'s lock for a ``with`` block; waits up to ``timeout_s`` for another holder."""
    return hold(lock_path(name), timeout_s=timeout_s, what=f"the lock of testbed '{name}'", note=note)


def image_lock(*, timeout_s: float = 3600.0, note=None):
    """Hold the guest-image cache's lock (building or pruning images)."""
    return hold(lock_dir() / "image.lock", timeout_s=timeout_s, what="the guest-image lock", note=note)
