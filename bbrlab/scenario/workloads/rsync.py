"""The rsync workload's parameters: A file of ``file_mb`` copied with rsync over one SSH connection, ended after ``transfer_timeout_s`` (run by
:mod:`bbrlab.run.transfer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ranges import check_range
from .base import DEFAULT_DURATION_S, DEFAULT_FILE_MB, DEFAULT_TRANSFER_TIMEOUT_S, MAX_FILE_MB


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
