"""What an rsync run records of its copy (``metadata.transfer``), apart from the workload that measures it
(:mod:`bbrlab.run.transfer`) so the run's metadata (:mod:`bbrlab.run.runmeta`) can hold it typed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferSummary:
    """``metadata.transfer`` of an rsync run (docs/transfer.md), as :func:`bbrlab.run.transfer.summarise` writes it: the file, what
    arrived, how the copy ended and how long it took, its checksums, the progress poller's, the client's exit, its
    SSH connection (``ssh``: kex, cipher, ...; ``socket``: the CCA set and seen, the local port) and versions."""

    file_bytes: int
    file_sha256: str
    file_made: bool
    bytes_delivered: int
    completed: bool
    timed_out: bool
    timeout_s: int | float
    elapsed_s: int | float | None
    completion_s: int | float | None
    goodput_mbit: float | None
    receiver_sha256: str | None
    checksum_match: bool | None
    first_byte_s: int | float | None
    progress_interval_ms: int
    progress_samples: int
    rsync_exit: int | None
    ssh: dict | None
    socket: dict | None
    server_port: int
    versions: dict | None
