"""The iperf3 workload's parameters: a bulk transfer of ``duration_s`` over ``streams`` connections (run by
:mod:`bbrlab.run.iperf_workload`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bbrlab.core.errors import ValidationError

from ..ranges import check_range
from .base import DEFAULT_DURATION_S, DEFAULT_FILE_MB, DEFAULT_TRANSFER_TIMEOUT_S


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
