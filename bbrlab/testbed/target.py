"""Which testbed a command acts on, when the user names none.

Every command that acts on a testbed takes ``--testbed NAME|FILE``. Without it the target is, in order:

1. ``$BBRLAB_TESTBED`` (a local testbed's name or a testbed file), so a shell or a test session can
   point every command at one testbed;
2. the local testbed ``local`` (the name ``bbrlab testbed up`` gives) when it is up;
3. the only local testbed that is up, whatever its name.

With several up and none of them ``local``, the command refuses and lists them, rather than guess.
A value that contains ``/``, ends in ``.yaml``/``.yml`` or is an existing file is a testbed file;
anything else is the name of a local testbed.
"""

from __future__ import annotations

import os
from pathlib import Path

from bbrlab.core.errors import TestbedError

from .file import load_file
from .local.lifecycle import running
from .local.state import State, state_root

ENV = "BBRLAB_TESTBED"
DEFAULT_NAME = "local"


def is_testbed_file(text: str) -> bool:
    """True when ``text`` names a testbed file rather than a local testbed: it contains ``/``, ends in
    ``.yaml``/``.yml``, or is an existing file (relative to the working directory)."""
    if "/" in text or text.endswith((".yaml", ".yml")):
        return True
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL: not a file
        return False


def running_local_testbeds() -> list[str]:
    """Names of the local testbeds whose VMs and namespaces are alive now (from their recorded state)."""

    names = []
    root = state_root()
    for path in sorted(root.glob("*/state.json")) if root.is_dir() else []:
        try:
            state = State.load(path.parent.name)
        except (OSError, ValueError):
            continue  # not a testbed's record (or a name bbrlab would not give)
        if running(state):
            names.append(path.parent.name)
    return names


def default_testbed() -> str:
    """The testbed a command acts on when none is named (see the module docstring)."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return env
    up = running_local_testbeds()
    if DEFAULT_NAME in up or not up:
        return DEFAULT_NAME  # not up: loading it then says how to bring it up
    if len(up) == 1:
        return up[0]
    raise TestbedError(f"several local testbeds are up ({', '.join(up)}) and none is called "
                       f"'{DEFAULT_NAME}': name one with --testbed NAME (or set {ENV})")


def resolve(name_or_file: str | Path | None) -> str:
    """``name_or_file`` as given, or :func:`default_testbed` when it is None or empty."""
    text = str(name_or_file).strip() if name_or_file is not None else ""
    return text or default_testbed()


def local_name(name_or_file: str) -> str | None:
    """The local testbed's name, or None for a testbed file (a lab: no local lock applies)."""
    return None if is_testbed_file(name_or_file) else name_or_file


def lock_name(ref: str) -> str:
    """The name testbed ``ref``'s lock goes by: a local testbed's own name, or the name a lab's testbed file
    gives (read from that file only: nothing of the testbed's state is read before its lock is held)."""
    return local_name(str(ref)) or load_file(ref).name
