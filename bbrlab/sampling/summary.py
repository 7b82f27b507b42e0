"""What a run record keeps about the sampler that ran (``metadata.sampling``, docs/run-record.md), typed.

A :class:`SamplingSummary` holds what every sampler reports (samples, missed ticks, guest CPU per sample, the
achieved interval, how it ended) and what only some do (the netlink sampler's ticks and request times, the BPF
sampler's slots, program run time and ring-buffer drops). :func:`summarize` makes one from a sampler's log;
:func:`data_rows` reads the ss table's rows of the data streams from any sampler's log.

Each kind of sampler has always written its own keys in its own order (:data:`KEYS`): ``to_dict`` writes
exactly those, ``from_dict`` reads them back (and refuses a summary with other keys, such as the records made
before the sampler could be chosen, rather than losing what it does not know).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from bbrlab.core.errors import BbrlabError

from . import sockdiag
from .sampler import parse_sampler_footer, sample_times
from .sockdiag.deploy import Deployed
from .ss import parse_ss_log

#: The keys of ``metadata.sampling`` for each kind of sampler, in the order its records have them.
KEYS: dict[str, tuple[str, ...]] = {
    "ss": ("kind", "binary", "asked_interval_ms", "rows", "samples", "missed_ticks", "cpu_s", "cpu_per_sample_ms",
           "interval", "ended"),
    "netlink": ("kind", "binary", "asked_interval_ms", "rows", "samples", "ticks", "missed_ticks", "cpu_s",
                "cpu_startup_s", "cpu_per_sample_ms", "request_median_ms", "interval", "sockets_discovered", "ended",
                "errors"),
    "bpf": ("kind", "binary", "asked_interval_ms", "rows", "samples", "slots", "missed_ticks", "cpu_s",
            "cpu_startup_s", "bpf_prog_s", "bpf_prog_runs", "cpu_per_sample_ms", "dropped", "interval",
            "request_median_ms", "sockets_discovered", "ended", "errors", "median_records_per_slot"),
}
#: What the run, not the sampler's log, says: the kind that ran, its program, the interval asked, the rows kept.
_FROM_RUN = ("kind", "binary", "asked_interval_ms", "rows")


@dataclass(frozen=True)
class SamplingSummary:
    """The sampler of one run: its ``kind`` (ss, netlink, bpf) and program (``binary``; None for the ss loop),
    the interval asked, the data-stream ``rows`` it gave, and what its log reports. Fields another kind has
    stay None (resp. empty) and are not written (:data:`KEYS`)."""

    kind: str
    binary: Deployed | None
    asked_interval_ms: float
    rows: int
    samples: int | None
    missed_ticks: int | None
    cpu_s: float | None
    cpu_per_sample_ms: float | None
    interval: dict | None  # achieved gaps: median_ms, p99_ms, mean_ms, longest_gap_ms, gaps
    ended: str
    ticks: int | None = None  # netlink
    slots: int | None = None  # bpf
    cpu_startup_s: float | None = None  # netlink, bpf
    bpf_prog_s: float | None = None  # bpf
    bpf_prog_runs: int | None = None  # bpf
    dropped: int | None = None  # bpf
    request_median_ms: float | None = None  # netlink (bpf: always None)
    sockets_discovered: list[int] = field(default_factory=list)  # netlink, bpf
    errors: list = field(default_factory=list)  # netlink, bpf
    median_records_per_slot: float | None = None  # bpf

    def __post_init__(self):
        if self.kind not in KEYS:
            raise ValueError(f"sampler kind {self.kind!r}: expected one of {', '.join(KEYS)}")

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Where nested in a typed record, read and written by :meth:`from_dict` and :meth:`to_dict`
        (:func:`bbrlab.core.recordjson.own_layout`)."""
        from bbrlab.core.recordjson import own_layout

        return own_layout(cls)

    def to_dict(self) -> dict:
        """The record's JSON: the keys of this kind of sampler (:data:`KEYS`), in their order."""
        d = {k: getattr(self, k) for k in KEYS[self.kind]}
        d["binary"] = self.binary.to_dict() if self.binary is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SamplingSummary:
        """A record's ``metadata.sampling``; ValueError when its keys are not those of its kind."""
        kind = d.get("kind")
        if kind not in KEYS:
            raise ValueError(f"metadata.sampling has kind {kind!r}: not a summary of a sampler of {', '.join(KEYS)} "
                             "(records made before the sampler could be chosen have no kind)")
        if set(d) != set(KEYS[kind]):
            raise ValueError(f"metadata.sampling of a {kind} sampler: keys {sorted(set(d) ^ set(KEYS[kind]))} "
                             "differ from what that sampler writes")
        binary = d["binary"]
        return cls(**{**d, "binary": Deployed.from_dict(binary) if binary is not None else None})


def data_rows(kind: str, text: str, ports: Iterable[int]) -> list[dict]:
    """The ss table's rows of a sampler log of ``kind`` (ss, netlink or bpf), the data streams (``ports``) only."""
    if kind == "ss":
        return parse_ss_log(text, ports=ports)
    return sockdiag.rows(text, ports=ports)


def _ss_numbers(text: str) -> dict:
    """What the ss loop's log says about itself: its footer's samples and CPU, and the gaps between samples."""
    footer = parse_sampler_footer(text) or {}
    return {"samples": footer.get("samples"), "missed_ticks": None, "cpu_s": footer.get("cpu_s"),
            "cpu_per_sample_ms": footer.get("cpu_per_sample_ms"),
            "interval": sockdiag.interval_stats([round(t * 1e9) for t in sample_times(text)]),
            "ended": "stop_file" if footer else "killed (no footer)"}


def summarize(kind: str, text: str, *, rows: int, asked_interval_ms: float,
              binary: Deployed | None = None) -> SamplingSummary:
    """The summary a run record keeps of a sampler of ``kind`` from its log ``text``, with the run's ``rows``
    (data-stream rows), the interval it asked for and the program that ran. Raises :class:`BbrlabError`
    when the log is not that kind of sampler's (or cannot be read)."""
    if kind == "ss":
        numbers = _ss_numbers(text)
    elif kind in KEYS:
        numbers = sockdiag.summary(text)
        if numbers["kind"] != kind:
            raise BbrlabError(f"the log is a {numbers['kind']} sampler's, not a {kind} sampler's")
    else:
        raise BbrlabError(f"no sampler of kind {kind!r} (one of {', '.join(KEYS)})")
    return of_numbers(kind, numbers, rows=rows, asked_interval_ms=asked_interval_ms, binary=binary)


def of_numbers(kind: str, numbers: dict, *, rows: int, asked_interval_ms: float,
               binary: Deployed | None = None) -> SamplingSummary:
    """The summary from what a sampler's log says about itself (:func:`sockdiag.summary`'s numbers, or
    :func:`bbrlab.sampling.logscan.scan`'s) and what the run says."""
    own = {k: numbers[k] for k in KEYS[kind] if k not in _FROM_RUN}
    return SamplingSummary(kind=kind, binary=binary, asked_interval_ms=asked_interval_ms, rows=rows, **own)
