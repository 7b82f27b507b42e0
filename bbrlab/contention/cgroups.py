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

bbrlab's cgroups are named ``bbrlab-cfs-<pid>-<n>`` (:data:`PREFIX`; ``pid`` the process that made it) and made
inside a parent cgroup of bbrlab's own, ``bbrlab`` (:data:`PARENT`), inside the threads' cgroup (on v2 both
threaded): ``<threads' cgroup>/bbrlab/bbrlab-cfs-<pid>-<n>``. Before it makes anything a session writes a ledger
entry naming the cgroup (:mod:`bbrlab.contention.ledger`); :func:`leftovers` reads the entries whose owner is
gone and :func:`remove` empties their cgroup back into the threads' cgroup. A cgroup's name alone directs
nothing: a ``bbrlab-cfs-*`` cgroup no entry names (another user's, in a delegated subtree) is never touched, and
an entry is followed only to a cgroup of this user named as bbrlab names them inside a ``bbrlab`` parent.

:meth:`Hierarchy.cpu_stat` reads a cgroup's CFS counters (``cpu.stat``: periods, throttled periods, throttled
time; :mod:`bbrlab.contention.cpustat`), which the cgroup models record as their throttling evidence.

:func:`foreign_limits` says what else limits a thread's CPU (a quota or burst on its cgroup or an ancestor, or a
bbrlab cgroup) besides the cgroup a run asked for: every model's evidence records it, and a run with any fails.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core.errors import TestbedError

from . import cpustat, ledger

PREFIX = "bbrlab-cfs-"
#: The parent cgroup of bbrlab's own, inside the threads' cgroup, that holds its cgroups.
PARENT = "bbrlab"
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

    def cpu_stat(self, cgroup: Path) -> cpustat.CpuStat | None:
        """``cgroup``'s CFS bandwidth counters now (:func:`bbrlab.contention.cpustat.parse`); None when its
        ``cpu.stat`` cannot be read or lacks them."""
        try:
            text = (cgroup / "cpu.stat").read_text()
        except OSError:
            return None
        return cpustat.parse(text, self.version)

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
    """A cgroup bbrlab made at ``path`` for some threads, inside its parent cgroup ``parent`` (``bbrlab``) inside
    the threads' cgroup ``outer``; ``enabled_cpu``: v2, bbrlab turned ``+cpu`` on in ``outer``'s
    ``cgroup.subtree_control`` and turns it off again; ``entry``: its ledger entry."""

    hierarchy: Hierarchy
    outer: Path
    path: Path
    enabled_cpu: bool = False
    entry: ledger.Entry | None = None

    @property
    def parent(self) -> Path:
        """bbrlab's parent cgroup (``<outer>/bbrlab``)."""
        return self.path.parent

    def to_dict(self) -> dict:
        """What a record keeps of it."""
        return {"hierarchy": self.hierarchy.name, "path": str(self.path), "parent": str(self.parent)}

    def ledger_data(self) -> dict:
        """What its ledger entry names."""
        return {"version": self.hierarchy.version, "root": str(self.hierarchy.root), "outer": str(self.outer),
                "path": str(self.path), "enabled_cpu": self.enabled_cpu}


_counter = iter(range(1, 1 << 30))


def _enable_cpu(cgroup: Path) -> bool:
    """v2: turn ``+cpu`` on in ``cgroup``'s ``cgroup.subtree_control``; whether it was off."""
    if "cpu" in (cgroup / "cgroup.subtree_control").read_text().split():
        return False
    _write(cgroup / "cgroup.subtree_control", "+cpu")
    return True


def _make_parent(own: OwnCgroup) -> None:
    """bbrlab's parent cgroup inside ``own.outer`` (v2: threaded, cpu on in it and for it)."""
    own.parent.mkdir(exist_ok=True)
    if own.hierarchy.version == 2:
        _write(own.parent / "cgroup.type", "threaded")
        own.enabled_cpu = _enable_cpu(own.outer) or own.enabled_cpu
        _enable_cpu(own.parent)


def create(hierarchy: Hierarchy, outer: Path) -> OwnCgroup:
    """Make a new ``bbrlab-cfs-<pid>-<n>`` cgroup in bbrlab's parent cgroup inside ``outer`` (the threads'
    cgroup; v2: a threaded one, cpu enabled), its ledger entry written first."""
    own = OwnCgroup(hierarchy, outer, outer / PARENT / f"{PREFIX}{os.getpid()}-{next(_counter)}")
    own.entry = ledger.write("cgroup", own.ledger_data())
    try:
        for attempt in range(3):  # another session may remove the (empty) parent between the two mkdirs
            try:
                _make_parent(own)
                own.path.mkdir()
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        if hierarchy.version == 2:
            _write(own.path / "cgroup.type", "threaded")
        own.entry = ledger.update(own.entry, own.ledger_data())
    except (OSError, TestbedError) as e:
        problems = remove(own)
        error = e if isinstance(e, TestbedError) else \
            TestbedError(f"could not make the cgroup {own.path}: {e.strerror or e}")
        if problems:
            error.add_note("; ".join(problems))
        raise error from e
    return own


def remove(own: OwnCgroup, back_to: dict[int, Path] | None = None) -> list[str]:
    """Move every thread still in ``own`` back (to ``back_to[tid]``, else the threads' cgroup), remove it and
    bbrlab's parent when empty, turn ``+cpu`` off where bbrlab turned it on, and drop its ledger entry.
    Returns the problems (empty: all done, the entry dropped)."""
    problems = []
    h = own.hierarchy
    for tid in h.members(own.path):
        try:
            h.move(tid, (back_to or {}).get(tid, own.outer))
        except TestbedError as e:
            if Path(f"/proc/{tid}").exists():
                problems.append(str(e))
    try:
        own.path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        problems.append(f"could not remove {own.path}: {e.strerror or e}")
    try:
        own.parent.rmdir()
    except OSError:
        pass  # another session's cgroup is in it, or it is gone already
    if own.enabled_cpu and not own.parent.exists():
        try:
            _write(own.outer / "cgroup.subtree_control", "-cpu")
        except TestbedError:
            pass  # another child uses the cpu controller there now; harmless to leave it on
    if not problems and own.entry is not None:
        ledger.drop(own.entry)
        own.entry = None
    return problems


def owner_pid(path: Path) -> int | None:
    """The process that made a bbrlab cgroup (from its name), or None for another name."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def _from_entry(entry: ledger.Entry, h: Hierarchy) -> OwnCgroup | None:
    """The cgroup ``entry`` names, when it is one bbrlab makes (``<outer>/bbrlab/bbrlab-cfs-<pid>-<n>`` in the
    cpu hierarchy ``h``, no ``..``); None otherwise."""
    d = entry.data
    try:
        if d["version"] != h.version or Path(d["root"]) != h.root:
            return None
        outer, path = Path(d["outer"]), Path(d["path"])
        enabled = bool(d["enabled_cpu"])
    except (KeyError, TypeError, ValueError):
        return None
    if ".." in path.parts or path.parent != outer / PARENT or owner_pid(path) is None or \
            not path.is_relative_to(h.root):
        return None
    return OwnCgroup(h, outer, path, enabled, entry)


def leftovers(hierarchy: Hierarchy | None = None, *, include_live_owners: bool = False) -> list[OwnCgroup]:
    """bbrlab's cgroups whose maker is gone (or all, ``include_live_owners``), as their ledger entries name
    them. An entry of another hierarchy (the cpu controller moved since) or naming no cgroup bbrlab makes is
    dropped: there is nothing of it to undo here."""
    try:
        h = hierarchy or detect()
    except TestbedError:
        return []
    found = []
    for entry in ledger.left("cgroup", include_live_owners=include_live_owners).entries:
        own = _from_entry(entry, h)
        if own is None or not own.path.exists():
            if not include_live_owners:
                if own is not None:
                    remove(own)  # killed before its cgroup was made: its (empty) parent, +cpu; the entry
                ledger.drop(entry)
            continue
        found.append(own)
    return found


def _ours(path: Path) -> bool:
    """``path`` is a directory of this user, not a symbolic link (a cgroup of a delegated subtree is not)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def clear_leftovers(hierarchy: Hierarchy | None = None) -> list[str]:
    """Remove the cgroups a killed bbrlab process left (their threads back into the threads' cgroup), as their
    ledger entries name them; their paths."""
    removed = []
    for own in leftovers(hierarchy):
        if not (_ours(own.path) and _ours(own.parent)):
            raise TestbedError(f"leftover cgroup {own.path} (or its parent) is not a directory of uid "
                               f"{os.geteuid()}: left alone; remove {own.entry.path} once it is dealt with")
        problems = remove(own)
        if problems:
            raise TestbedError(f"leftover cgroup {own.path}: " + "; ".join(problems))
        removed.append(str(own.path))
    return removed


def _limit_here(h: Hierarchy, cgroup: Path) -> str | None:
    """What limits ``cgroup``'s threads in ``cgroup`` itself (a quota, a burst), or None."""
    try:
        quota, period = h.limit(cgroup)
    except (OSError, ValueError):
        quota = None  # the root cgroup of v2 has no cpu.max
    try:
        burst = h.burst(cgroup) if h.burst_file(cgroup).exists() else 0
    except (OSError, ValueError):
        burst = 0
    seen = ([f"quota {quota} us per {period} us"] if quota is not None else []) + \
        ([f"burst {burst} us"] if burst else [])
    return ", ".join(seen) or None


def foreign_limits(thread_ids: list[int], own: Path | None = None, hierarchy: Hierarchy | None = None) -> list[str]:
    """What limits the threads' CPU besides the cgroup ``own`` a run asked for (None: none): a thread not in
    ``own``, a bbrlab cgroup around a thread other than ``own`` and its parent, and a quota or burst on a
    thread's cgroup or any ancestor other than ``own``. Empty: nothing else. No cpu hierarchy: nothing to say."""
    try:
        h = hierarchy or detect()
    except TestbedError:
        return []
    seen = []
    for tid in thread_ids:
        try:
            cgroup = h.thread_cgroup(tid)
        except TestbedError:
            continue  # a thread gone: the evidence says so
        if own is not None and cgroup != own:
            seen.append(f"thread {tid} is in {cgroup}, not in the run's {own}")
        allowed = {own, own.parent} if own is not None else set()
        for c in [cgroup, *cgroup.parents]:
            if not c.is_relative_to(h.root):
                break
            if c not in allowed and (c.name == PARENT or c.name.startswith(PREFIX)):
                seen.append(f"thread {tid} is under bbrlab's cgroup {c}, which this run did not make")
            limit = _limit_here(h, c) if c != own else None
            if limit:
                seen.append(f"thread {tid} is under {limit} in {c}")
    return seen
