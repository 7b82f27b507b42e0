"""The emulator's bottleneck queue during a run: its qdiscs' backlog, drops and bytes sent, every few ms.

The sampler is ``qdisc_sampler`` (``bbrlab/sampling/native/qdisc_sampler.c``): a static C program that asks the
emulator's kernel for the data port's qdiscs over one NETLINK_ROUTE socket (an ``RTM_GETQDISC`` dump per
sample: no ``tc`` fork, which in a TCG guest would cost more than the interval) and prints one ``Q`` line per
qdisc per sample, stamped with the emulator's CLOCK_REALTIME. It is built and copied like the sender's socket
samplers (:mod:`bbrlab.sampling.sockdiag`), and runs like them (:func:`bbrlab.sampling.sampler.sampler`): as the
command of an SSH channel whose output lands in the run directory here (``bottleneck.log``), stopped by a stop
file, with its own CPU cost, samples and missed ticks in its ``# end`` line.

:func:`parse_log` gives the rows (one per qdisc per sample), :func:`summary` the sampler's cost. Which qdisc is the
bottleneck (tbf in bbrlab's tree, netem under the authors' tbf) is :func:`bbrlab.link.bottleneck.queue_mode_of`'s
to say; the rows keep every qdisc of the port with its kind and handle.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import Host

from . import sockdiag
from .sampler import _STREAMED, Sampler, _stop, _wait_ready

#: The run directory's file for the bottleneck sampler's log.
LOG_FILE = "bottleneck.log"
#: The columns of a ``Q`` line after the ``Q``, in order.
COLUMNS = ("t_ns", "handle", "parent", "kind", "bytes", "packets", "drops", "overlimits", "requeues", "backlog_bytes",
           "qlen_packets")
_FOOTER = re.compile(r"^# end samples=(\d+) ticks=(\d+) missed=(\d+) cpu_user_us=(\d+) cpu_sys_us=(\d+) "
                     r"maxrss_kb=\d+ wall_ns=(\d+) reason=(\S+)\s*$", re.M)


@dataclass(frozen=True)
class QdiscSample:
    """One qdisc of the data port at one instant. ``t_ns``: the emulator's CLOCK_REALTIME (Unix nanoseconds);
    ``handle``/``parent`` as tc prints them (``1:``, ``root``); counters cumulative since the qdisc was made."""

    t_ns: int
    handle: str
    parent: str
    kind: str
    bytes: int
    packets: int
    drops: int
    overlimits: int
    requeues: int
    backlog_bytes: int
    qlen_packets: int

    @property
    def t_s(self) -> float:
        """``t_ns`` in Unix seconds (a double: to about 0.2 us at today's dates)."""
        seconds, ns = divmod(self.t_ns, 1_000_000_000)
        return seconds + ns / 1e9

    def to_dict(self) -> dict:
        """Every field by name (before alignment)."""
        return asdict(self)


def _tc_handle(word: str) -> str:
    value = int(word, 16)
    if value == 0xFFFFFFFF:
        return "root"
    return f"{value >> 16:x}:{value & 0xFFFF:x}" if value & 0xFFFF else f"{value >> 16:x}:"


def parse_log(text: str) -> list[QdiscSample]:
    """The ``Q`` lines of a bottleneck log as rows; ValueError naming the line for one that is malformed."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("Q "):
            continue
        words = line.split()
        if len(words) != len(COLUMNS) + 1:
            raise ValueError(f"bottleneck log line {number}: {len(words) - 1} fields, not {len(COLUMNS)}: {line!r}")
        try:
            counts = [int(w) for w in words[5:]]
            rows.append(QdiscSample(int(words[1]), _tc_handle(words[2]), _tc_handle(words[3]), words[4],
                                    *counts))
        except ValueError as e:
            raise ValueError(f"bottleneck log line {number}: {e}: {line!r}") from None
    return rows


@dataclass(frozen=True)
class BottleneckSummary:
    """``metadata.bottleneck`` of a run record: the queue sampler's asked ``interval_ms``, its ``samples``,
    ``ticks`` and ``missed`` ticks, its CPU (``cpu_s``; ``cpu_per_sample_us``, ``samples_per_s`` and
    ``cpu_share`` of its life, None without samples or a wall time), why it stopped (``reason``), the qdiscs it
    sampled (``qdiscs``: ``"kind handle"``) and the program that ran (``binary``), written field for field."""

    interval_ms: int | float
    samples: int
    ticks: int
    missed: int
    cpu_s: float
    cpu_per_sample_us: float | None
    samples_per_s: float | None
    cpu_share: float | None
    reason: str
    qdiscs: list[str] = field(default_factory=list)
    binary: sockdiag.Deployed | None = None


def summary(text: str, interval_ms: float) -> BottleneckSummary | None:
    """The sampler's ``# end`` line as the run record's ``metadata.bottleneck``: samples, missed ticks, its CPU
    (s, and us per sample), samples per second of its life, why it stopped; None without that line. The
    qdiscs and the binary are the run's to add (:func:`bbrlab.run.checks.bottleneck_samples`)."""
    m = _FOOTER.search(text)
    if not m:
        return None
    samples, ticks, missed, user_us, sys_us, wall_ns = (int(m.group(i)) for i in range(1, 7))
    cpu_s = (user_us + sys_us) / 1e6
    return BottleneckSummary(
        interval_ms=interval_ms, samples=samples, ticks=ticks, missed=missed, cpu_s=round(cpu_s, 6),
        cpu_per_sample_us=round(cpu_s * 1e6 / samples, 1) if samples else None,
        samples_per_s=round(samples / (wall_ns / 1e9), 2) if wall_ns else None,
        cpu_share=round(cpu_s / (wall_ns / 1e9), 5) if wall_ns else None, reason=m.group(7))


def sampler_argv(path: str, interval_ms: float, stop_after_s: float, stop_file: str, ifname: str) -> list[str]:
    """The command that runs the bottleneck sampler on the emulator (checked: each value names its field)."""
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int | float) or not 1 <= interval_ms <= 1000:
        raise ValidationError("bottleneck_ms", interval_ms, "1 <= bottleneck_ms <= 1000 ms")
    if not 1 <= stop_after_s <= 86_400:
        raise ValidationError("stop_after_s", stop_after_s, "1 <= stop_after_s <= 86400 s")
    if not stop_file.startswith("/") or "\n" in stop_file:
        raise ValidationError("stop_file", stop_file, "an absolute path without newlines")
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", ifname):
        raise ValidationError("ifname", ifname, "an interface name of 1 to 15 letters, digits or _.:@-")
    return [path, "-i", str(int(round(interval_ms * 1000))), "-t", str(int(stop_after_s)), "-s", stop_file,
            "-n", ifname]


@contextmanager
def queue_sampler(host: Host, ifname: str, interval_ms: float, stop_after_s: float, *,
                  log_file: str | Path) -> Iterator[Sampler]:
    """Sample the qdiscs of ``ifname`` on ``host`` every ``interval_ms`` during the ``with`` block, the log
    streamed into ``log_file`` here; the block starts once the sampler is ready (its socket open). At the end
    it is stopped and its log drained (``Sampler.text``), as :func:`bbrlab.sampling.sampler.sampler` does."""
    sampler_argv("/validated", interval_ms, stop_after_s, "/nonexistent", ifname)
    deployed = sockdiag.ensure_on_host(host, kind="qdisc")
    with host.private_dir("sampler") as directory:
        handle = Sampler("qdisc", host, directory, interval_ms, Path(log_file), binary=deployed)
        argv = sampler_argv(deployed.path, interval_ms, stop_after_s, handle.stop_path, ifname)
        stream = host.stream(["sh", "-c", _STREAMED, "bbrlab-qdisc-sampler", handle.pid_path, *argv],
                             handle.log_file)
        ended_normally = False
        try:
            _wait_ready(handle, stream)
            yield handle
            ended_normally = True
        finally:
            _stop(handle, stream, drain=ended_normally)


def bottleneck_handle(rows: list[QdiscSample]) -> str | None:
    """The handle of the qdisc that holds the bottleneck queue, from the tree the samples show (as
    :func:`bbrlab.link.bottleneck.queue_mode_of` reads a read-back): netem below a root tbf (the authors' tree),
    else the tbf (bbrlab's tree, or a tbf alone); None without a tbf."""
    first_t = rows[0].t_ns if rows else None
    tree = {r.handle: r for r in rows if r.t_ns == first_t}
    tbf = next((r for r in tree.values() if r.kind == "tbf"), None)
    if tbf is None:
        return None
    netem = next((r for r in tree.values() if r.kind == "netem"), None)
    if tbf.parent == "root" and netem is not None and netem.parent != "root":
        return netem.handle
    return tbf.handle
