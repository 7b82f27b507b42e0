"""Which of the sender's vCPUs carried the flow's network work (``metadata.softirqs``).

With one vCPU everything runs on it: the iperf3 client, the NIC's interrupts and the softirqs they raise. With
several, the interrupt of the experiment interface and the softirqs it raises (``NET_RX`` for the ACKs that
arrive, ``NET_TX`` when the qdisc runs deferred) may run on another vCPU than the client, so contending every
vCPU alike is not the same as contending the one the client ran on. :class:`SoftirqWatch` reads the sender's
per-CPU counters before and after the flow, in one command each (bash builtins; forks are slow in a TCG
guest): ``/proc/softirqs`` (``NET_RX``, ``NET_TX``), ``/proc/stat`` (each CPU's user + nice + system ticks,
where the processes ran, and its softirq ticks) and ``/proc/interrupts`` (the interrupts of the experiment
interface's virtio device), and once the interface's queues (``/sys/class/net/IF/queues``: a single-queue
virtio NIC has one ``rx-0`` and one ``tx-0``). :class:`SoftirqRecord` holds the per-CPU differences.

The window runs from before the contention is applied to after the samplers stop, so a few packets of the SSH
commands around the flow count in ``NET_RX``/``NET_TX`` (they come through the management interface); the
experiment interface's interrupts are that interface's alone. The client's CPU is read off ``/proc/stat``: the
CPU whose processes used the most ticks over the window (the iperf3 client is the sender's busiest process
during a transfer), not sampled from the client's own ``/proc/PID/stat``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bbrlab.core.errors import BbrlabError, TestbedError
from bbrlab.core.hosts import Host

#: bash, fixed text: "$1" the receiver's address, "$2" the interface (empty: found from the route to "$1",
#: printed with its queues and virtio device). The /proc files are read with builtins only (no fork).
_READ = r"""
dev=$2
if [ -z "$dev" ]; then
    dev=$(ip -o route get "$1" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
    echo "dev=$dev"
    if [ -n "$dev" ] && [ -d "/sys/class/net/$dev/queues" ]; then
        set -- "/sys/class/net/$dev/queues"/rx-*; echo "rx_queues=$#"
        set -- "/sys/class/net/$dev/queues"/tx-*; echo "tx_queues=$#"
        device=$(readlink "/sys/class/net/$dev/device" 2>/dev/null); echo "device=${device##*/}"
    fi
fi
for f in softirqs stat interrupts; do
    echo "--$f"
    while IFS= read -r line; do printf '%s\n' "$line"; done < "/proc/$f"
done
"""


class SoftirqReadError(TestbedError):
    """The sender's per-CPU counters could not be read or made no sense (the message says which)."""


@dataclass(frozen=True)
class CpuCounters:
    """The sender's per-CPU counters at one moment (index = CPU number)."""

    net_rx: tuple[int, ...]
    net_tx: tuple[int, ...]
    process_ticks: tuple[int, ...]  # user + nice + system, /proc/stat's clock ticks
    softirq_ticks: tuple[int, ...]
    nic_irqs: tuple[int, ...] | None  # the experiment interface's virtio interrupts; None when not found
    online_cpus: int  # the cpuN lines of /proc/stat


def _sections(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``(key=value lines before the first section, {section: its lines})`` of :data:`_READ`'s output."""
    values: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("--"):
            current = sections.setdefault(line[2:].strip(), [])
        elif current is not None:
            current.append(line)
        elif "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values, sections


def _per_cpu(fields: list[str], cpus: int) -> tuple[int, ...]:
    """The first ``cpus`` counters of a /proc/softirqs or /proc/interrupts row (after its label)."""
    numbers = []
    for f in fields[:cpus]:
        if not f.isdigit():
            break
        numbers.append(int(f))
    if len(numbers) != cpus:
        raise SoftirqReadError(f"a row of {cpus} per-CPU counters expected, read {fields[:cpus]!r}")
    return tuple(numbers)


def parse_softirqs(lines: list[str]) -> dict[str, tuple[int, ...]]:
    """``{"NET_RX": per-CPU counts, "NET_TX": ...}`` of ``/proc/softirqs``' lines (a header of CPU names first)."""
    if not lines or not lines[0].split() or not all(c.startswith("CPU") for c in lines[0].split()):
        raise SoftirqReadError(f"/proc/softirqs does not start with its CPU header: {lines[:1]!r}")
    cpus = len(lines[0].split())
    rows = {}
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        if label.strip() in ("NET_RX", "NET_TX"):
            rows[label.strip()] = _per_cpu(rest.split(), cpus)
    if set(rows) != {"NET_RX", "NET_TX"}:
        raise SoftirqReadError(f"/proc/softirqs has no NET_RX and NET_TX rows (found {sorted(rows)})")
    return rows


def parse_stat(lines: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(process ticks, softirq ticks)`` per CPU of ``/proc/stat``'s ``cpuN`` lines (user + nice + system; the
    7th field), in CPU order."""
    by_cpu: dict[int, tuple[int, int]] = {}
    for line in lines:
        parts = line.split()
        if not parts or not parts[0].startswith("cpu") or not parts[0][3:].isdigit():
            continue
        ticks = [int(p) for p in parts[1:8] if p.isdigit()]
        if len(ticks) < 7:
            raise SoftirqReadError(f"/proc/stat: {line!r} has fewer than seven tick counts")
        by_cpu[int(parts[0][3:])] = (ticks[0] + ticks[1] + ticks[2], ticks[6])
    if not by_cpu:
        raise SoftirqReadError("/proc/stat has no cpuN lines")
    cpus = range(max(by_cpu) + 1)
    return (tuple(by_cpu.get(c, (0, 0))[0] for c in cpus), tuple(by_cpu.get(c, (0, 0))[1] for c in cpus))


def parse_interrupts(lines: list[str], device: str) -> tuple[int, ...] | None:
    """Per-CPU interrupts of virtio ``device`` (``virtio2``: its ``virtio2-input.0``, ``-output.0`` ... rows
    summed) in ``/proc/interrupts``' lines; None when ``device`` is empty or has no row."""
    if not device or not lines:
        return None
    cpus = len(lines[0].split())
    total = None
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        if not label.strip().isdigit() or f"{device}-" not in rest:
            continue
        counts = _per_cpu(rest.split(), cpus)
        total = counts if total is None else tuple(a + b for a, b in zip(total, counts, strict=True))
    return total


def counters_of(text: str, device: str) -> tuple[dict[str, str], CpuCounters]:
    """The key=value lines and the counters of one :data:`_READ` output (``device``: the virtio device whose
    interrupts count, from the first read)."""
    values, sections = _sections(text)
    softirqs = parse_softirqs(sections.get("softirqs", []))
    process, softirq = parse_stat(sections.get("stat", []))
    nic = parse_interrupts(sections.get("interrupts", []), values.get("device", device))
    return values, CpuCounters(softirqs["NET_RX"], softirqs["NET_TX"], process, softirq, nic, len(process))


def _delta(after: tuple[int, ...] | None, before: tuple[int, ...] | None) -> list[int] | None:
    if after is None or before is None or len(after) != len(before):
        return None
    return [a - b for a, b in zip(after, before, strict=True)]


def top_cpu(counts: list[int] | None) -> tuple[int | None, float | None]:
    """``(CPU, its share of the total)`` of the CPU with the highest count (the lowest number on a tie);
    ``(None, None)`` when there are no counts or they sum to 0."""
    if not counts or sum(counts) <= 0:
        return None, None
    cpu = max(range(len(counts)), key=lambda c: (counts[c], -c))
    return cpu, round(counts[cpu] / sum(counts), 4)


@dataclass(frozen=True)
class SoftirqRecord:
    """``metadata.softirqs``: where the sender's network work ran over the flow, one entry per CPU.

    ``cpus``: the sender's online CPUs (``/proc/stat``), the vCPU count the run really had. ``interface``, its
    ``rx_queues`` and ``tx_queues`` (1 each: a single-queue virtio NIC) and its virtio ``device``. Per CPU over
    the window (``window_s``): ``net_rx`` and ``net_tx`` softirqs, ``nic_irqs`` (the interface's interrupts; None
    when its device was not found), ``process_ticks`` (user + nice + system clock ticks: where the processes,
    the iperf3 client foremost, ran) and ``softirq_ticks`` (time in softirqs, in ticks)."""

    cpus: int
    interface: str
    rx_queues: int | None
    tx_queues: int | None
    device: str
    net_rx: list[int]
    net_tx: list[int]
    process_ticks: list[int]
    softirq_ticks: list[int]
    nic_irqs: list[int] | None = None
    window_s: float | None = None

    @property
    def net_rx_top(self) -> tuple[int | None, float | None]:
        """The CPU that ran the most NET_RX softirqs and its share of them."""
        return top_cpu(self.net_rx)

    @property
    def net_tx_top(self) -> tuple[int | None, float | None]:
        """The CPU that ran the most NET_TX softirqs and its share of them."""
        return top_cpu(self.net_tx)

    @property
    def nic_irq_top(self) -> tuple[int | None, float | None]:
        """The CPU that took the most of the interface's interrupts and its share of them."""
        return top_cpu(self.nic_irqs)

    @property
    def process_top(self) -> tuple[int | None, float | None]:
        """The CPU whose processes used the most ticks (where the iperf3 client ran) and its share of them."""
        return top_cpu(self.process_ticks)


class SoftirqWatch:
    """A context manager: the sender's counters read on entering and on leaving; :meth:`record` their
    differences. Safe to enter in a thread (:class:`bbrlab.core.sidebyside.SideBySide`). A read on leaving
    that fails after the block failed is dropped (the block's failure is the one reported)."""

    def __init__(self, host: Host, toward_ip: str):
        self.host, self.toward_ip = host, toward_ip
        self.values: dict[str, str] = {}
        self.before: CpuCounters | None = None
        self.after: CpuCounters | None = None
        self._t0 = self._t1 = 0.0

    def _read(self, interface: str) -> tuple[dict[str, str], CpuCounters]:
        try:
            out = self.host.output(["bash", "-c", _READ, "bbrlab-softirqs", self.toward_ip, interface], timeout=60)
        except BbrlabError as e:
            raise SoftirqReadError(f"{self.host.name}: reading /proc/softirqs failed: {e}") from e
        return counters_of(out, self.values.get("device", ""))

    def __enter__(self) -> SoftirqWatch:
        self.values, self.before = self._read("")
        if not self.values.get("dev"):
            raise SoftirqReadError(f"{self.host.name}: no route to {self.toward_ip}")
        self._t0 = time.monotonic()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self._t1 = time.monotonic()
            self.after = self._read(self.values["dev"])[1]
        except SoftirqReadError:
            if exc_type is None:
                raise
        return False

    def record(self) -> SoftirqRecord | None:
        """The differences between the two reads; None before both were made."""
        b, a = self.before, self.after
        if b is None or a is None:
            return None
        if a.online_cpus != b.online_cpus or len(a.net_rx) != len(b.net_rx):
            raise SoftirqReadError(f"{self.host.name}: its CPUs changed during the run ({b.online_cpus} -> "
                                   f"{a.online_cpus} online)")
        v = self.values
        return SoftirqRecord(
            cpus=b.online_cpus, interface=v.get("dev", ""), rx_queues=_int(v.get("rx_queues")),
            tx_queues=_int(v.get("tx_queues")), device=v.get("device", ""), net_rx=_delta(a.net_rx, b.net_rx),
            net_tx=_delta(a.net_tx, b.net_tx), process_ticks=_delta(a.process_ticks, b.process_ticks),
            softirq_ticks=_delta(a.softirq_ticks, b.softirq_ticks), nic_irqs=_delta(a.nic_irqs, b.nic_irqs),
            window_s=round(self._t1 - self._t0, 3))


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
