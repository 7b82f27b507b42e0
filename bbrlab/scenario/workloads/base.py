"""What every workload's parameters give (:class:`WorkloadParams`) and the defaults the workloads share."""

from __future__ import annotations

from typing import ClassVar, Protocol

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
