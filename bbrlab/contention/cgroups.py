"""CFS bandwidth control on single threads, on this machine: the cpu controller's cgroup hierarchy (v1 or v2),
a cgroup of bbrlab's own for some threads, its quota and period, and moving threads in and back out.

Which hierarchy has the cpu controller is read from ``/proc/self/mounts`` (:func:`detect`):

- **v1**: a ``cgroup`` mount whose options name ``cpu`` (``/sys/fs/cgroup/cpu`` or ``/sys/fs/cgroup/cpu,cpuacct``).
  The cgroup is made inside the thread's own cpu cgroup; ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``
  hold the limit, a thread moves by writing its id to ``tasks``.
- **v2**: a ``cgroup2`` mount whose ``cgroup.controllers`` lists ``cpu``. A thread can only leave its process's
  cgroup into a *threaded* child: the cgroup is made inside the thread's cgroup, its ``cgroup.type`` set to
  ``threaded``, ``+cpu`` enabled in the parent's ``cgroup.subtree_control`` (and disabled again afterwards if
  bbrlab enabled it), ``cpu.max`` holds ``"quota period"``, a thread moves through ``cgroup.threads``.

bbrlab's cgroups are named ``bbrlab-cfs-<pid>-<n>`` (:data:`PREFIX`; ``pid`` the process that made it), so
:func:`leftovers` finds those a killed process left and :func:`remove` empties them into their parent.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core.errors import TestbedError

PREFIX = "bbrlab-cfs-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)$")
MOUNTS = Path("/proc/self/mounts")


@dataclass(frozen=True)
class Hierarchy:
    """The cpu controller's hierarchy: ``version`` 1 or 2, mounted at ``root``."""

    version: int
    root: Path

    @property
    def name(self) -> str:
        """``cgroup-v1`` or ``cgroup-v2``: the record's ``method``."""
        return f"cgroup-v{self.version}"

    def thread_cgroup(self, tid: int) -> Path:
        """The cgroup of the cpu controller that thread ``tid`` is in now."""
        try:
            text = Path(f"/proc/{tid}/cgroup").read_text()
        except OSError as e:
            raise TestbedError(f"thread {tid}: cannot read its cgroup ({e})") from e
        for line in text.splitlines():
            _, controllers, path = line.split(":", 2)
            if (self.version == 2 and controllers == "") or \
                    (self.version == 1 and "cpu" in controllers.split(",")):
                return self.root / path.lstrip("/")
        raise TestbedError(f"thread {tid}: no cgroup of the cpu controller in /proc/{tid}/cgroup")

    def move(self, tid: int, cgroup: Path) -> None:
        """Put thread ``tid`` (alone, not its process) into ``cgroup``."""
        _write(cgroup / ("tasks" if self.version == 1 else "cgroup.threads"), str(tid))

    def limit(self, cgroup: Path) -> tuple[int | None, int]:
        """``(quota_us, period_us)`` of ``cgroup`` as the kernel reads them back (quota None: no limit)."""
        if self.version == 1:
            quota = int((cgroup / "cpu.cfs_quota_us").read_text())
            period = int((cgroup / "cpu.cfs_period_us").read_text())
            return (None if quota < 0 else quota), period
        quota_s, period_s = (cgroup / "cpu.max").read_text().split()
        return (None if quota_s == "max" else int(quota_s)), int(period_s)

    def set_limit(self, cgroup: Path, quota_us: int | None, period_us: int) -> None:
        """Give ``cgroup`` a quota of ``quota_us`` in every ``period_us`` (None: no limit)."""
        if self.version == 1:
            _write(cgroup / "cpu.cfs_period_us", str(period_us))
            _write(cgroup / "cpu.cfs_quota_us", "-1" if quota_us is None else str(quota_us))
        else:
            _write(cgroup / "cpu.max", f"{'max' if quota_us is None else quota_us} {period_us}")

    def burst_file(self, cgroup: Path) -> Path:
        """Where ``cgroup``'s burst is: v1 ``cpu.cfs_burst_us``, v2 ``cpu.max.burst`` (kernels >= 5.14)."""
        return cgroup / ("cpu.cfs_burst_us" if self.version == 1 else "cpu.max.burst")

    def burst(self, cgroup: Path) -> int:
        """``cgroup``'s burst as the kernel reads it back [us]."""
        return int(self.burst_file(cgroup).read_text())

    def set_burst(self, cgroup: Path, burst_us: int) -> None:
        """Let ``cgroup`` keep up to ``burst_us`` of unused quota for later periods (at most the quota)."""
        _write(self.burst_file(cgroup), str(burst_us))

    def members(self, cgroup: Path) -> list[int]:
        """The thread ids in ``cgroup``."""
        try:
            text = (cgroup / ("tasks" if self.version == 1 else "cgroup.threads")).read_text()
        except OSError:
            return []
        return [int(x) for x in text.split()]


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise TestbedError(f"could not write {value!r} to {path}: {e.strerror or e}") from e


def detect(mounts: Path = MOUNTS) -> Hierarchy:
    """The hierarchy that holds the cpu controller on this machine (v1 first: a controller bound to v1 is
    absent from v2). Raises :class:`TestbedError` when neither has it."""
    v2 = []
    for line in mounts.read_text().splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        kind, where, options = parts[2], Path(parts[1]), parts[3].split(",")
        if kind == "cgroup" and "cpu" in options:
            return Hierarchy(1, where)
        if kind == "cgroup2":
            v2.append(where)
    for where in v2:
        try:
            if "cpu" in (where / "cgroup.controllers").read_text().split():
                return Hierarchy(2, where)
        except OSError:
            continue
    raise TestbedError("no cgroup hierarchy with the cpu controller is mounted (cgroup v1 'cpu' or v2 with "
                       "'cpu' in cgroup.controllers): cfs-quota cannot be applied on this machine")


@dataclass
class OwnCgroup:
    """A cgroup bbrlab made inside ``parent`` for some threads (``enabled_cpu``: v2, bbrlab turned ``+cpu`` on in
    the parent's ``cgroup.subtree_control`` and turns it off again)."""

    hierarchy: Hierarchy
    parent: Path
    path: Path
    enabled_cpu: bool = False

    def to_dict(self) -> dict:
        """What a record keeps of it."""
        return {"hierarchy": self.hierarchy.name, "path": str(self.path), "parent": str(self.parent)}


_counter = iter(range(1, 1 << 30))


def create(hierarchy: Hierarchy, parent: Path) -> OwnCgroup:
    """Make a new ``bbrlab-cfs-<pid>-<n>`` cgroup inside ``parent`` (v2: a threaded one, cpu enabled)."""
    path = parent / f"{PREFIX}{os.getpid()}-{next(_counter)}"
    try:
        path.mkdir()
    except OSError as e:
        raise TestbedError(f"could not make the cgroup {path}: {e.strerror or e}") from e
    own = OwnCgroup(hierarchy, parent, path)
    if hierarchy.version == 2:
        try:
            _write(path / "cgroup.type", "threaded")
            control = (parent / "cgroup.subtree_control").read_text().split()
            if "cpu" not in control:
                _write(parent / "cgroup.subtree_control", "+cpu")
                own.enabled_cpu = True
        except (OSError, TestbedError):
            remove(own)
            raise
    return own


def remove(own: OwnCgroup, back_to: dict[int, Path] | None = None) -> list[str]:
    """Move every thread still in ``own`` back (to ``back_to[tid]``, else the parent), remove it, and turn
    ``+cpu`` off in the parent if bbrlab turned it on. Returns the problems (empty: all done)."""
    problems = []
    h = own.hierarchy
    for tid in h.members(own.path):
        try:
            h.move(tid, (back_to or {}).get(tid, own.parent))
        except TestbedError as e:
            if Path(f"/proc/{tid}").exists():
                problems.append(str(e))
    try:
        own.path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        problems.append(f"could not remove {own.path}: {e.strerror or e}")
    if own.enabled_cpu:
        try:
            _write(own.parent / "cgroup.subtree_control", "-cpu")
        except TestbedError:
            pass  # another child uses the cpu controller there now; harmless to leave it on
    return problems


def owner_pid(path: Path) -> int | None:
    """The process that made a bbrlab cgroup (from its name), or None for another name."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def leftovers(hierarchy: Hierarchy | None = None, *, include_live_owners: bool = False) -> list[OwnCgroup]:
    """bbrlab's cgroups in the cpu hierarchy whose maker is gone (or all, ``include_live_owners``)."""
    try:
        h = hierarchy or detect()
    except TestbedError:
        return []
    found = []
    for where, dirs, _ in os.walk(h.root):
        for d in list(dirs):
            pid = owner_pid(Path(d))
            if pid is None:
                continue
            dirs.remove(d)
            if include_live_owners or not Path(f"/proc/{pid}").exists():
                found.append(OwnCgroup(h, Path(where), Path(where) / d))
    return found


def clear_leftovers(hierarchy: Hierarchy | None = None) -> list[str]:
    """Remove the cgroups a killed bbrlab process left (their threads back into the parent); their paths."""
    removed = []
    for own in leftovers(hierarchy):
        problems = remove(own)
        if problems:
            raise TestbedError(f"leftover cgroup {own.path}: " + "; ".join(problems))
        removed.append(str(own.path))
    return removed
