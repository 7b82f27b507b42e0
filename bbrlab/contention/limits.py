"""The SCHED_DEADLINE limits of a hypervisor host's kernel, read live, and whether a contention can ever
fit them (:func:`check_fits`). Used by :mod:`bbrlab.contention.deadline` before it changes anything, and by
a campaign's pre-flight for every timeslice x share of its spec."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.scenario.scenario import Contention

from .threadstat import read_proc_files


@dataclass(frozen=True)
class KernelLimits:
    """What the hypervisor host's kernel accepts for SCHED_DEADLINE, read live from /proc and /sys."""

    period_min_us: int
    period_max_us: int
    rt_runtime_us: int
    rt_period_us: int
    online_cpus: int
    kernel_release: str

    @property
    def capacity_cpus(self) -> float | None:
        """Total deadline bandwidth admission control allows, in CPUs (None: no limit, rt_runtime = -1).

        Admission control counts per root domain; with no exclusive cpusets that is all online CPUs.
        """
        if self.rt_runtime_us < 0:
            return None
        return self.online_cpus * self.rt_runtime_us / self.rt_period_us

    @property
    def fair_server_cpus(self) -> float:
        """The deadline bandwidth Linux >= 6.12 reserves for its fair server (5 % of each CPU by default)."""
        try:
            major, minor = (int(x) for x in self.kernel_release.split(".")[:2])
        except ValueError:
            return 0.0
        return 0.05 * self.online_cpus if (major, minor) >= (6, 12) else 0.0

    def to_dict(self) -> dict:
        """The limits as a record keeps them, ``capacity_cpus`` included."""
        d = asdict(self)
        d["capacity_cpus"] = self.capacity_cpus
        return d

    @classmethod
    def from_dict(cls, d: dict) -> KernelLimits:
        """Limits read from a record (``capacity_cpus`` is derived from the others, not read)."""
        return cls(**{f.name: d[f.name] for f in fields(cls)})


_LIMIT_FILES = {
    "period_min_us": "/proc/sys/kernel/sched_deadline_period_min_us",
    "period_max_us": "/proc/sys/kernel/sched_deadline_period_max_us",
    "rt_runtime_us": "/proc/sys/kernel/sched_rt_runtime_us",
    "rt_period_us": "/proc/sys/kernel/sched_rt_period_us",
}
_CPUS_ONLINE = "/sys/devices/system/cpu/online"
_OSRELEASE = "/proc/sys/kernel/osrelease"


def count_cpu_list(text: str) -> int:
    """Number of CPUs in a kernel CPU list such as ``0-3,6,8-9``."""
    n = 0
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def read_kernel_limits(host: Host) -> KernelLimits:
    """The live SCHED_DEADLINE limits of ``host``."""
    paths = [*_LIMIT_FILES.values(), _CPUS_ONLINE, _OSRELEASE]
    files = read_proc_files(host, paths)
    missing = [p for p in paths if p not in files]
    if missing:
        raise TestbedError(f"{host.name}: cannot read {', '.join(missing)} (is this a Linux host?)")
    values = {k: int(files[p]) for k, p in _LIMIT_FILES.items()}
    return KernelLimits(**values, online_cpus=count_cpu_list(files[_CPUS_ONLINE]),
                        kernel_release=files[_OSRELEASE].strip())


def check_fits(contention: Contention, limits: KernelLimits, n_threads: int) -> None:
    """Raise :class:`ValidationError` if the host can never admit ``contention`` on ``n_threads``.

    Other deadline tasks (and, since Linux 6.12, the fair server's reserve) take bandwidth too, so
    passing this check does not guarantee admission; the kernel's answer is explained when it refuses.
    """
    if contention.unlimited:
        return
    period_us = contention.period_ns / 1000
    if not limits.period_min_us <= period_us <= limits.period_max_us:
        raise ValidationError(
            "contention.cpu_share_pct", contention.cpu_share_pct,
            f"a period (timeslice / share) within this host's sched_deadline_period_min_us.."
            f"sched_deadline_period_max_us = {limits.period_min_us}..{limits.period_max_us} us; "
            f"{contention.timeslice_ms} ms / {contention.cpu_share_pct} % gives {period_us:.0f} us")
    capacity = limits.capacity_cpus
    if capacity is not None and n_threads * contention.bandwidth > capacity + 1e-9:
        raise ValidationError(
            "contention.cpu_share_pct", contention.cpu_share_pct,
            f"at most {100 * capacity / n_threads:.1f} % per thread for {n_threads} thread(s) on "
            f"{limits.online_cpus} CPU(s) with sched_rt_runtime_us = {limits.rt_runtime_us} per "
            f"sched_rt_period_us = {limits.rt_period_us}")
