"""Crash-safe record of what a local testbed created, so ``down`` can always clean up.

``state.json`` in the testbed's state directory is rewritten atomically (temp file + rename)
BEFORE each resource is created (a namespace, a QEMU process, a port): if ``up`` dies halfway,
the record already names everything that may exist, and ``down`` removes what it finds. Removing
something that was recorded but never created is a no-op.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from bbrlab.core.errors import ValidationError

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,11}$")


def check_name(name: str) -> str:
    """Testbed names become parts of namespace and VM names, so they are short and plain."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValidationError("testbed.name", name, "1-12 characters: a-z first, then a-z, 0-9 or '-'")
    return name


#: Overrides where local testbeds keep their state (and SSH keys): ``$BBRLAB_STATE_DIR/testbeds``.
#: The test suite sets it, so test testbeds stay out of the user's own state directory.
STATE_DIR_ENV = "BBRLAB_STATE_DIR"


def state_root() -> Path:
    """``$BBRLAB_STATE_DIR/testbeds``, else ``${XDG_STATE_HOME:-~/.local/state}/bbrlab/testbeds``."""
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return Path(override) / "testbeds"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "bbrlab" / "testbeds"


def state_dir(name: str) -> Path:
    """Testbed ``name``'s state directory under :func:`state_root`; raises
    :class:`~bbrlab.core.errors.ValidationError` for a name :func:`check_name` refuses."""
    return state_root() / check_name(name)


class State:
    """The record of one local testbed; every mutation is written to disk at once."""

    def __init__(self, name: str, data: dict | None = None):
        self.name = check_name(name)
        self.dir = state_dir(name)
        self.data = data if data is not None else {"name": name, "phase": "new", "netns": [], "vms": {}}

    @property
    def path(self) -> Path:
        """The record's file, ``state.json`` in the testbed's state directory."""
        return self.dir / "state.json"

    @classmethod
    def load(cls, name: str) -> State | None:
        """The recorded state, or None when this testbed never recorded anything."""
        path = state_dir(name) / "state.json"
        if not path.is_file():
            return None
        return cls(name, json.loads(path.read_text()))

    @classmethod
    def load_or_new(cls, name: str) -> State:
        """The recorded state, or a new one (phase ``new``, not saved yet) when there is none."""
        return cls.load(name) or cls(name)

    def save(self) -> None:
        """Write the record to ``state.json`` atomically (temp file, fsync, rename) with ``updated_at`` set to
        now; the state directory is made (0700) if missing."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    # -- recording (always before creating) --------------------------------------------------
    def set(self, key: str, value: object) -> None:
        """Record ``key`` = ``value`` and save at once."""
        self.data[key] = value
        self.save()

    def add_netns(self, netns: str) -> None:
        """Record network namespace ``netns`` (once) and save: done before the namespace is created."""
        if netns not in self.data["netns"]:
            self.data["netns"].append(netns)
        self.save()

    def set_vm(self, role: str, **fields: object) -> None:
        """Merge ``fields`` into the record of ``role``'s VM and save."""
        self.data["vms"].setdefault(role, {}).update(fields)
        self.save()

    @property
    def phase(self) -> str:
        """How far ``up`` or ``down`` got: ``new``, ``starting``, ``up`` or ``down``."""
        return self.data.get("phase", "new")

    @property
    def netns(self) -> list[str]:
        """The recorded network namespaces (a copy)."""
        return list(self.data.get("netns", []))

    @property
    def vms(self) -> dict[str, dict]:
        """The recorded VMs by role (a shallow copy): name, pid, SSH port, QMP socket, ..."""
        return dict(self.data.get("vms", {}))
