"""The kernel's own count of admitted SCHED_DEADLINE bandwidth, read and, on request, recounted.

Admission control does not sum the deadline threads that exist: it keeps a running total per root domain
(``dl_bw->total_bw``), added to when a thread is admitted and taken from when it leaves. Measured on this
project's 6.18 host (and likely Debian's 6.1 guest, which refused admission with no deadline thread left),
that total drifts: a thread that sleeps and wakes often (a
QEMU vCPU thread, an idle guest's) and is put back to SCHED_OTHER often keeps its bandwidth counted (a 25 %
reservation stayed counted in 9 of 13 tries, 2 of 4 of them made with ``chrt``: the kernel's doing, not
bbrlab's), and once the count went below zero. After a handful of runs the count can fill the root domain, and
every admission is refused with EBUSY though no deadline thread exists.

:func:`kernel_total` reads the count where debugfs shows it (``/sys/kernel/debug/sched/debug``);
:func:`recount` makes the kernel rebuild its root domains, which counts the threads that are really there
(plus the fair server's reservation). On a cgroup-v1 host that is a toggle of the root cpuset's
``cpuset.sched_load_balance``; for cgroup v2 it says what to do instead. Nothing calls :func:`recount` behind
the user's back: ``bbrlab contention recount`` and the admission error name it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core.errors import TestbedError
from bbrlab.core.hosts import Host

SCHED_DEBUG = "/sys/kernel/debug/sched/debug"
V1_BALANCE = "/sys/fs/cgroup/cpuset/cpuset.sched_load_balance"
V2_CONTROLLERS = "/sys/fs/cgroup/cgroup.controllers"
#: The kernel's fixed-point unit of bandwidth (BW_SHIFT = 20): 1 << 20 is one whole CPU.
BW_UNIT = 1 << 20


@dataclass(frozen=True)
class KernelCount:
    """What one root domain's admission control holds, as fractions of a CPU (debugfs' ``dl_bw``)."""

    total_cpus: float  # admitted bandwidth the kernel counts (negative when the count went below zero)
    per_cpu_limit: float  # what it admits per CPU (sched_rt_runtime_us / sched_rt_period_us)

    @property
    def drifted_below_zero(self) -> bool:
        """The count is negative: the kernel refuses every admission until it is recounted."""
        return self.total_cpus < 0


def kernel_total(host: Host) -> KernelCount | None:
    """The first root domain's admitted bandwidth as the kernel counts it, or None when debugfs is not
    mounted or readable on ``host`` (the count is then unknown, not zero)."""
    try:
        text = host.read_text(SCHED_DEBUG)
    except Exception:  # noqa: BLE001 - no debugfs, no permission: the count cannot be read
        return None
    return parse_sched_debug(text)


def parse_sched_debug(text: str) -> KernelCount | None:
    """The first ``dl_bw->bw`` / ``dl_bw->total_bw`` pair of a sched debug dump (None when it has none)."""
    bw = total = None
    for line in text.splitlines():
        name, _, value = line.strip().partition(":")
        name = name.strip()
        if name == ".dl_bw->bw" and bw is None:
            bw = int(value)
        elif name == ".dl_bw->total_bw" and total is None:
            total = int(value)
        if bw is not None and total is not None:
            return KernelCount(total / BW_UNIT, bw / BW_UNIT)
    return None


def recount(host: Host) -> KernelCount | None:
    """Make ``host``'s kernel rebuild its root domains, recounting the deadline bandwidth of the threads that
    exist; return the count read afterwards (None when debugfs does not show it).

    On cgroup v1 the root cpuset's load balancing is switched off and straight back on; a host that had it off
    is refused (turning it on would change the host's scheduling). cgroup v2 has no such switch: the error says
    how to rebuild there (any CPU partition made and removed, or a CPU taken offline and back)."""
    if host.exists(V1_BALANCE):
        before = host.read_text(V1_BALANCE).strip()
        if before != "1":
            raise TestbedError(f"{host.name}: {V1_BALANCE} is {before!r}: this host's load balancing was switched off "
                               "on purpose; bbrlab will not switch it on to recount the deadline bandwidth")
        host.write_value(V1_BALANCE, 0)
        host.write_value(V1_BALANCE, 1)
        return kernel_total(host)
    if host.exists(V2_CONTROLLERS):
        raise TestbedError(f"{host.name}: on cgroup v2 bbrlab cannot recount the deadline bandwidth by itself; the "
                           "kernel recounts whenever its root domains are rebuilt: make and remove a cpuset partition "
                           "(cpuset.cpus.partition), or take a CPU offline and back "
                           "(/sys/devices/system/cpu/cpuN/online)")
    raise TestbedError(f"{host.name}: no cpuset cgroup found: the deadline bandwidth cannot be recounted here")


def drift_note(host: Host, visible_cpus: float) -> str:
    """A sentence for an admission refusal: the kernel's own count against ``visible_cpus`` (what the deadline
    threads that exist hold, the fair server's reservation included), or how to recount when it is unknown."""
    count = kernel_total(host)
    fix = "`bbrlab contention recount` makes the kernel count again"
    if count is None:
        return (f"If the threads that exist leave room, the kernel's own count has drifted (it keeps the bandwidth of "
                f"threads that left SCHED_DEADLINE after sleeping often, as QEMU's vCPU threads do); {fix}")
    if count.total_cpus > visible_cpus + 0.005 or count.drifted_below_zero:
        return (f"The kernel counts {100 * count.total_cpus:.1f} % admitted where the deadline threads that exist and "
                f"the fair server hold {100 * visible_cpus:.1f} %: its count has drifted (a kernel leak when a thread "
                f"that sleeps often leaves SCHED_DEADLINE); {fix}")
    return f"The kernel counts {100 * count.total_cpus:.1f} % admitted, as the threads that exist hold"
