"""The ``metadata`` of one run record (docs/run-record.md), as a typed object filled by the run recipe.

Each field is one thing measured while the run happened; the parts other steps measure are their own typed
records: the contention (:class:`~bbrlab.contention.evidence.ContentionRecord`), the link's counters
(:class:`~bbrlab.link.counters.LinkRecord`), the sampler (:class:`~bbrlab.sampling.summary.SamplingSummary`),
the vCPU trace (:class:`~bbrlab.sampling.vcputrace.TraceSummary`) and its alignment with the samples
(:class:`~bbrlab.sampling.alignment.AlignmentCheck`), the rsync copy (:class:`~bbrlab.run.transferrecord.TransferSummary`),
the hosts' CPU (:class:`~bbrlab.contention.hostcpu.CpuLoad`, :class:`~bbrlab.contention.outside.OutsideLoad`), the
sender's CPUs that carried the network work (:class:`~bbrlab.run.softirqs.SoftirqRecord`), the
timing environment (:class:`~bbrlab.testbed.timingenv.TimingEnvironment`), the
sender's kernel and root qdisc, its sysctls, offloads and tools (:mod:`bbrlab.run.sender`), the module parameters
and sysctls the run set (:class:`~bbrlab.run.senderknobs.SenderKnobs`), the CCA's module
(:class:`~bbrlab.kernel.ModuleIdentity`), the flows (:mod:`bbrlab.run.flowrecord`) and iperf3's summary
(:class:`~bbrlab.run.iperf.IperfSummary`), what the recovery of a killed predecessor cleared
(:class:`~bbrlab.run.recoveryrecord.Recovered`) and what the campaign added after the run
(:class:`~bbrlab.run.campaignadded.CampaignAdded`). The rest stay JSON objects as written.
:meth:`RunMetadata.to_dict` gives the JSON written into ``record.json``; fields never measured (``sampling``
of an unsampled run) are left out. :meth:`RunMetadata.from_dict` reads that JSON back. Both go through
:mod:`bbrlab.core.recordjson` (pydantic's TypeAdapter), which writes and checks every field and part.

If a run fails, what was measured up to the failure still goes into its failed record: inside
:meth:`RunMetadata.carried_by_errors` an error becomes a :class:`FailedRun` raised from it, which carries
the metadata as a field; the campaign builds the one failed record from :func:`failure_reason` (the original
error's type, message and place) and :func:`of_error` (the metadata).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

from bbrlab.contention.deadline import DeadlineCleared
from bbrlab.contention.evidence import ContentionRecord
from bbrlab.contention.hostcpu import CpuLoad
from bbrlab.contention.outside import OutsideLoad
from bbrlab.contention.placement import QemuCpus
from bbrlab.core import recordjson
from bbrlab.core.errors import BbrlabError, NotARunFailure
from bbrlab.kernel import ModuleIdentity
from bbrlab.kernel.sender import KernelOrigin, SenderKernel
from bbrlab.link.counters import LinkRecord
from bbrlab.link.emulator import Readback
from bbrlab.sampling.alignment import AlignmentCheck
from bbrlab.sampling.bottleneck import BottleneckSummary
from bbrlab.sampling.summary import SamplingSummary
from bbrlab.sampling.vcputrace import TraceSummary
from bbrlab.testbed.record import TestbedRecord
from bbrlab.testbed.timingenv import TimingEnvironment

from .blockboot import BlockPlace
from .campaignadded import CampaignAdded
from .clocks import RunClocks
from .flowrecord import FlowOutcome, FlowRecord
from .iperf import IperfSummary
from .recoveryrecord import Recovered
from .sender import SenderOffloads, SenderSysctls, ToolVersions
from .senderknobs import SenderKnobs
from .senderqdisc import SenderQdisc
from .softirqs import SoftirqRecord
from .transferrecord import TransferSummary


@dataclass
class CcaUse:
    """The congestion control asked for, offered by the sender, and seen carrying the data."""

    requested: str
    available: list[str] = field(default_factory=list)
    iperf_sender: str | None = None  # iperf3's sender_tcp_congestion
    socket: str | None = None  # rsync: TCP_CONGESTION read back from the SSH connection's own socket
    ss_seen: list[str] | None = None  # what the sampler saw on the data streams (sampled runs)
    bbr_version: int | None = None  # 1, 2 or 3 for BBR; None otherwise
    patched: bool = False


@dataclass(frozen=True)
class CeilingPointer:
    """``metadata.ceiling``: the sender's CPU ceiling at the run's point (``value_mbit``), the calibration it came
    from (``source``, ``calibrated_at``, ``file_sha256``), the point's ``key``, what bounded it (``limit``) and the
    streams it was measured with (:meth:`bbrlab.run.ceiling.Calibration.pointer`). A run writes every field; a
    pointer that names fewer (the value, its source and key) reads with the others None."""

    value_mbit: float
    source: str | None
    key: str
    limit: str | None = None
    streams: int | None = None
    calibrated_at: str | None = None
    file_sha256: str | None = None


#: Keys the campaign adds to a run's metadata after the run (:class:`~bbrlab.run.campaignadded.CampaignAdded`);
#: :meth:`RunMetadata.from_dict` reads them into ``added``.
CAMPAIGN_KEYS = tuple(f.name for f in fields(CampaignAdded))
#: Fields written even when None (``module: null``: the kernel's own CCA; ``cca``: always asked).
_KEPT_WHEN_NONE = ("module", "cca")
#: Fields written as an empty object while not measured (a run that failed before), as records always had them.
_EMPTY_WHEN_NONE = ("versions", "sysctls", "offloads", "flow")


@dataclass
class RunMetadata:
    """Everything a run record says about how the run went. See docs/run-record.md for each field."""

    testbed: TestbedRecord = field(default_factory=TestbedRecord)  # the testbed as described (bbrlab.testbed.record)
    versions: ToolVersions | None = None  # bbrlab's, the hypervisor's and the sender's tools' (bbrlab.run.sender)
    cca: CcaUse | None = None
    sysctls: SenderSysctls | None = None  # the sender's sysctls that matter, read back (bbrlab.run.sender)
    module: ModuleIdentity | None = None  # the CCA's module: srcversion, hashes, parameters (bbrlab.kernel)
    offloads: SenderOffloads | None = None  # ethtool -k of the sender's experiment interface (bbrlab.run.sender)
    flow: FlowRecord | None = None  # flow 0's ports, server and receiving account (bbrlab.run.flowrecord)
    contention: ContentionRecord | None = None
    qdiscs: Readback | None = None  # the emulator's qdiscs read back after the run, verbatim
    sender_qdisc: SenderQdisc | None = None  # the sender's root qdisc asked and read back
    knobs: SenderKnobs | None = None  # the CCA's module parameters and sysctls the run set, asked and read back
    link: LinkRecord | None = None  # per-run qdisc counters, the queue held and the loss netem applied
    iperf: IperfSummary | None = None  # iperf3's summary of flow 0 (bbrlab.run.iperf)
    flows: list[FlowOutcome] | None = None  # the flows beside flow 0: each one's origin, CCA, measured start, file (bbrlab.run.flows)
    transfer: TransferSummary | None = None  # rsync: bytes, completion, goodput, timed out, checksums, SSH cipher
    sampling: SamplingSummary | None = None
    vcpu_trace: TraceSummary | None = None  # the host trace of the vCPU threads' on/off-CPU intervals
    alignment: AlignmentCheck | None = None  # guest samples inside on-CPU intervals once aligned
    cpu_load: CpuLoad | None = None  # emulator's and sender hypervisor's CPU during the transfer
    host_other: OutsideLoad | None = None  # this machine's CPU outside the testbed's processes then
    kernel: SenderKernel | KernelOrigin | None = None  # the sender kernel: release, origin, package or path, sha256
    ceiling: CeilingPointer | None = None  # the sender's CPU ceiling at this point, from a calibration (bbrlab.run.ceiling)
    recovered: Recovered | None = None  # first run of a process: what a killed predecessor left (bbrlab.run.recoveryrecord)
    qemu_cpus: QemuCpus | None = None  # each QEMU thread's allowed CPUs and cpuset at run time (bbrlab.contention.placement)
    clocks: RunClocks | None = None  # sender's and emulator's clock offsets at start and end, drift (bbrlab.run.clocks)
    timing_env: TimingEnvironment | None = None  # guest clocksource, HZ, tick; host CPU, governor, SMT; QEMU's timers (bbrlab.testbed.timingenv)
    block: BlockPlace | None = None  # blocks: K campaigns: the run's block and whether it booted afresh
    bottleneck: BottleneckSummary | None = None  # the emulator's queue sampler: interval, samples, missed, CPU (bbrlab.sampling.bottleneck)
    softirqs: SoftirqRecord | None = None  # per sender CPU: NET_RX/NET_TX softirqs, NIC interrupts, process ticks (bbrlab.run.softirqs)
    timing: dict[str, float | bool] = field(default_factory=dict)
    #: What clearing the deadline policy did after the run failed (written as ``contention.after_failure``).
    deadline_after_failure: DeadlineCleared | None = None
    #: What the campaign added after the run (:data:`CAMPAIGN_KEYS`), written as keys of their own at the end.
    added: CampaignAdded = field(default_factory=CampaignAdded)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Record the seconds the ``with`` block took as ``timing[phase + "_s"]`` (also when it fails)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.timing[f"{phase}_s"] = round(time.monotonic() - t0, 3)

    @contextmanager
    def carried_by_errors(self) -> Iterator[None]:
        """An error leaving the block leaves as a :class:`FailedRun` carrying this metadata, raised ``from`` it.

        Interruptions (:class:`bbrlab.core.signals.Interrupted`, KeyboardInterrupt, SystemExit: none is an
        ``Exception``) and errors that are not the run's failure (:class:`~bbrlab.core.errors.NotARunFailure`)
        leave as themselves. ``timing["run_wall_s"]`` is the block's wall time, however it ends."""
        t0 = time.monotonic()
        try:
            yield
        except Exception as e:
            if isinstance(e, (FailedRun, NotARunFailure)):
                raise
            raise FailedRun(e, self) from e
        finally:
            self.timing["run_wall_s"] = round(time.monotonic() - t0, 3)

    def to_dict(self) -> dict:
        """The JSON of ``record.json``'s ``metadata`` (:func:`bbrlab.core.recordjson.to_json`)."""
        return recordjson.to_json(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunMetadata:
        """A record's ``metadata`` (schema ``bbrlab.run/2``), typed (:func:`bbrlab.core.recordjson.from_json`):
        ValueError for a key it does not know or a value that does not fit its field (named)."""
        return recordjson.from_json(cls, d)

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The fields in their order, each typed part as its own JSON, with the record's layout around them:
        fields never measured left out, ``deadline_after_failure`` as ``contention.after_failure``, what the
        campaign added (``added``) as keys of its own at the end."""
        return recordjson.record_layout(source, handler, read=_metadata_fields, write=_metadata_json)


def _metadata_json(out: dict) -> dict:
    after_failure, added = out.pop("deadline_after_failure"), out.pop("added")
    if after_failure is not None:
        out["contention"] = {**(out["contention"] or {}), "after_failure": after_failure}
    out |= {k: {} for k in _EMPTY_WHEN_NONE if out[k] is None}
    return {k: v for k, v in out.items() if v is not None or k in _KEPT_WHEN_NONE} | added


def _metadata_fields(d: dict) -> dict:
    names = {f.name for f in fields(RunMetadata)} - {"deadline_after_failure", "added"}
    unknown = sorted(set(d) - names - set(CAMPAIGN_KEYS))
    if unknown:
        raise ValueError(f"metadata keys {unknown} are not those of a bbrlab.run/2 record")
    values = {k: v for k, v in d.items() if k in names and not (k in _EMPTY_WHEN_NONE and v == {})}
    contention = values.get("contention")
    if contention is not None:
        values["contention"] = {k: v for k, v in contention.items() if k != "after_failure"} or None
        values["deadline_after_failure"] = contention.get("after_failure")
    values["added"] = {k: d[k] for k in d if k in CAMPAIGN_KEYS}
    return values


class FailedRun(BbrlabError):
    """A run failed: raised ``from`` the error that ended it (``error``), carrying what the run measured until
    then (``metadata``). Its message is the error's ``Type: message``; the record's reason is the error's own,
    with where it was raised (:func:`failure_reason`)."""

    def __init__(self, error: Exception, metadata: RunMetadata):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error, self.metadata = error, metadata

    def __reduce__(self):
        """Pickled with the error and the metadata (the error's traceback stays behind, as for any exception)."""
        return type(self), (self.error, self.metadata)


def of_error(error: BaseException) -> dict:
    """The metadata a failed run's exception carries (a :class:`FailedRun`'s), as the record's JSON; empty when
    it carries none (an error raised outside a run's :meth:`~RunMetadata.carried_by_errors`)."""
    return error.metadata.to_dict() if isinstance(error, FailedRun) else {}


def original_error(error: BaseException) -> BaseException:
    """The error that ended a run: a :class:`FailedRun`'s ``error``, any other exception itself."""
    return error.error if isinstance(error, FailedRun) else error


def failure_reason(error: BaseException) -> str:
    """A failed record's reason: ``Type: message (at file:line in function)`` of the error that ended the run
    (:func:`original_error`), with where it was raised, since some errors (a bare EOFError from an SSH channel)
    carry no message of their own."""
    error = original_error(error)
    text = f"{type(error).__name__}: {error}"
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text
