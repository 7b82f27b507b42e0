"""``metadata.recovered`` of a process's first run: what a killed predecessor left on the testbed and the
recovery cleared (:func:`bbrlab.run.recovery.recover`, :func:`bbrlab.run.transfer.recover`), as typed records.

Its own module, apart from the recovery, because the run's metadata (:mod:`bbrlab.run.runmeta`) names these
types while the recovery's rsync part (:mod:`bbrlab.run.transfer`) needs the metadata: neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core import recordjson


@dataclass(frozen=True)
class IperfKilled:
    """``recovered.iperf3_killed``: the pids of bbrlab's own iperf3 processes killed on the ``sender`` (a client
    on the iperf3 port) and on the ``receiver`` (servers on that port and the extra flows' ports after it)."""

    sender: list[int]
    receiver: list[int]


@dataclass(frozen=True)
class PrivateDirsRemoved:
    """``recovered.private_dirs_removed``: per role, the private run directories whose owner process is gone,
    removed (:func:`bbrlab.core.leftdirs.sweep`), in the order of :data:`bbrlab.run.recovery.RUN_DIRS`."""

    receiver: list[str]
    sender: list[str]
    emulator: list[str]
    hypervisor: list[str]


@dataclass(frozen=True)
class RunDirsRemoved:
    """``recovered.run_dirs_removed``: the rsync run's private directories removed on the ``receiver`` (keys,
    the data received) and on the ``sender`` (the client's files)."""

    receiver: list[str]
    sender: list[str]


@dataclass(frozen=True)
class TransferLeftovers:
    """What an rsync run killed with its process left and :func:`bbrlab.run.transfer.recover` cleared: the
    receiver's sshd processes, the sender's ssh clients (pids) and the run directories."""

    sshd_killed: list[int]
    ssh_clients_killed: list[int]
    run_dirs_removed: RunDirsRemoved


@dataclass(frozen=True, kw_only=True)
class Recovered:
    """``metadata.recovered``: what the recovery before a process's first run found and cleared (see
    docs/run-record.md), in the order records hold its keys. The keys added over time (the vCPU trace's
    instances, the private directories, the cgroups and busy loops of the ledger, the CPU partitions, the rsync
    run's directories) are missing from older records: None here, left out of the JSON."""

    trace_instances_removed: list[str] | None = recordjson.left_out_when_none()
    private_dirs_removed: PrivateDirsRemoved | None = recordjson.left_out_when_none()
    deadline_cleared_tids: list[int]
    cfs_cgroups_removed: list[str] | None = recordjson.left_out_when_none()
    load_loops_killed: list[int] | None = recordjson.left_out_when_none()
    ledger_refused: list[str] | None = recordjson.left_out_when_none()
    partitions_removed: list[str] | None = recordjson.left_out_when_none()
    iperf3_killed: IperfKilled
    samplers_stopped: int
    sshd_killed: list[int]
    ssh_clients_killed: list[int]
    run_dirs_removed: RunDirsRemoved | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Its fields, the keys older records lack left out while None
        (:func:`bbrlab.core.recordjson.record_layout`)."""
        return recordjson.record_layout(source, handler)
