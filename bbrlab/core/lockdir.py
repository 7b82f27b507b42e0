"""Where bbrlab keeps its lock files: one private directory per user (root: ``/run/bbrlab``; others:
``$XDG_RUNTIME_DIR/bbrlab``; ``BBRLAB_LOCK_DIR`` overrides both), refused unless it is a real directory of ours
that nobody else can write. The testbed locks (:mod:`bbrlab.testbed.lock`) and the contention ledger
(:mod:`bbrlab.contention.ledger`) keep their files there.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import TestbedError


def lock_dir() -> Path:
    """The private directory of bbrlab's lock files (created 0700; refused if not ours or a symlink)."""
    if os.geteuid() == 0:
        base = Path("/run/bbrlab")
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if not runtime:
            raise TestbedError("no place for bbrlab's locks: run as root (/run/bbrlab) or set XDG_RUNTIME_DIR")
        base = Path(runtime) / "bbrlab"
    override = os.environ.get("BBRLAB_LOCK_DIR")  # tests and several users on one machine
    if override:
        base = Path(override)
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise TestbedError(f"cannot create the lock directory {base}: {e.strerror}") from None
    st = os.lstat(base)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise TestbedError(f"{base} is not a directory (a symbolic link?): refusing to keep locks there")
    if st.st_uid != os.geteuid():
        raise TestbedError(f"{base} belongs to uid {st.st_uid}, not to us ({os.geteuid()}): refusing it")
    if st.st_mode & 0o022:
        raise TestbedError(f"{base} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): refusing it")
    return base
