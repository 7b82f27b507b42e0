"""What a flow's workload is asked to do: one frozen parameters type per workload, found by its name.

A :class:`~bbrlab.scenario.scenario.Flow` carries one parameters object (``flow.params``) and no fields of the
other workloads. :data:`PARAMS` maps each workload's name to its type; :mod:`bbrlab.run.workloads` runs them,
keyed by the same names. The flow's record keeps the flat form it always had (``duration_s``, ``streams``;
``workload``, ``file_mb``, ``transfer_timeout_s``): :func:`params_of` reads it, and accepts another
workload's field only at the value it is recorded with or defaulted to (:attr:`WorkloadParams.fixed`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Protocol

from bbrlab.core.errors import ValidationError

from .ranges import check_range

DEFAULT_FILE_MB = 160
DEFAULT_TRANSFER_TIMEOUT_S = 1200.0
#: rsync's file lives on the sender's disk (the local guest's root disk is 2 GB).
MAX_FILE_MB = 1024
DEFAULT_DURATION_S = 20.0


class WorkloadParams(Protocol):
    """The parameters of one workload (each a frozen dataclass, validated when made)."""

    #: The workload's name: ``flow.workload`` and the key of :data:`PARAMS`.
    name: ClassVar[str]
    #: The run id's prefix for this workload (empty for the default, so its ids are as before).
    id_prefix: ClassVar[str]
    #: Whether extra flows (:mod:`bbrlab.scenario.competition`) may run beside it.
    competes: ClassVar[bool]
    #: Other workloads' fields the record may hold for this one: ``{field: (the only value, why)}``.
    fixed: ClassVar[dict[str, tuple[object, str]]]

    @property
    def connections(self) -> int:
        """How many data connections it opens (the socket sampler's ports)."""

    @property
    def sampled_span(self) -> tuple[str, float]:
        """The field (``flow.``-named) and the seconds the transfer lasts at most: what sampling is sized by."""

    def record_fields(self) -> dict:
        """Its keys in the flow's record (and run id hash), in the flat form records have always had."""


@dataclass(frozen=True)
class IperfParams:
    """iperf3's bulk transfer of ``duration_s`` (whole seconds) over ``streams`` connections."""

    duration_s: float = DEFAULT_DURATION_S
    streams: int = 1

    name: ClassVar[str] = "iperf3"
    id_prefix: ClassVar[str] = ""
    competes: ClassVar[bool] = True
    fixed: ClassVar[dict] = {
        "file_mb": (DEFAULT_FILE_MB, f"left at {DEFAULT_FILE_MB:g} for iperf3 (it applies to rsync only)"),
        "transfer_timeout_s": (DEFAULT_TRANSFER_TIMEOUT_S,
                               f"left at {DEFAULT_TRANSFER_TIMEOUT_S:g} for iperf3 (it applies to rsync only)"),
    }

    def __post_init__(self):
        check_range("flow.duration_s", self.duration_s, 1, 3600, unit="s")
        if self.duration_s != int(self.duration_s):
            raise ValidationError("flow.duration_s", self.duration_s,
                                  "a whole number of seconds from 1 to 3600 (iperf3 -t counts whole seconds)")
        if not isinstance(self.streams, int) or isinstance(self.streams, bool):
            raise ValidationError("flow.streams", self.streams, "a whole number from 1 to 128")
        check_range("flow.streams", self.streams, 1, 128)

    @property
    def connections(self) -> int:
        """One data connection per stream."""
        return self.streams

    @property
    def sampled_span(self) -> tuple[str, float]:
        """The test's duration."""
        return "flow.duration_s", self.duration_s

    def record_fields(self) -> dict:
        """``duration_s`` and ``streams`` (no ``workload`` key: iperf3 is what a record without one ran)."""
        return {"duration_s": self.duration_s, "streams": self.streams}


@dataclass(frozen=True)
class RsyncParams:
    """rsync over SSH of one incompressible file of ``file_mb`` (10^6 bytes), ended after
    ``transfer_timeout_s`` if it has not finished (:mod:`bbrlab.run.transfer`); one connection."""

    file_mb: float = DEFAULT_FILE_MB
    transfer_timeout_s: float = DEFAULT_TRANSFER_TIMEOUT_S

    name: ClassVar[str] = "rsync"
    id_prefix: ClassVar[str] = "rsync-"
    competes: ClassVar[bool] = False
    fixed: ClassVar[dict] = {
        "streams": (1, "1 for the rsync workload (one SSH connection)"),
        "duration_s": (DEFAULT_DURATION_S, f"left at {DEFAULT_DURATION_S:g} for rsync (a copy lasts until the "
                                           "file is there or transfer_timeout_s has passed)"),
    }

    def __post_init__(self):
        check_range("flow.file_mb", self.file_mb, 0.001, MAX_FILE_MB, unit="MB")
        check_range("flow.transfer_timeout_s", self.transfer_timeout_s, 1, 86_400, unit="s")

    @property
    def connections(self) -> int:
        """The one SSH connection."""
        return 1

    @property
    def sampled_span(self) -> tuple[str, float]:
        """The copy's timeout: it may last that long."""
        return "flow.transfer_timeout_s", self.transfer_timeout_s

    @property
    def file_bytes(self) -> int:
        """The size of the file in bytes (``file_mb`` x 10^6)."""
        return int(round(self.file_mb * 1e6))

    def record_fields(self) -> dict:
        """``streams`` (always 1, as records have it), ``workload``, ``file_mb`` and ``transfer_timeout_s``."""
        return {"streams": 1, "workload": self.name, "file_mb": self.file_mb,
                "transfer_timeout_s": self.transfer_timeout_s}


#: Each workload's parameters type by its name; the first is the default (a record without ``workload``).
PARAMS: dict[str, type] = {p.name: p for p in (IperfParams, RsyncParams)}
DEFAULT_WORKLOAD = next(iter(PARAMS))
#: What a flow can carry: iperf3's bulk transfer, or a file copied with rsync over SSH.
WORKLOADS = tuple(PARAMS)


def params_type(workload: object) -> type:
    """The parameters type of the workload named ``workload``; a :class:`ValidationError` naming
    ``flow.workload`` for any other."""
    if not isinstance(workload, str) or workload not in PARAMS:
        raise ValidationError("flow.workload", workload, f"one of {', '.join(WORKLOADS)}")
    return PARAMS[workload]


def is_params(value: object) -> bool:
    """Whether ``value`` is a parameters object of a registered workload."""
    return PARAMS.get(getattr(value, "name", None)) is type(value)


def params_of(workload: object = DEFAULT_WORKLOAD, **record) -> WorkloadParams:
    """The parameters of ``workload`` from a record's flat fields (:meth:`WorkloadParams.record_fields`'s form),
    each checked; another workload's field is accepted only at its :attr:`~WorkloadParams.fixed` value."""
    cls = params_type(workload)
    own = {f.name for f in fields(cls)}
    unknown = set(record) - own - set(cls.fixed)
    if unknown:
        raise TypeError(f"a flow has no field {sorted(unknown)[0]!r}")
    params = cls(**{k: v for k, v in record.items() if k in own})
    for key, (only, why) in cls.fixed.items():
        value = record.get(key, only)
        if isinstance(value, bool) or value != only:
            raise ValidationError(f"flow.{key}", value, why)
    return params
