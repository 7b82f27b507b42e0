"""How many bytes of a file a receiver holds, sampled on the receiver while a copy runs.

rsync's progress series: the receiver's copy grows as data arrives (rsync writes it in place), so its size
over time is what was delivered, read where it was delivered, at no CPU cost to the contended sender.

The poller is a small bash loop on the receiver host, on the same schedule as the ``ss`` socket sampler
(:mod:`bbrlab.core.hostloop`): a fixed schedule (``t0 + k x interval``, missed ticks skipped), pauses with
``read -t`` rather than ``sleep``, a stop file for a clean end (with one last sample) and a deadline so it
can never outlive a run. Each line is ``<unix time, s> <bytes>``; the file not there yet counts 0 bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hostloop import SCHEDULE_BASH, stop_and_fetch
from bbrlab.core.hosts import Host

POLL_BASH = r"""
set -u
interval_us=$1; stop_after_s=$2; stop_file=$3; path=$4
""" + SCHEDULE_BASH + r"""
sample() {
    local t=$EPOCHREALTIME size=0
    [[ -e $path ]] && size=$(stat -c %s -- "$path")
    printf '%s %s\n' "${t/,/.}" "$size"
}
on_schedule sample
sample
echo "# end"
"""


class ProgressError(BbrlabError):
    """The progress poller's samples could not be fetched."""


@dataclass
class Poller:
    """A poller running on ``host``; ``text`` is its log, set when the ``with`` block ends normally."""

    host: Host
    pid: int
    directory: str
    path: str
    interval_ms: float
    text: str | None = field(default=None, repr=False)

    @property
    def log_path(self) -> str:
        """Where the poller writes its samples on ``host`` (``<directory>/progress.log``)."""
        return f"{self.directory}/progress.log"

    @property
    def stop_path(self) -> str:
        """The file whose creation tells the poller to stop (``<directory>/stop``)."""
        return f"{self.directory}/stop"


def poll_argv(path: str, interval_ms: float, stop_after_s: float, stop_file: str) -> list[str]:
    """The poller's command (an argument list)."""
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int | float) or not 10 <= interval_ms <= 60_000:
        raise ValidationError("interval_ms", interval_ms, "10 <= interval_ms <= 60000 ms")
    if not 1 <= stop_after_s <= 86_400 * 2:
        raise ValidationError("stop_after_s", stop_after_s, "1 <= stop_after_s <= 172800 s")
    for name, value in (("path", path), ("stop_file", stop_file)):
        if not value.startswith("/") or "\n" in value:
            raise ValidationError(name, value, "an absolute path without newlines")
    return ["bash", "-c", POLL_BASH, "bbrlab-progress", str(int(round(interval_ms * 1000))),
            str(int(stop_after_s)), stop_file, path]


@contextmanager
def poller(host: Host, path: str, interval_ms: float, stop_after_s: float) -> Iterator[Poller]:
    """Sample the size of ``path`` on ``host`` every ``interval_ms`` during the ``with`` block.

    Its log lives in a private directory on ``host``. When the block ends normally the poller takes one
    last sample, its log is fetched into :attr:`Poller.text`; when the block fails it is stopped without
    fetching. Either way the directory is removed.
    """
    poll_argv(path, interval_ms, stop_after_s, "/nonexistent")  # everything checked before anything starts
    with host.private_dir("progress") as directory:
        handle = Poller(host, 0, directory, path, interval_ms)
        spawned = host.spawn_process(poll_argv(path, interval_ms, stop_after_s, handle.stop_path), handle.log_path)
        handle.pid = spawned.pid
        ended_normally = False
        try:
            yield handle
            ended_normally = True
        finally:
            res = stop_and_fetch(host, handle.stop_path, handle.pid, handle.log_path, fetch=ended_normally,
                                 start_ticks=spawned.start_ticks)
            if ended_normally:
                if not res.ok:
                    raise ProgressError(f"could not fetch the progress samples from {host.name}: "
                                        f"{res.stderr.strip()[:300]}")
                handle.text = res.stdout


_LINE = re.compile(r"^([0-9]+(?:\.[0-9]+)?) ([0-9]+)$")


def parse(text: str) -> list[tuple[float, int]]:
    """``(unix time in s, bytes)`` per sample of a poller's log, in order (``#`` lines skipped)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            out.append((float(m.group(1)), int(m.group(2))))
    return out


def series(samples: list[tuple[float, int]]) -> list[list[float]]:
    """``[t_s, bytes]`` pairs with ``t_s`` counted from the first sample (the poller starts before the copy)."""
    if not samples:
        return []
    t0 = samples[0][0]
    return [[round(t - t0, 6), n] for t, n in samples]


def first_byte_s(samples: list[tuple[float, int]]) -> float | None:
    """Seconds from the first sample to the first one that saw any bytes (None: nothing arrived)."""
    for t, n in samples:
        if n > 0:
            return round(t - samples[0][0], 6)
    return None
