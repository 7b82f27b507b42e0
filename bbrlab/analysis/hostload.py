"""How busy the host was while a data folder's runs transferred, from their records alone.

Records made since the host guard (:mod:`bbrlab.campaign.hostguard`) carry the CPU used outside the testbed
(``metadata.host_other.other_busy_pct``); older ones carry only how busy the host that ran the sender's QEMU
was, the testbed included (``metadata.cpu_load.sender_hypervisor.busy_pct``), which bounds the other work
from above. :func:`summarise` takes, for each folder, the better of the two that every ok run has, and gives
its median and range; ``bbrlab hostload DIR...`` prints it. data/README.md states each folder's value so.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from bbrlab.run.runmeta import RunMetadata
from bbrlab.run.runrecord import metadata_of


def _other_busy_pct(meta: RunMetadata) -> float | None:
    return meta.host_other.other_busy_pct if meta.host_other else None


def _host_busy_pct(meta: RunMetadata) -> float | None:
    return meta.cpu_load.sender_hypervisor.busy_pct if meta.cpu_load else None


#: The measures, best first: (name, its value in a record's typed metadata, what it means).
MEASURES = (
    ("host_other_busy_pct", _other_busy_pct, "CPU outside the testbed"),
    ("host_busy_pct", _host_busy_pct, "host CPU, the testbed included"),
)


@dataclass(frozen=True)
class HostLoad:
    """One folder's host load over its ok runs: the ``measure`` (a name of :data:`MEASURES`), how many runs
    had it (``runs``) of all the ok runs (``ok_runs``), and its median, lowest and highest value [% of all the
    host's CPUs]; the values are None when no run had either measure."""

    folder: str
    measure: str | None
    meaning: str | None
    runs: int
    ok_runs: int
    median_pct: float | None
    min_pct: float | None
    max_pct: float | None

    def line(self) -> str:
        """One line: ``demo: host CPU, the testbed included: median 5.1 %, 3.0-9.2 % (96 of 96 ok runs)``."""
        if self.measure is None:
            return f"{self.folder}: no host load recorded ({self.ok_runs} ok runs)"
        return (f"{self.folder}: {self.meaning} ({self.measure}): median {self.median_pct:.1f} %, "
                f"{self.min_pct:.1f}-{self.max_pct:.1f} % ({self.runs} of {self.ok_runs} ok runs)")


def ok_records(campaign: Path) -> list[dict]:
    """The ``record.json`` of every ok run of the campaign folder ``campaign`` (its ``runs/``)."""
    found = []
    for path in sorted(Path(campaign).glob("runs/*/record.json")):
        record = json.loads(path.read_text())
        if record.get("status") == "ok":
            found.append(record)
    return found


def summarise(folder: str | Path, name: str | None = None) -> HostLoad:
    """The host load of the campaign folder ``folder``'s ok runs: the first of :data:`MEASURES` that at least
    half of them carry (the runs without it are counted, not guessed)."""
    records = ok_records(Path(folder))
    name = name or Path(folder).name
    metas = [metadata_of(r, drop_unreadable=True) for r in records]
    for measure, value_of, meaning in MEASURES:
        values = [float(v) for v in map(value_of, metas) if v is not None]
        if values and 2 * len(values) >= len(records):
            return HostLoad(name, measure, meaning, len(values), len(records),
                            round(statistics.median(values), 2), round(min(values), 2), round(max(values), 2))
    return HostLoad(name, None, None, 0, len(records), None, None, None)


def summarise_folders(root: str | Path) -> list[HostLoad]:
    """:func:`summarise` of every campaign folder (a folder with ``runs/``) at or under ``root``, each named
    by its path below ``root``'s parent (``demo``, ``demo/calibration/<testbed>``)."""
    root = Path(root)
    campaigns = sorted(p.parent for p in root.rglob("runs") if p.is_dir() and (p.parent / "runs") == p)
    return [summarise(c, str(c.relative_to(root.parent))) for c in campaigns]
