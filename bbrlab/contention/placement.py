"""Where a testbed's QEMU threads may run, read at run time for the run record (``metadata.qemu_cpus``).

Each thread's allowed CPUs (``Cpus_allowed_list`` of ``/proc/<tid>/status``) and its cpuset
(``/proc/<tid>/cpuset``; ``/proc/<tid>/cgroup`` where that file is missing), so a record shows whether
its testbed ran on the whole machine or in a CPU partition (:mod:`bbrlab.testbed.isolation`), also one a
killed campaign left. A local testbed's QEMU processes (sender and emulator, every thread) are read on
this machine; a lab's sender vCPU threads on its hypervisor host, over SSH.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core import recordjson

#: Prints "tid<TAB>cpus<TAB>cpuset" for each thread id given as an argument (a lab's hypervisor host).
_REMOTE_SCRIPT = r"""
for t in "$@"; do
  c=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$t/status 2>/dev/null)
  s=$(cat /proc/$t/cpuset 2>/dev/null || sed -n 's/^[0-9]*:[^:]*cpuset[^:]*://p; s/^0:://p' /proc/$t/cgroup 2>/dev/null | head -n1)
  printf '%s\t%s\t%s\n' "$t" "$c" "$s"
done
"""


def _cpuset_of(proc: Path) -> str | None:
    try:
        return (proc / "cpuset").read_text().strip()
    except OSError:
        pass
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # "4:cpuset:/bbrlab-a" (v1), else the unified "0::/path" (v2)
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            return path
    return next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)


def _cpus_allowed(proc: Path) -> str | None:
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def local_thread(pid: int, tid: int) -> dict:
    """Thread ``tid`` of process ``pid`` on this machine: ``{"cpus_allowed": "0-1", "cpuset": "/"}``."""
    proc = Path(f"/proc/{int(pid)}/task/{int(tid)}")
    return {"cpus_allowed": _cpus_allowed(proc), "cpuset": _cpuset_of(proc)}


def local_threads(pid: int) -> dict[int, dict]:
    """Every thread of process ``pid`` on this machine, as :func:`local_thread` reads it."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{int(pid)}/task"))
    except OSError:
        return {}
    return {tid: local_thread(pid, tid) for tid in tids}


def remote_threads(host, tids: list[int]) -> dict[int, dict]:
    """Threads ``tids`` on ``host`` (any :class:`~bbrlab.core.hosts.Host`), as :func:`local_thread` reads them."""
    if not tids:
        return {}
    text = host.output(["sh", "-c", _REMOTE_SCRIPT, "sh", *[str(int(t)) for t in tids]])
    out = {}
    for line in text.splitlines():
        tid, cpus, cpuset = (line.split("\t") + ["", ""])[:3]
        if tid.strip().isdigit():
            out[int(tid)] = {"cpus_allowed": cpus.strip() or None, "cpuset": cpuset.strip() or None}
    return out


def summary(threads: dict[int, dict]) -> dict:
    """The distinct allowed-CPU lists and cpusets of ``threads`` (one each when all threads agree)."""
    return {"threads": len(threads),
            "cpus_allowed": sorted({t["cpus_allowed"] for t in threads.values() if t["cpus_allowed"]}),
            "cpusets": sorted({t["cpuset"] for t in threads.values() if t["cpuset"]})}


@dataclass(frozen=True)
class ThreadPlace:
    """One thread's allowed CPUs (``Cpus_allowed_list``, e.g. ``"0-1"``) and cpuset; None where not readable."""

    cpus_allowed: str | None
    cpuset: str | None


@dataclass(frozen=True, kw_only=True)
class QemuPlace:
    """Where one QEMU's threads may run: its ``pid`` (a local testbed's; a lab's sender is read by thread id
    on its hypervisor host, without it), how many ``threads``, their distinct allowed-CPU lists and cpusets
    (:func:`summary`), and for the sender each vCPU thread's own (``vcpu_threads``, by tid)."""

    pid: int | None = recordjson.left_out_when_none()
    threads: int
    cpus_allowed: list[str]
    cpusets: list[str]
    vcpu_threads: dict[str, ThreadPlace] | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The fields in their order, ``pid`` and ``vcpu_threads`` only when known
        (:func:`bbrlab.core.recordjson.record_layout`)."""
        return recordjson.record_layout(source, handler)


@dataclass(frozen=True)
class QemuCpus:
    """``metadata.qemu_cpus`` of a run record: per QEMU of the testbed (by role, in name order) where its threads
    may run, or the ``error`` that kept them from being read; a role without a QEMU is left out."""

    emulator: QemuPlace | None = recordjson.left_out_when_none()
    receiver: QemuPlace | None = recordjson.left_out_when_none()
    sender: QemuPlace | None = recordjson.left_out_when_none()
    error: str | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The roles read, the others left out (:func:`bbrlab.core.recordjson.record_layout`)."""
        return recordjson.record_layout(source, handler)


def _vcpus(threads: dict[int, dict]) -> dict[str, ThreadPlace]:
    return {str(t): ThreadPlace(v["cpus_allowed"], v["cpuset"]) for t, v in threads.items()}


def of_testbed(testbed, vcpu_tids: list[int]) -> QemuCpus:
    """``metadata.qemu_cpus``: per QEMU of a local testbed its ``pid`` and :func:`summary` of all its threads,
    and for the sender each vCPU thread (``vcpu_threads``, by tid); for a lab the sender's vCPU threads as
    read on its hypervisor host. A reading that fails is recorded as its ``error``."""
    try:
        if testbed.kind == "local" and testbed.local is not None and testbed.local.qemu_pids:
            places: dict[str, QemuPlace] = {}
            for role, pid in sorted(testbed.local.qemu_pids.items()):
                if not pid:
                    continue
                threads = local_threads(pid)
                vcpus = _vcpus({t: threads.get(t) or local_thread(pid, t) for t in vcpu_tids}) \
                    if role == "sender" else None
                places[role] = QemuPlace(pid=pid, **summary(threads), vcpu_threads=vcpus)
            return QemuCpus(**places)
        threads = remote_threads(testbed.sender.hypervisor, vcpu_tids)
        return QemuCpus(sender=QemuPlace(**summary(threads), vcpu_threads=_vcpus(threads)))
    except Exception as e:  # noqa: BLE001 - a record says what it could not read, the run goes on
        return QemuCpus(error=f"{type(e).__name__}: {e}")
