"""The tidy tables (runs, intervals, ss, vcpu, bottleneck, streams, flows), their columns, units and dtypes.

Every reader (bbrlab's run directories, the paper authors' layout) produces rows as plain dicts or
tuples; :func:`build_tables` turns them into DataFrames in one go and :func:`normalise` gives each
column the dtype its :class:`Column` declares, so parquet round-trips and concatenation behave. A column
a reader does not fill is missing (``<NA>``/NaN), never guessed.

Adding a column to ``runs`` is one line in :data:`RUN_SCHEMA`: its name, dtype, unit, meaning and how it
is read from a bbrlab run record (readers of other layouts fill the keys they know).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from bbrlab.calibration.check import above_ceiling
from bbrlab.contention.evidence import ContentionEvidence
from bbrlab.link.counters import QueueHeld, QueueInForce
from bbrlab.run.runmeta import RunMetadata
from bbrlab.sampling.alignment import AlignmentCheck
from bbrlab.scenario import knobs
from bbrlab.scenario.competition import ExtraFlow
from bbrlab.scenario.cpumodels import MODELS
from bbrlab.scenario.cpumodels import none as no_contention
from bbrlab.scenario.linksizing import AUTHORS_NETEM_LIMIT_PACKETS, LIMIT_IN_FORCE
from bbrlab.scenario.scenario import Flow, Link

from . import evidence
from .columns import (
    BOTTLENECK_SCHEMA,
    FLOW_SCHEMA,
    MACHINE_SCHEMA,
    STREAM_SCHEMA,
    TIMING_SCHEMA,
    VCPU_SCHEMA,
    Column,
    dimension_columns,
)
from .frames import frame_of_parts, normalise_frame, untyped
from .runkey import RUN_KEY

#: ``contention_mode`` of a run without contention (model none, or any model at 100 %).
NO_CONTENTION = no_contention.MODEL.name


def _sets_timeslice(model: str) -> bool:
    """Whether a model's recorded ``timeslice_ms`` means something: deadline's runtime, a cgroup model's quota
    (the others record an unused one)."""
    kind = MODELS.get(model)
    return kind is None or kind.uses_timeslice or kind.uses_cgroup


def _share(v) -> float | None:
    return v.cont.cpu_share_pct


def achieved_share(meta: RunMetadata) -> float | None:
    """The share of a CPU the sender's vCPU threads really got over the transfer [%] (``/proc/<tid>/schedstat``
    run time / wall time, mean over the threads): ``contention.evidence.achieved`` where recorded, else the mean
    of the threads' ``cpu_share_pct`` (records made before it; the same numbers); None without evidence."""
    evidence = meta.contention.evidence if meta.contention is not None else None
    if not isinstance(evidence, ContentionEvidence):  # none, or why it is missing
        return None
    if evidence.achieved is not None:
        return evidence.achieved.achieved_share_pct
    shares = [t.usage.cpu_share_pct for t in evidence.threads if t.usage is not None and t.usage.same_thread]
    return round(sum(shares) / len(shares), 2) if shares else None


def sender_vcpus(v) -> int | None:
    """The vCPUs the run's sender had: its CPUs online as read in the guest during the run
    (``metadata.softirqs.cpus``), else the count the testbed recorded starting it (``metadata.testbed.sender_vcpus``:
    records made before the read-back); None where neither is recorded."""
    if v.meta.softirqs is not None:
        return v.meta.softirqs.cpus
    return v.testbed.sender_vcpus


def _contended_threads(meta: RunMetadata) -> int | None:
    """How many vCPU threads the contention model was given (every thread it held, ``metadata.contention.previous``)."""
    return len(meta.contention.previous) if meta.contention is not None else None


def _top(v, which: str, part: int):
    """The CPU (``part`` 0) or its share (1) of ``metadata.softirqs``' ``which`` (``net_rx_top`` ...); None without it."""
    return None if v.meta.softirqs is None else getattr(v.meta.softirqs, which)[part]


def _queue_held(meta: RunMetadata) -> QueueHeld | None:
    """The queue a run's link held (``metadata.link``'s queue keys); None in records made before it."""
    return meta.link.queue if meta.link is not None else None


def _in_force(meta: RunMetadata) -> QueueInForce | None:
    """Which tree and limit the queue was (``metadata.link.queue_mode`` ...); None in records made before it."""
    return getattr(_queue_held(meta), "in_force", None)


def _ceiling_mbit(meta: RunMetadata) -> float | None:
    return getattr(meta.ceiling, "value_mbit", None)


def _credit_ran_out_s(meta: RunMetadata) -> float | None:
    evidence = meta.contention.evidence if meta.contention is not None else None
    return getattr(evidence.credit, "ran_out_after_s", None) if isinstance(evidence, ContentionEvidence) else None


def _deadline_mode_applied(meta: RunMetadata) -> str | None:
    """The deadline mode of the policy read back on the vCPU threads after it was applied
    (``metadata.contention.applied``): implicit, constrained, ``mixed`` when the threads differ; None without a
    deadline policy."""
    applied = meta.contention.applied if meta.contention is not None else {}
    modes = {p.deadline_mode for p in applied.values()} - {None}
    return "mixed" if len(modes) > 1 else next(iter(modes), None)


def _throttling(meta: RunMetadata, name: str):
    """``name`` of the cgroup models' throttling evidence (``contention.evidence.throttling``: ``cpu.stat``
    deltas over the body); None for the other models and records made before it was read."""
    evidence = meta.contention.evidence if meta.contention is not None else None
    throttling = evidence.throttling if isinstance(evidence, ContentionEvidence) else None
    return getattr(throttling, name, None)


def _param(v, name: str):
    """The contention model's parameter ``name`` (``period_ms``, ``burst_ms``, ``credit_s``); None for a model
    without it."""
    return getattr(v.cont.params, name, None)


def _sampling(v, name: str):
    """The sampler's ``name`` (:class:`~bbrlab.sampling.summary.SamplingSummary`); None for an unsampled run."""
    return getattr(v.meta.sampling, name, None)


def _fraction_inside(alignment: AlignmentCheck | None) -> float | None:
    """The share of guest samples inside on-CPU intervals, as the record writes it (5 digits)."""
    fraction = alignment.fraction_inside if alignment is not None else None
    return None if fraction is None else round(fraction, 5)


def _traced(v, read):
    """``read`` of the run's vCPU trace summary (``metadata.vcpu_trace``); None for a run not traced."""
    return None if v.meta.vcpu_trace is None else read(v.meta.vcpu_trace)


def _get(d, *keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _tbf_limit(qdiscs) -> int | None:
    """tbf's ``limit`` in a record's qdisc read-back (``metadata.qdiscs``: ``{port: [qdisc, ...]}``)."""
    for port in (qdiscs or {}).values():
        for q in port or []:
            if isinstance(q, dict) and q.get("kind") == "tbf":
                return (q.get("options") or {}).get("limit")
    return None


def queue_mode(link: Link, meta: RunMetadata) -> str:
    """The emulator's qdisc tree of a bbrlab run: ``metadata.link.queue_mode`` (read back from the kernel),
    else the scenario's ``link.queue``; ``bbrlab`` for records made before there was a choice."""
    return getattr(_in_force(meta), "queue_mode", None) or link.queue


def asked_buffer(link: Link) -> tuple[int | None, float | None]:
    """``(bytes, BDP)`` of the buffer a run's scenario asked for (in the authors' tree, tbf's limit, which is
    not in force)."""
    bdp_bytes = link.bdp_bytes
    asked_bdp, asked_bytes = link.buffer_bdp, link.buffer_bytes
    if asked_bytes is None and asked_bdp is not None and bdp_bytes is not None:
        asked_bytes = int(round(asked_bdp * bdp_bytes))
    if asked_bdp is None and asked_bytes is not None and bdp_bytes:
        asked_bdp = asked_bytes / bdp_bytes
    return asked_bytes, asked_bdp


def authors_queue(link: Link, meta: RunMetadata) -> tuple[int, int]:
    """``(packets, bytes)`` of the authors' tree's queue: netem's packet limit (as read back, else theirs) and
    that many full-size frames (MTU + Ethernet header)."""
    packets = getattr(_in_force(meta), "queue_packets", None) or AUTHORS_NETEM_LIMIT_PACKETS
    held = getattr(_queue_held(meta), "queue_bytes", None)
    return packets, held if held is not None else packets * link.frame_bytes  # MTU + Ethernet header


def effective_buffer(link: Link, meta: RunMetadata) -> tuple[float | None, float | None]:
    """``(bytes, BDP)`` of the bottleneck queue a bbrlab run had, never the asked buffer where it was not in
    force.

    The authors' tree (:func:`queue_mode`): netem's packet limit x full-size frames (:func:`authors_queue`).
    bbrlab's tree: ``metadata.link.queue_bytes`` (every record since the floor of two frames), else tbf's limit
    in the record's qdisc read-back (older records: an asked buffer below two packets was enlarged to 3000
    bytes then, and this shows it), else the scenario's request. The BDP is the asked ``buffer_bdp`` when the
    kernel held exactly that (to the byte), else bytes / BDP, so the same point keeps one value."""
    bdp_bytes = link.bdp_bytes
    if queue_mode(link, meta) == "authors":
        held = authors_queue(link, meta)[1]
        return held, (held / bdp_bytes if bdp_bytes else None)
    asked_bytes, _ = asked_buffer(link)
    asked_bdp = link.buffer_bdp
    held = getattr(_queue_held(meta), "queue_bytes", None)
    if held is None:
        held = _tbf_limit(meta.qdiscs)
    if held is None:
        return asked_bytes, asked_bdp
    if held == asked_bytes and asked_bdp is not None:
        return held, asked_bdp
    return held, (held / bdp_bytes if bdp_bytes else None)


def _limit_qdisc(v) -> str | None:
    """Whose limit was the bottleneck queue: ``tbf`` (bytes) or ``netem`` (packets); None when unshaped."""
    if not v.link.shaped:
        return None
    return getattr(_in_force(v.meta), "limit_in_force", None) or LIMIT_IN_FORCE[queue_mode(v.link, v.meta)]


#: The ``runs`` table: one row per run (one repetition of one point).
def sampler_of(flow: Flow) -> str | None:
    """The socket sampler a run's flow asked for: ``bpf``, ``netlink`` or ``ss`` (a record's ``sample_ss_ms``,
    the form before the samplers had a choice, reads as ss); None for an unsampled run."""
    return flow.sampler if flow.sample_ms is not None else None


def extra_flows_text(flows: tuple[ExtraFlow, ...]) -> str | None:
    """The other flows a run's scenario asked for (``scenario.flows``), one text per flow joined by ``"; "``:
    ``"competitor cubic x1 from 3 s for 30 s"``; None for a run of one flow."""
    parts = [f"{f.origin} {f.cca} x{f.streams} from {f.start_s:g} s for {f.duration_s:g} s" for f in flows]
    return "; ".join(parts) or None


RUN_SCHEMA: tuple[Column, ...] = (
    Column("run_id", "string", "run id (unique within a source)", lambda v: v.record.get("run_id")),
    Column("campaign", "string", "campaign name (bbrlab) or dataset folder name (authors)",
           lambda v: v.record.get("campaign")),
    Column("source", "string", "layout the run was read from: bbrlab or authors", lambda v: "bbrlab"),
    Column("status", "string", "ok, failed (the run's own failure) or excluded (dropped by a cross-check)",
           lambda v: v.record.get("status")),
    Column("reason", "string", "why the run failed or was excluded", lambda v: v.record.get("reason")),
    Column("path", "string", "the run's directory or file, relative to the source folder", lambda v: v.path),
    Column("cca", "string", "congestion control name as configured", lambda v: v.identity.cca),
    Column("bbr_version", "Int64", "BBR version 1, 2 or 3; <NA> for a CCA that is not BBR",
           lambda v: v.identity.bbr_version),
    Column("patched", "bool", "the inflight-deficit patch was in use", lambda v: v.identity.patched),
    Column("kernel", "string", "the sender's kernel (release, or the authors' kernel name)",
           lambda v: v.identity.kernel),
    Column("testbed", "string", "the testbed that ran it (a campaign over several testbeds: the one its Dask "
           "worker owned)", lambda v: (v.meta.added.worker and v.meta.added.worker.testbed) or v.testbed.name),
    Column("kernel_origin", "string", "where the sender kernel came from: debian (a Debian package), user (a "
           "kernel directory or .deb), lab; <NA> when the record does not say", lambda v: v.meta.kernel and v.meta.kernel.origin),
    Column("kernel_name", "string", "the sender kernel as the spec named it (debian-5.10, a directory's name ...)",
           lambda v: v.meta.kernel and v.meta.kernel.name),
    Column("variant", "string", "display label figures group by: Cubic, BBRv1, BBRv3 patched ...",
           lambda v: v.identity.variant),
    Column("contention_mode", "string", "deadline (SCHED_DEADLINE on the vCPUs), cfs-quota (a CFS quota on them), "
           "cfs-burst (a quota and a burst), credit (full CPU while a credit balance lasts, then the share as "
           "baseline quota), competing-load (busy threads on their CPU), hypervisor_load or none",
           lambda v: v.cont.model if _share(v) < 100 else NO_CONTENTION),
    Column("timeslice_ms", "float64", "SCHED_DEADLINE runtime = the paper's timeslice; cfs-quota, cfs-burst, credit: "
           "the quota per period (credit: the baseline's); <NA> for competing-load [ms]",
           lambda v: v.cont.timeslice_ms if _sets_timeslice(v.cont.model) else None),
    Column("deadline_mode", "string", "deadline's deadline: constrained (deadline = runtime, the paper's; records "
           "made before the mode existed) or implicit (deadline = period); the authors' deadline runs constrained "
           "(the paper, section 4.2); <NA> for the other models", lambda v: v.cont.deadline_mode),
    Column("deadline_mode_applied", "string", "the deadline mode of the policy the kernel read back on the vCPU "
           "threads after applying it (metadata.contention.applied): implicit (deadline = period) or constrained "
           "(deadline < period), mixed when the threads differ; <NA> without a deadline policy (100 %, the other "
           "models)", lambda v: _deadline_mode_applied(v.meta)),
    Column("cfs_period_ms", "float64", "the CFS period of cfs-quota, cfs-burst and credit (quota = share x period); "
           "<NA> for the other models [ms]", lambda v: _param(v, "period_ms")),
    Column("cfs_burst_ms", "float64", "cfs-burst's burst per vCPU thread (cpu.max.burst / cpu.cfs_burst_us); <NA> "
           "for the other models [ms]", lambda v: _param(v, "burst_ms")),
    Column("credit_s", "float64", "credit's balance at the start (and its cap); <NA> for the other models "
           "[CPU-seconds]", lambda v: _param(v, "credit_s")),
    Column("credit_ran_out_s", "float64", "credit: when the balance was spent and the quota dropped to the "
           "baseline, after the contention was applied (just before the transfer); <NA> when it lasted or for "
           "the other models [s]", lambda v: _credit_ran_out_s(v.meta)),
    Column("cfs_nr_periods", "Int64", "cfs-quota, cfs-burst, credit: CFS periods in which the vCPU threads' cgroup "
           "had a quota and ran, over the contention (cpu.stat nr_periods); <NA> for the other models and records "
           "made before it was read", lambda v: _throttling(v.meta, "nr_periods")),
    Column("cfs_nr_throttled", "Int64", "of those, the periods the cgroup spent its quota and was throttled (cpu.stat "
           "nr_throttled); 0: the quota never bound", lambda v: _throttling(v.meta, "nr_throttled")),
    Column("cfs_throttled_ms", "float64", "how long the cgroup's threads waited throttled over the contention "
           "(cpu.stat throttled_time / throttled_usec) [ms]", lambda v: _throttling(v.meta, "throttled_ms")),
    Column("cpu_share_pct", "float64", "CPU share = runtime / period [%]; 100 without a policy", _share),
    Column("achieved_share_pct", "float64", "share of a CPU the sender's vCPU threads really got over the "
           "transfer, run time / wall time from the host's /proc/<tid>/schedstat, mean over the threads [%]; <NA> "
           "without that evidence", lambda v: achieved_share(v.meta)),
    Column("load_pct", "float64", "hypervisor load in hypervisor_load mode (authors' loadperc) [%]",
           lambda v: None),
    Column("rtt_ms", "float64", "round-trip time set on the emulated link [ms]", lambda v: v.link.rtt_ms),
    Column("rate_mbit", "float64", "bottleneck rate [Mbit/s]", lambda v: v.link.rate_mbit),
    Column("buffer_bdp", "float64", "bottleneck queue in force in BDP: bbrlab's tree (queue_mode bbrlab) tbf's "
           "limit / BDP (the value asked for when the kernel held it to the byte; records without a read-back: as "
           "asked); the authors' tree netem's packet limit x full-size frames / BDP, whatever buffer was asked [BDP]",
           lambda v: effective_buffer(v.link, v.meta)[1]),
    Column("buffer_bytes", "float64", "bottleneck queue in force in bytes: bbrlab's tree tbf's limit (records "
           "without a read-back: as asked); the authors' tree netem's packet limit x full-size frames (MTU + 14 "
           "bytes; approximate, netem counts packets of any size) [bytes]",
           lambda v: effective_buffer(v.link, v.meta)[0]),
    Column("queue_mode", "string", "the emulator's qdisc tree: bbrlab (netem -> tbf, tbf's byte limit is the "
           "queue) or authors (tbf -> netem as the paper authors built it, netem's packet limit is the queue; "
           "docs/link.md)", lambda v: queue_mode(v.link, v.meta)),
    Column("queue_limit_qdisc", "string", "whose limit was the bottleneck queue: tbf (bytes) or netem "
           "(packets); <NA> for an unshaped link", _limit_qdisc),
    Column("queue_limit_packets", "Int64", "the bottleneck queue in packets when it is a packet limit (the "
           "authors' tree: netem's limit); <NA> for tbf's byte limit [packets]",
           lambda v: authors_queue(v.link, v.meta)[0] if queue_mode(v.link, v.meta) == "authors" else None),
    Column("buffer_asked_bdp", "float64", "the buffer the scenario asked for (tbf's configured limit); in the "
           "authors' tree NOT the queue in force (see buffer_bdp) [BDP]", lambda v: asked_buffer(v.link)[1]),
    Column("emulator_offloads", "string", "TSO, GSO and GRO on the emulator's ports: off (netem sees wire "
           "packets) or on (as the authors had them)", lambda v: v.link.emulator_offloads),
    Column("loss_model", "string", "none, uniform or gemodel", lambda v: v.link.loss_model),
    Column("loss_pct", "float64", "loss probability [%]", lambda v: v.link.loss_pct),
    Column("streams", "float64", "parallel iperf3 streams", lambda v: v.flow.params.connections),
    Column("duration_s", "float64", "iperf3 transfer time [s]", lambda v: v.duration_s),
    Column("repetition", "float64", "repetition number of the point", lambda v: v.scenario.repetition),
    Column("block", "Int64", "the run's block in a campaign with blocks (each on a fresh boot of the sender; "
           "docs/statistics.md); <NA> without blocks", lambda v: getattr(v.meta.block, "block", None)),
    Column("throughput_mbit", "float64", "iperf3 receiver sum over the streams of flow 0, the run's own flow (the "
           "other flows of a run of several: table flows) [Mbit/s]",
           lambda v: v.summary.get("throughput_mbit")),
    Column("sender_throughput_mbit", "float64", "iperf3 sender sum [Mbit/s]",
           lambda v: v.summary.get("sender_throughput_mbit")),
    Column("retransmits", "float64", "TCP retransmissions (iperf3 sender sum)", lambda v: v.summary.get("retransmits")),
    Column("mean_rtt_ms", "float64", "the sender's smoothed RTT averaged over the transfer (iperf3's mean_rtt, mean "
           "over streams) [ms]: the link's RTT plus the standing queue", lambda v: v.summary.get("mean_rtt_ms")),
    Column("cpu_sender_pct", "float64", "iperf3's sender CPU use [%]", lambda v: v.summary.get("cpu_sender_pct")),
    Column("link_utilisation", "float64", "throughput / rate (0..1)", lambda v: v.utilisation),
    Column("ceiling_mbit", "float64", "the sender's CPU ceiling at the run's timeslice, share and RTT (bbrlab "
           "calibrate; docs/calibration.md); missing without a calibration [Mbit/s]",
           lambda v: _ceiling_mbit(v.meta)),
    Column("above_ceiling", "boolean", "the run's throughput exceeds its ceiling_mbit: the ceiling does not bound "
           "it (bbrlab.calibration.check); <NA> without a ceiling or a throughput",
           lambda v: above_ceiling(v.summary.get("throughput_mbit"), _ceiling_mbit(v.meta))),
    Column("host_busy_pct", "float64", "how busy the CPUs of the host that ran the sender's QEMU were during the "
           "transfer, the testbed included (metadata.cpu_load.sender_hypervisor) [% of all its CPUs]",
           lambda v: v.meta.cpu_load and v.meta.cpu_load.sender_hypervisor.busy_pct),
    Column("host_other_busy_pct", "float64", "the host's CPU used by processes outside the testbed during the "
           "transfer (metadata.host_other; bbrlab.contention.outside); <NA> in records made before it was "
           "measured and where the sender's QEMU ran on another machine [% of all its CPUs]",
           lambda v: v.meta.host_other and v.meta.host_other.other_busy_pct),
    Column("hypervisor", "string", "hypervisor of the sender VM (authors' vm: qemu_kvm, qemu, virtualbox)",
           lambda v: v.testbed.hypervisor or None),
    Column("accelerator", "string", "kvm or tcg (QEMU's accelerator); none without a VM",
           lambda v: v.testbed.accelerator),
    Column("testbed_kind", "string", "local, host-netns, a lab, or authors", lambda v: v.testbed.kind),
    *MACHINE_SCHEMA,
    *TIMING_SCHEMA,
    Column("sender_qdisc", "string", "the sender's qdisc: fq when the run set fq as the root of the sender's "
           "experiment interface (sender_qdisc: fq), else its net.core.default_qdisc; authors: qdisc",
           lambda v: "fq" if v.scenario.sender_qdisc == "fq" else v.sender_sysctl("net.core.default_qdisc")),
    Column("cca_params", "string", "the module parameters of the CCA the run set (cca_params), name=value in name "
           "order joined by commas, e.g. deficit_gain=512; <NA>: none set", lambda v: knobs.as_text(v.scenario.cca_params)),
    Column("sender_sysctls", "string", "the sender's sysctls the run set (sender_sysctls), name=value in name order "
           "joined by commas, e.g. net.ipv4.tcp_limit_output_bytes=262144; <NA>: none set",
           lambda v: knobs.as_text(v.scenario.sender_sysctls)),
    Column("sender_root_qdisc", "string", "the root qdisc read back on the sender's experiment interface during "
           "the run (tc -j qdisc show; mq, fq, fq_codel ...); <NA> in records made before it was read",
           lambda v: v.meta.sender_qdisc and v.meta.sender_qdisc.root),
    Column("sender_vcpus", "Int64", "the sender VM's vCPUs in the run: its CPUs online as read in the guest "
           "(metadata.softirqs.cpus), else as the testbed started it (metadata.testbed.sender_vcpus); <NA> where "
           "neither is recorded [vCPUs]", sender_vcpus),
    Column("contended_threads", "Int64", "vCPU threads the contention model acted on: every vCPU thread of the "
           "sender (at 100 % share measured only); <NA> without a contention record",
           lambda v: _contended_threads(v.meta)),
    Column("sender_nic_queues", "Int64", "receive queues of the sender's experiment interface (1: single-queue "
           "virtio); <NA> in records made before it was read", lambda v: v.meta.softirqs and v.meta.softirqs.rx_queues),
    Column("softirq_net_rx_top_cpu", "Int64", "the sender CPU that ran the most NET_RX softirqs over the flow "
           "(/proc/softirqs before and after); <NA> in records made before it was read",
           lambda v: _top(v, "net_rx_top", 0)),
    Column("softirq_net_rx_top_share", "float64", "that CPU's share of the sender's NET_RX softirqs (0..1)",
           lambda v: _top(v, "net_rx_top", 1)),
    Column("softirq_net_tx_top_cpu", "Int64", "the sender CPU that ran the most NET_TX softirqs over the flow; <NA> "
           "when none ran", lambda v: _top(v, "net_tx_top", 0)),
    Column("softirq_net_tx_top_share", "float64", "that CPU's share of the sender's NET_TX softirqs (0..1)",
           lambda v: _top(v, "net_tx_top", 1)),
    Column("nic_irq_top_cpu", "Int64", "the sender CPU that took the most interrupts of its experiment interface "
           "over the flow (/proc/interrupts)", lambda v: _top(v, "nic_irq_top", 0)),
    Column("nic_irq_top_share", "float64", "that CPU's share of those interrupts (0..1)",
           lambda v: _top(v, "nic_irq_top", 1)),
    Column("sender_busiest_cpu", "Int64", "the sender CPU whose processes used the most time over the flow "
           "(/proc/stat user + nice + system): where the iperf3 client ran", lambda v: _top(v, "process_top", 0)),
    Column("sender_busiest_cpu_share", "float64", "that CPU's share of the sender's process time (0..1)",
           lambda v: _top(v, "process_top", 1)),
    Column("ss_sampled", "bool", "socket state was sampled during the run (costs the sender CPU)",
           lambda v: sampler_of(v.flow) is not None),
    Column("sampler", "string", "the socket sampler: bpf, netlink or ss (docs/sampling.md); <NA> unsampled",
           lambda v: sampler_of(v.flow)),
    Column("started_at", "string", "start time, UTC ISO 8601", lambda v: v.record.get("started_at")),
    # the host trace of the vCPU threads (docs/vcpu-trace.md); <NA> for a run not traced
    Column("vcpu_on_cpu_share", "float64", "share of the transfer the vCPU threads were on a host CPU, from the "
           "trace (mean over threads)", lambda v: _traced(v, lambda t: t.on_cpu_share)),
    Column("vcpu_gaps", "Int64", "number of complete off-CPU gaps of the vCPU threads",
           lambda v: _traced(v, lambda t: t.gaps.count)),
    Column("vcpu_gap_p50_ms", "float64", "median off-CPU gap [ms]", lambda v: _traced(v, lambda t: t.gaps.p50_ms)),
    Column("vcpu_gap_p99_ms", "float64", "99th percentile off-CPU gap [ms]",
           lambda v: _traced(v, lambda t: t.gaps.p99_ms)),
    Column("vcpu_longest_gap_ms", "float64", "longest off-CPU gap [ms]",
           lambda v: _traced(v, lambda t: t.longest_gap_ms)),
    Column("vcpu_schedstat_agrees", "boolean", "the trace's on-CPU time is within 2 % of schedstat's",
           lambda v: _traced(v, lambda t: t.schedstat_agrees)),
    # whether the run's samples and trace are whole (bbrlab.analysis.evidence; docs/run-record.md); <NA> unsampled
    # resp. untraced, and in the authors' layout
    Column("sampling_ended", "string", "how the socket sampler ended: stop_file (asked to, after the transfer); "
           "deadline, signal, error or 'killed (no footer)' in records made before such runs failed",
           lambda v: _sampling(v, "ended")),
    Column("samples_dropped", "Int64", "samples the BPF sampler's ring buffer dropped (<NA>: netlink and ss, which "
           "have none)", lambda v: _sampling(v, "dropped")),
    Column("ticks_missed", "Int64", "sampling ticks the sampler missed because it did not run (its vCPU was off "
           "a CPU); the samples' own times show the gap, so the samples are whole (<NA>: the ss loop)",
           lambda v: _sampling(v, "missed_ticks")),
    Column("samples_span_s", "float64", "first to last socket sample of the data stream sampled least long [s]",
           lambda v: v.samples_span_s),
    Column("samples_cover_transfer", "boolean", "the samples span the transfer (iperf3: duration_s; rsync: "
           "elapsed_s) to within two sample intervals", lambda v: v.samples_cover_transfer),
    Column("sampling_complete", "boolean", "the socket samples are whole: ended by the stop file, none dropped, "
           "they cover the transfer; figures of samples leave out runs where this is False",
           lambda v: evidence.sampling_complete(_sampling(v, "ended"),
                                                _sampling(v, "dropped"), v.samples_cover_transfer)),
    Column("trace_capped", "boolean", "the vCPU trace reached its byte cap: it ends before the transfer did",
           lambda v: _traced(v, lambda t: t.capped)),
    Column("trace_lost_events", "Int64", "events the trace's ring buffer lost (overruns, dropped events)",
           lambda v: _traced(v, lambda t: t.lost_events)),
    Column("trace_complete", "boolean", "the vCPU trace is whole: not capped, no event lost, on-CPU time within 2 % "
           "of schedstat's; timelines leave out runs where this is False",
           lambda v: evidence.trace_complete(_traced(v, lambda t: t.capped),
                                             _traced(v, lambda t: t.lost_events),
                                             _traced(v, lambda t: t.schedstat_agrees))),
    Column("samples_inside_on_cpu", "float64", "fraction of guest samples inside an on-CPU interval once aligned "
           "(<NA> when the clocks were not aligned)", lambda v: _fraction_inside(v.meta.alignment)),
    Column("sender_clock_uncertainty_ms", "float64", "the bound on the error of the sender's clock offset that put "
           "its socket samples on this machine's clock (the ss table's t_host_s) [ms]",
           lambda v: None if v.meta.alignment is None or v.meta.alignment.uncertainty_ns is None
           else v.meta.alignment.uncertainty_ns / 1e6),
    # the workload (docs/transfer.md); the authors' runs are iperf3's
    Column("workload", "string", "what the flow carried: iperf3 (bulk transfer) or rsync (a file over SSH)",
           lambda v: v.workload),
    Column("goodput_mbit", "float64", "iperf3: throughput_mbit; rsync: file bytes that arrived x 8 / the copy's "
           "wall time [Mbit/s]", lambda v: v.goodput_mbit),
    Column("file_mb", "float64", "rsync: the file's size [10^6 bytes]", lambda v: getattr(v.flow.params, "file_mb", None)),
    Column("bytes_delivered", "float64", "rsync: bytes of the file at the receiver at the end [bytes]",
           lambda v: v.transfer and v.transfer.bytes_delivered),
    Column("completion_s", "float64", "rsync: wall time of a completed copy, SSH handshake included [s]",
           lambda v: v.transfer and v.transfer.completion_s),
    Column("elapsed_s", "float64", "rsync: wall time of the copy, to completion or to its timeout [s]",
           lambda v: v.transfer and v.transfer.elapsed_s),
    Column("timed_out", "boolean", "rsync: transfer_timeout_s ended the copy (<NA> for iperf3)",
           lambda v: v.transfer and v.transfer.timed_out),
    Column("ssh_cipher", "string", "rsync: the SSH cipher, client to server", lambda v: v.transfer and _get(v.transfer.ssh, "cipher")),
    # several flows (bbrlab.analysis.fairness); a single-flow run has flows 1 and the rest <NA>
    Column("flows", "Int64", "iperf3 flows in the run (each with its own CCA, streams, start and origin)",
           lambda v: v.fair.get("flows")),
    Column("extra_flows", "string", "the run's other flows as its scenario asked them (origin, CCA, streams, start, "
           "duration), e.g. 'competitor cubic x1 from 3 s for 30 s'; <NA> for a single-flow run",
           lambda v: extra_flows_text(v.scenario.flows)),
    Column("overlap_s", "float64", "how long every flow was sending at once (the window the fairness columns "
           "cover) [s]", lambda v: v.fair.get("overlap_s")),
    Column("jain_index", "float64", "Jain's fairness index of the flows' throughputs over the overlap window "
           "(1/flows .. 1); <NA> for one flow", lambda v: v.fair.get("jain_index")),
    Column("convergence_s", "float64", "from the overlap's start to the first 1 s bin from which Jain's index "
           "stays >= 0.9 [s]; <NA> when it never does or for one flow", lambda v: v.fair.get("convergence_s")),
)
INTERVAL_SCHEMA: tuple[Column, ...] = (
    Column("run_id", "string", "the run"),
    Column("t_start_s", "float64", "interval start since the transfer began (rsync: since the receiver's first "
           "progress sample) [s]"),
    Column("t_end_s", "float64", "interval end [s]"),
    Column("throughput_mbit", "float64", "receiver throughput over the streams in the interval (rsync: the "
           "file's bytes that arrived in it) [Mbit/s]"),
    Column("retransmits", "float64", "retransmissions in the interval"),
)
SS_SCHEMA: tuple[Column, ...] = (
    Column("run_id", "string", "the run"),
    Column("t_s", "float64", "time since the run's first sample [s]"),
    Column("t_host_s", "float64", "when the guest took the sample, on the clock of the machine that ran the campaign "
           "(Unix seconds; the guest's clock shifted by the sender's measured offset, interpolated between the run's "
           "start and end; missing when the record has no clock offsets) [s]"),
    Column("port", "float64", "the connection's local port (missing when the log does not print it)"),
    Column("cca", "string", "congestion control as ss printed it"),
    Column("bw_mbit", "float64", "BBR's bandwidth estimate [Mbit/s]"),
    Column("mrtt_ms", "float64", "BBR's min RTT [ms]"),
    Column("pacing_gain", "float64", "BBR's pacing gain"),
    Column("cwnd_gain", "float64", "BBR's cwnd gain"),
    Column("pacing_rate_mbit", "float64", "pacing rate [Mbit/s]"),
    Column("delivery_rate_mbit", "float64", "delivery rate [Mbit/s]"),
    Column("cwnd", "float64", "congestion window [packets]"),
    Column("rtt_ms", "float64", "smoothed RTT [ms]"),
    Column("bytes_sent", "float64", "bytes sent, retransmissions included [bytes]"),
    Column("bytes_acked", "float64", "bytes cumulatively acknowledged [bytes]"),
    Column("bytes_retrans", "float64", "bytes retransmitted [bytes]"),
    Column("unacked", "float64", "packets not yet acknowledged"),
    Column("mss", "float64", "maximum segment size [bytes]"),
    Column("app_limited", "boolean", "the flow was application-limited"),
    Column("inflight_bytes", "float64", "bytes_sent - bytes_retrans - bytes_acked [bytes]"),
    Column("bdp_bytes", "float64", "BBR's BDP = bw x mrtt [bytes]"),
    Column("inflight_bdp", "float64", "inflight_bytes / bdp_bytes [BBR BDP]"),
)

RUN_SCHEMA += dimension_columns(RUN_SCHEMA)  # a spec dimension's column not declared above (none today)

RUN_COLUMNS = tuple(c.name for c in RUN_SCHEMA)
BOTTLENECK_COLUMNS = tuple(c.name for c in BOTTLENECK_SCHEMA)
INTERVAL_COLUMNS = tuple(c.name for c in INTERVAL_SCHEMA)
SS_COLUMNS = tuple(c.name for c in SS_SCHEMA)
VCPU_COLUMNS = tuple(c.name for c in VCPU_SCHEMA)
STREAM_COLUMNS = tuple(c.name for c in STREAM_SCHEMA)
FLOW_COLUMNS = tuple(c.name for c in FLOW_SCHEMA)
#: The tables, in the order the cache writes them, with their schemas.
SCHEMAS = {"runs": RUN_SCHEMA, "intervals": INTERVAL_SCHEMA, "ss": SS_SCHEMA, "vcpu": VCPU_SCHEMA,
           "bottleneck": BOTTLENECK_SCHEMA, "streams": STREAM_SCHEMA, "flows": FLOW_SCHEMA}
#: Columns that identify one experimental point (everything but the repetition): the run-identity key,
#: :data:`bbrlab.analysis.runkey.RUN_KEY` (a table may lack some, e.g. ``machine``).
POINT_COLUMNS = RUN_KEY


@dataclass
class Tables:
    """The tidy tables of one or more data sources, and notes on what was left out and why.

    Attributes
    ----------
    runs : pandas.DataFrame
        One row per run; columns :data:`RUN_COLUMNS` (see ``docs/data-and-figures.md``).
    intervals : pandas.DataFrame
        One row per iperf3 reporting interval (or rsync progress interval) of a successful run; columns
        :data:`INTERVAL_COLUMNS`.
    ss : pandas.DataFrame
        One row per socket-state sample and connection; columns :data:`SS_COLUMNS`.
    vcpu : pandas.DataFrame
        One row per on-CPU or off-CPU interval of a vCPU thread of a traced run; columns :data:`VCPU_COLUMNS`.
    notes : list of str
        What the step that made these tables left out or could not read, for a person.
    sources : list of dict
        Per data source read: ``kind``, ``path``, ``read`` (units read now), ``reused`` (from the cache).
    bottleneck : pandas.DataFrame
        One row per sample of the emulator's bottleneck queue and qdisc; columns :data:`BOTTLENECK_COLUMNS`
        (empty when not given).
    streams : pandas.DataFrame
        One row per iperf3 interval, flow and stream of a successful run; columns :data:`STREAM_COLUMNS`.
    flows : pandas.DataFrame
        One row per flow of a successful run (single-flow runs too); columns :data:`FLOW_COLUMNS`.
    """

    runs: pd.DataFrame
    intervals: pd.DataFrame
    ss: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)
    vcpu: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(VCPU_COLUMNS)))
    bottleneck: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(BOTTLENECK_COLUMNS)))
    streams: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(STREAM_COLUMNS)))
    flows: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(FLOW_COLUMNS)))

    @classmethod
    def empty(cls) -> Tables:
        """Tables with every column and no rows."""
        return normalise(cls(pd.DataFrame(columns=list(RUN_COLUMNS)), pd.DataFrame(columns=list(INTERVAL_COLUMNS)),
                             pd.DataFrame(columns=list(SS_COLUMNS))))

    def frames(self) -> dict[str, pd.DataFrame]:
        """Every table by name (:data:`SCHEMAS`' order)."""
        return {name: getattr(self, name) for name in SCHEMAS}

    @classmethod
    def of_frames(cls, frames: dict[str, pd.DataFrame], notes: list[str], sources: list[dict]) -> Tables:
        """Tables from :meth:`frames`' form (a table missing from ``frames`` is empty)."""
        empty = {name: pd.DataFrame(columns=[c.name for c in schema]) for name, schema in SCHEMAS.items()}
        return cls(**{**empty, **frames}, notes=notes, sources=sources)

    def counts(self) -> dict[str, int]:
        """Row counts: ``runs``, ``ok`` (runs with status ok), and every other table's rows by its name."""
        return {"runs": len(self.runs), "ok": int((self.runs["status"] == "ok").sum()) if len(self.runs) else 0,
                **{name: len(df) for name, df in self.frames().items() if name != "runs"}}

    def with_runs(self, runs: pd.DataFrame, notes: list[str]) -> Tables:
        """These tables restricted to ``runs`` (the other tables follow by run id), with ``notes``."""
        ids = set(runs["run_id"])
        frames = {name: df[df["run_id"].isin(ids)] for name, df in self.frames().items()}
        return Tables.of_frames({**frames, "runs": runs}, notes, self.sources)


@dataclass
class RunRows:
    """What one run contributes: its ``runs`` row, its interval tuples and ss rows, notes, its vCPU intervals,
    its bottleneck samples, its per-stream interval tuples and per-flow rows. ``ss`` and ``vcpu`` may be typed
    DataFrames (:func:`bbrlab.analysis.frames.typed_frame`) instead of lists: bbrlab's reader builds them in chunks from large logs."""

    run: dict
    intervals: list[tuple]
    ss: list[dict] | pd.DataFrame
    notes: list[str] = field(default_factory=list)
    vcpu: list[dict] | pd.DataFrame = field(default_factory=list)
    bottleneck: list[dict] = field(default_factory=list)
    streams: list[tuple] = field(default_factory=list)
    flows: list[dict] = field(default_factory=list)


def build_tables(rows: Iterable[RunRows]) -> Tables:
    """Turn per-run rows into the DataFrames in one go (no row-by-row appends). A run's rows of a table may come
    as a list of dicts or as a DataFrame already typed (:func:`bbrlab.analysis.frames.typed_frame`: a large log read in chunks); the
    tables keep the runs' order either way."""
    parts: dict[str, list] = {name: [] for name in SCHEMAS}
    notes: list[str] = []
    for r in rows:
        notes.extend(r.notes)
        if not r.run:
            continue
        parts["runs"].append([r.run])
        for name in ("intervals", "ss", "vcpu", "bottleneck", "streams", "flows"):
            parts[name].append(getattr(r, name))
    frames = {name: frame_of_parts(parts[name], schema) for name, schema in SCHEMAS.items()}
    return Tables.of_frames(frames, notes, [])


def normalise(t: Tables) -> Tables:
    """Give every column its declared dtype (and add declared columns a frame lacks, empty)."""
    return Tables.of_frames({name: normalise_frame(df, SCHEMAS[name]) for name, df in t.frames().items()},
                            t.notes, t.sources)


def concat(parts: list[Tables]) -> Tables:
    """Concatenate tables of several sources (skipping empty frames to keep dtypes)."""
    if not parts:
        return Tables.empty()
    if len(parts) == 1:  # one source: its tables as they are (typed already), not a copy of a large table
        return normalise(parts[0]) if any(untyped(df, SCHEMAS[n]) for n, df in parts[0].frames().items()) \
            else parts[0]

    def cat(name: str) -> pd.DataFrame:
        frames = [getattr(p, name) for p in parts if len(getattr(p, name))]
        if not frames:
            return normalise_frame(getattr(parts[0], name), SCHEMAS[name])
        return normalise_frame(pd.concat(frames, ignore_index=True), SCHEMAS[name], copy=False)  # a new frame

    return Tables.of_frames({name: cat(name) for name in SCHEMAS}, [n for p in parts for n in p.notes],
                            [s for p in parts for s in p.sources])


def schema_markdown() -> str:
    """The tables' columns as a Markdown list (used to check the docs stay in step)."""
    lines = []
    for title, schema in SCHEMAS.items():
        lines.append(f"### `{title}`\n")
        lines += [f"- `{c.name}` ({c.dtype}): {c.doc}" for c in schema]
        lines.append("")
    return "\n".join(lines)
