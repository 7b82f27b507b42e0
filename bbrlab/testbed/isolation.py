"""Several local testbeds on one machine, kept from competing for CPUs and for deadline bandwidth.

SCHED_DEADLINE admits and schedules per *root domain*, and a deadline task's CPU affinity must span
its whole root domain: pinning two testbeds' vCPU threads to different CPUs with plain affinity is
refused, and without separation one testbed's contended vCPU and its neighbour's emulator, receiver and
vCPUs share CPUs and bandwidth. Exclusive cpusets that form their own root domains separate them:

- **cgroup v2**: a child cgroup per testbed with the cpuset controller, its CPUs, and
  ``cpuset.cpus.partition = root`` (read back: an invalid partition is refused);
- **cgroup v1** (hybrid hosts such as this project's, whose v2 hierarchy has no cpuset controller): an
  exclusive child cpuset per testbed, with the top cpuset's ``sched_load_balance`` turned off while any
  partition exists, so that each child is its own root domain.

A testbed's partition receives its QEMU processes (sender and emulator, every thread) and the process that
drives the testbed (its Dask worker), so that what that process starts (the receiver's iperf3 server in
the testbed's namespace) runs there too. Each partition needs at least one CPU of its own, so a machine
isolates at most as many testbeds as it has CPUs (cgroup v2 keeps one CPU for the rest of the system):
:func:`plan` refuses more with a message saying so.

While partitions exist (v1), deadline policies can only be set on tasks inside a partition: other local
testbeds not taking part in the campaign cannot be contended meanwhile. :func:`remove` puts everything back.

Each partition has an owner, the process that made it (its pid and start time in ``partition-NAME.json``
beside the testbed locks). A partition whose owner is gone (a campaign killed with SIGKILL: its workers
died with it, the QEMU processes stayed in the partition on its few CPUs) is a leftover:
:func:`clear_leftovers` removes it before a testbed is used again (``recover()``, ``testbed up``), and
refuses, naming the process, a partition whose owner still runs.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core.errors import TestbedError

V2_ROOT = Path("/sys/fs/cgroup")
V1_ROOT = Path("/sys/fs/cgroup/cpuset")
PREFIX = "bbrlab-"


def flavour(v2_root: Path = V2_ROOT, v1_root: Path = V1_ROOT) -> str | None:
    """``"v2"`` when the unified hierarchy offers cpuset, ``"v1"`` for a v1 cpuset hierarchy, else None."""
    controllers = v2_root / "cgroup.controllers"
    if controllers.is_file() and "cpuset" in controllers.read_text().split():
        return "v2"
    if (v1_root / "cpuset.cpus").is_file():
        return "v1"
    return None


def online_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), sorted: what :func:`plan` shares out by default."""
    return sorted(os.sched_getaffinity(0))


def plan(names: list[str], cpus: list[int] | None = None, kind: str | None = "auto") -> dict[str, list[int]]:
    """CPUs for each testbed's partition: the CPUs split as evenly as possible, each testbed at least one.

    ``kind`` is the cgroup flavour (``"auto"``: this machine's, :func:`flavour`). Raises
    :class:`TestbedError` when the machine cannot isolate that many testbeds.
    """
    cpus = sorted(cpus if cpus is not None else online_cpus())
    kind = flavour() if kind == "auto" else kind
    if kind is None:
        raise TestbedError("this machine has no cpuset cgroup (v1 or v2): several local testbeds cannot be kept "
                           "apart; run one local testbed at a time")
    usable = cpus[1:] if kind == "v2" else cpus  # v2: the rest of the system keeps the first CPU
    if len(names) > len(usable):
        raise TestbedError(f"{len(names)} local testbeds need {len(names)} CPUs of their own; this machine can give "
                           f"{len(usable)} ({len(cpus)} online{', one kept for the system' if kind == 'v2' else ''}): "
                           f"use at most {len(usable)} local testbeds")
    share, extra = divmod(len(usable), len(names))
    out, start = {}, 0
    for i, name in enumerate(names):
        n = share + (1 if i < extra else 0)
        out[name] = usable[start:start + n]
        start += n
    return out


def _cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise TestbedError(f"cannot write {value.strip()!r} to {path}: {e.strerror}") from None


@dataclass(frozen=True)
class Partition:
    """One testbed's exclusive cpuset."""

    name: str
    cpus: tuple[int, ...]
    path: Path
    kind: str  # v1 | v2

    @property
    def procs_file(self) -> Path:
        """The partition's ``cgroup.procs`` file (the same name under cgroup v1 and v2)."""
        return self.path / "cgroup.procs"

    def add_process(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the partition."""
        _write(self.procs_file, f"{int(pid)}\n")

    def processes(self) -> list[int]:
        """The pids of the processes in the partition now, as ``cgroup.procs`` lists them."""
        return [int(x) for x in self.procs_file.read_text().split()]


def create(name: str, cpus: list[int], *, kind: str | None = None, v2_root: Path = V2_ROOT,
           v1_root: Path = V1_ROOT) -> Partition:
    """Create (or take over) testbed ``name``'s partition on ``cpus``; raise if the kernel refuses it."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise TestbedError(f"not a testbed name for a cpuset: {name!r}")
    kind = kind or flavour(v2_root, v1_root)
    if kind in ("v1", "v2"):
        _write_owner(name, cpus)  # first: a partition is never seen without its owner
    if kind == "v2":
        _write(v2_root / "cgroup.subtree_control", "+cpuset\n")
        path = v2_root / f"{PREFIX}{name}"
        path.mkdir(exist_ok=True)
        _write(path / "cpuset.cpus", _cpu_list(cpus) + "\n")
        _write(path / "cpuset.cpus.partition", "root\n")
        state = (path / "cpuset.cpus.partition").read_text().strip()
        if state != "root":
            raise TestbedError(f"the kernel made {path} a '{state}' partition, not an isolated root: "
                               f"{(path / 'cpuset.cpus.effective').read_text().strip()!r} effective CPUs")
    elif kind == "v1":
        path = v1_root / f"{PREFIX}{name}"
        path.mkdir(exist_ok=True)
        _write(path / "cpuset.cpus", _cpu_list(cpus) + "\n")
        _write(path / "cpuset.mems", (v1_root / "cpuset.mems").read_text())
        _write(path / "cpuset.cpu_exclusive", "1\n")
        _write(path / "cpuset.sched_load_balance", "1\n")
        _write(v1_root / "cpuset.sched_load_balance", "0\n")  # children become root domains of their own
    else:
        raise TestbedError("this machine has no cpuset cgroup: cannot isolate local testbeds")
    return Partition(name, tuple(cpus), path, kind)


def existing(kind: str | None = None, v2_root: Path = V2_ROOT, v1_root: Path = V1_ROOT) -> list[Partition]:
    """bbrlab's partitions present now (also those a killed process left)."""
    kind = kind or flavour(v2_root, v1_root)
    root = v2_root if kind == "v2" else v1_root
    out = []
    for path in sorted(root.glob(f"{PREFIX}*")) if kind else []:
        cpus_file = path / ("cpuset.cpus" if kind == "v1" else "cpuset.cpus")
        text = cpus_file.read_text().strip() if cpus_file.is_file() else ""
        out.append(Partition(path.name[len(PREFIX):], tuple(_parse_cpus(text)), path, kind))
    return out


def _parse_cpus(text: str) -> list[int]:
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def remove(partition: Partition, *, v2_root: Path = V2_ROOT, v1_root: Path = V1_ROOT) -> None:
    """Move the partition's processes back to the top cgroup and delete it; the last one gone, v1's top cpuset
    balances load again."""
    root = v2_root if partition.kind == "v2" else v1_root
    if partition.path.is_dir():
        for pid in partition.processes():
            try:
                _write(root / "cgroup.procs", f"{pid}\n")
            except TestbedError:
                continue  # exited meanwhile
        if partition.kind == "v2":
            _write(partition.path / "cpuset.cpus.partition", "member\n")
        try:
            partition.path.rmdir()
        except OSError as e:
            raise TestbedError(f"cannot remove the CPU partition {partition.path}: {e.strerror} (processes "
                               f"{_read_procs(partition)} are still in it)") from None
    owner_file(partition.name).unlink(missing_ok=True)
    if partition.kind == "v1" and not existing("v1", v2_root, v1_root):
        _write(v1_root / "cpuset.sched_load_balance", "1\n")


def _read_procs(partition: Partition) -> list[int]:
    try:
        return partition.processes()
    except OSError:
        return []


def remove_leftovers(names: list[str]) -> list[Partition]:
    """Remove the partitions of testbeds ``names`` that a killed campaign left behind (its workers died with
    it, so nobody removed them); the processes in them go back to the top cpuset. Returns what was removed.
    Raises :class:`TestbedError` for a partition whose owner still runs (see :func:`clear_leftovers`)."""
    gone = []
    for name in names:
        gone.extend(clear_leftovers(name, others=False))
    return gone


# -- owners ---------------------------------------------------------------------------------------------

def owner_file(name: str) -> Path:
    """Where the owner of testbed ``name``'s partition is written (beside the testbed locks, private)."""
    from .lock import lock_dir

    return lock_dir() / f"partition-{name}.json"


def _start_ticks(pid: int) -> int | None:
    """Process ``pid``'s start time (clock ticks since boot), or None when it does not exist."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _write_owner(name: str, cpus: list[int]) -> None:
    pid = os.getpid()
    info = {"pid": pid, "start_ticks": _start_ticks(pid), "cpus": list(cpus), "created_unix_s": round(time.time(), 3)}
    path = owner_file(name)
    tmp = path.with_name(f".{path.name}.{pid}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


def owner(name: str) -> dict | None:
    """The recorded owner of testbed ``name``'s partition (``pid``, ``start_ticks``...), None if unrecorded."""
    try:
        info = json.loads(owner_file(name).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def owner_alive(info: dict | None) -> bool:
    """Whether the process that made a partition still runs (same pid and start time: not a recycled pid)."""
    return bool(info) and _start_ticks(info["pid"]) is not None and _start_ticks(info["pid"]) == info.get("start_ticks")


def _describe_process(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        text = " ".join(" ".join(a.decode(errors="replace").split()) for a in argv if a)
        return f"pid {pid} ({text[:120]}{'...' if len(text) > 120 else ''})"
    except OSError:
        return f"pid {pid}"


def clear_leftovers(name: str, *, others: bool = True, locked=None) -> list[Partition]:
    """Remove testbed ``name``'s partition when a killed campaign left it; return what was removed.

    A partition made by this process (a multi-testbed campaign's worker, using it) stays. One whose owner is
    another process still running is refused with :class:`TestbedError` naming that process: it is no
    leftover, and running on the testbed now would measure it on the partition's CPUs only. With ``others``,
    other testbeds' leftovers go too when nobody holds their lock (``locked(name)`` says whether someone
    does; default: :func:`bbrlab.testbed.lock.lock_holders`): on cgroup v1 any partition turns the machine's
    load balancing off and keeps deadline policies from threads outside it.
    """
    locked = locked or _lock_held
    gone = []
    for part in existing():
        info = owner(part.name)
        if info and info.get("pid") == os.getpid() and owner_alive(info):
            continue  # ours, in use
        if owner_alive(info):
            if part.name == name:
                raise TestbedError(
                    f"testbed {name}'s CPU partition {part.path} (CPUs {_cpu_list(list(part.cpus))}) belongs to "
                    f"{_describe_process(info['pid'])}, which still runs: its QEMU threads are confined to those "
                    "CPUs. Let that campaign end (or stop it), then try again")
            continue
        if part.name != name and (not others or locked(part.name)):
            continue
        remove(part)
        gone.append(part)
    return gone


def _lock_held(name: str) -> bool:
    from .lock import lock_holders, lock_path

    try:
        return bool(lock_holders(lock_path(name)))
    except TestbedError:
        return True  # not a name bbrlab could lock: leave it alone


def isolate_testbed(name: str, cpus: list[int], qemu_pids: list[int], *, include_self: bool = True) -> Partition:
    """Partition ``cpus`` for testbed ``name`` and move its QEMU processes (and this process) into it."""
    part = create(name, cpus)
    for pid in qemu_pids:
        part.add_process(pid)
    if include_self:
        part.add_process(os.getpid())
    return part
