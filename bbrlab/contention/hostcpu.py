"""How busy a host's CPUs were over a stretch of time: two snapshots of ``/proc/stat``.

A run records this while the client transfers (``metadata.cpu_load``) for the emulator and for the host
that runs the sender VM. The emulator forwards every packet, and under QEMU TCG it is a guest that spends
far more CPU per packet than a real router, so it can be the limit of a fast transfer; the sender's
hypervisor host also runs QEMU's I/O threads (and, on the local testbed, the emulator and whatever else the
machine does). When either was busy nearly all the time, a throughput says more about it than about the
sender's congestion control (see :mod:`bbrlab.calibration.calibrate`).

``/proc/stat`` counts, per CPU, the clock ticks spent in user, nice, system, idle, iowait, irq,
softirq and steal time; busy is everything but idle and iowait. Forwarding happens in softirq, which is
reported on its own. Inside a guest the counts are the guest's view: time the host did not run the
vCPU while it had work shows up as busy (TCG reports no steal), which is the right reading here: the
emulator could not forward more.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bbrlab.core.errors import BbrlabError
from bbrlab.core.hosts import Host

#: The first eight fields of a ``cpu`` line (guest time is already part of user and nice).
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
IDLE_FIELDS = ("idle", "iowait")


@dataclass(frozen=True)
class CpuTimes:
    """Tick counters per CPU (``cpu0``, ``cpu1``, ...; ``cpu`` is the sum of all)."""

    ticks: dict[str, dict[str, int]]


def parse_proc_stat(text: str) -> CpuTimes:
    """The ``cpu*`` lines of ``/proc/stat``; raises when there are none."""
    ticks = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu"):
            continue
        values = [int(v) for v in parts[1:1 + len(FIELDS)]]
        ticks[parts[0]] = dict(zip(FIELDS, values + [0] * (len(FIELDS) - len(values)), strict=True))
    if "cpu" not in ticks:
        raise BbrlabError("no cpu line in /proc/stat")
    return CpuTimes(ticks)


def read(host: Host) -> CpuTimes:
    """``/proc/stat`` of ``host`` now."""
    if host.is_local:  # a network namespace of this machine shares its /proc/stat
        with open("/proc/stat") as f:
            return parse_proc_stat(f.read())
    return parse_proc_stat(host.output(["cat", "/proc/stat"], timeout=20))


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole > 0 else None


@dataclass(frozen=True)
class HostBusy:
    """One host's CPU during a run's transfer (:func:`busy_between`): the busy share of all its CPUs, its softirq
    part and the busiest single CPU [%] (None without ticks), how many CPUs, the ticks they rest on."""

    busy_pct: float | None
    softirq_pct: float | None
    busiest_cpu_pct: float | None
    cpus: int
    ticks: int


@dataclass(frozen=True)
class CpuLoad:
    """``metadata.cpu_load`` of a run record: the emulator's and the sender's hypervisor's CPU during the transfer
    (the hosts of :meth:`bbrlab.run.session.TestbedSession.watched_hosts`)."""

    emulator: HostBusy
    sender_hypervisor: HostBusy


def busy_between(first: CpuTimes, last: CpuTimes) -> dict:
    """Busy share of all CPUs, its softirq part, the busiest single CPU, and the ticks it rests on."""
    def delta(name: str) -> dict[str, int]:
        a, b = first.ticks.get(name, {}), last.ticks.get(name, {})
        return {k: b.get(k, 0) - a.get(k, 0) for k in FIELDS}

    def busy(d: dict[str, int]) -> tuple[int, int]:
        total = sum(d.values())
        return total - sum(d[k] for k in IDLE_FIELDS), total

    allcpu = delta("cpu")
    busy_all, total_all = busy(allcpu)
    per_cpu = [busy(delta(n)) for n in sorted(last.ticks) if n != "cpu" and n in first.ticks]
    busiest = max((_pct(b, t) for b, t in per_cpu if t > 0), default=None)
    return {"busy_pct": _pct(busy_all, total_all), "softirq_pct": _pct(allcpu["softirq"], total_all),
            "busiest_cpu_pct": busiest, "cpus": len(per_cpu), "ticks": total_all}


@contextmanager
def watching(hosts: dict[str, Host]) -> Iterator[dict]:
    """Snapshot the CPU counters of ``hosts`` before and after the block: the yielded dict holds, after
    the block, each name's :func:`busy_between` (nothing when the block raised: its error is what matters)."""
    first = {name: read(host) for name, host in hosts.items()}
    found: dict = {}
    yield found
    found.update({name: busy_between(first[name], read(host)) for name, host in hosts.items()})
