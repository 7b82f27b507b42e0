"""What must hold for a run to be recorded as ``ok``: each check raises :class:`RunFailed` saying what did not.

Every check compares what was asked with what the kernel, iperf3 or the sampler report having done:
the congestion control that carried the data, the data streams' ports, the test's duration, the deadline
policy read back from the vCPU threads, the qdiscs read back from the emulator, and what netem dropped
against the loss configured.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

from bbrlab.contention.evidence import ContentionRecord, EvidenceMissing
from bbrlab.core import recordjson
from bbrlab.core.errors import BbrlabError, RunFailed
from bbrlab.link.counters import LinkCounters, NetemLoss, loss_observed
from bbrlab.link.emulator import Readback, check_readback
from bbrlab.link.qdisc import build_tree
from bbrlab.sampling import bottleneck, logscan
from bbrlab.sampling.summary import SamplingSummary, of_numbers
from bbrlab.scenario.sampling_limits import SAMPLE_LOG_MAX_BYTES
from bbrlab.scenario.scenario import Link, Scenario

from . import iperf
from .clocks import RunClocks

#: What a run's failure reason says when a vCPU thread's deadline reservation stalled (:func:`contention_held`).
LOST_REPLENISHMENT = "the host kernel lost its replenishment"
#: Standard deviations a run's observed netem loss may differ from the configured one (binomial): far
#: enough that a correct run fails about once in a million, near enough that a loss that did not apply
#: (or applied twice) is caught.
LOSS_SIGMAS = 5.0
#: Below this many packets the loss is recorded but not judged.
LOSS_MIN_PACKETS = 200


def cca_offered(cca: str, available: tuple[str, ...]) -> None:
    """The sender offers the congestion control the scenario asks for."""
    if cca not in available:
        raise RunFailed(f"the sender offers {list(available)}, not {cca!r}")


def sender_vcpus(asked: int | None, online_cpus: int, vcpu_threads: int) -> None:
    """The sender has the vCPUs the scenario asks for (None: any count, nothing checked), read back twice: the
    CPUs online in the guest (``/proc/stat``) and the vCPU threads the hypervisor reports, which the contention
    acts on (so every vCPU is contended alike)."""
    if asked is None:
        return
    if online_cpus != asked:
        raise RunFailed(f"the scenario asks for {asked} sender vCPU(s), but the sender has {online_cpus} CPU(s) online")
    if vcpu_threads != asked:
        raise RunFailed(f"the scenario asks for {asked} sender vCPU(s), but its hypervisor reports {vcpu_threads} vCPU "
                        "thread(s): the contention would not reach every vCPU alike")


def client_result(result, cca: str, duration_s: float) -> iperf.IperfResult:
    """The client's JSON parsed; the test ran for the asked ``duration_s`` with the asked ``cca`` (the run's own
    flow, or an extra flow beside it)."""
    if not result.stdout.strip():
        raise RunFailed(f"iperf3 client printed nothing (exit {result.exit_code}): {result.stderr.strip()[:300]}")
    parsed = iperf.parse_result(result.stdout)
    if result.exit_code != 0:
        raise RunFailed(f"iperf3 client exit code {result.exit_code}")
    if parsed.sender_tcp_congestion != cca:
        raise RunFailed(f"iperf3 reports sender_tcp_congestion {parsed.sender_tcp_congestion!r}, asked for {cca!r}")
    if not math.isclose(parsed.duration_s, duration_s):
        raise RunFailed(f"iperf3 ran a {parsed.duration_s:g} s test, the scenario asked for {duration_s:g} s")
    return parsed


def data_ports(used: list[int], ports: list[int], what: str = "iperf3's data streams") -> None:
    """The data connections used the local ports the run bound them to."""
    if sorted(used) != sorted(ports):
        raise RunFailed(f"{what} used local ports {list(used)}, expected {ports}")


#: iperf3 (3.12) sets the congestion control on a data socket only after connecting and sending its 37-byte
#: cookie: samples taken before that show the sender's default CCA.
IPERF_COOKIE_BYTES = 37


def sampler_can_read(sampler: str, cca: str, bbr_version: int | None) -> None:
    """The BPF sampler decodes BBR's private state with BBRv1's layout: refuse any other BBR before the run."""
    if sampler == "bpf" and bbr_version not in (None, 1):
        raise RunFailed(f"the bpf sampler reads BBRv1's state only; {cca} is BBRv{bbr_version}: sample it with "
                        "sampler: netlink")


def sampler_ended_whole(sampled) -> None:
    """The sampler's log is all there: its stream was drained, not cut at the byte cap, and the sampler's
    command exited 0 (a sampler that could not write its output exits non-zero after the footer)."""
    if not getattr(sampled, "complete", True):
        raise RunFailed(f"the {sampled.kind} sampler's log did not arrive whole (its stream was not drained)")
    if getattr(sampled, "capped", False):
        raise RunFailed(f"the {sampled.kind} sampler's log reached its cap of {SAMPLE_LOG_MAX_BYTES} bytes and was "
                        "cut there: more samples than the spec's bounds allow")
    exit_code = getattr(sampled, "exit_code", 0)
    if exit_code not in (0, None):
        raise RunFailed(f"the {sampled.kind} sampler exited with {exit_code}: its log may lack its last samples")


class _DataRows:
    """What the run's checks keep of the data-stream rows as they stream by: how many, and the CCAs of those
    that carried data."""

    def __init__(self):
        self.rows, self.ccas, self.carrying = 0, set(), 0

    def add(self, row: dict) -> None:
        self.rows += 1
        if row["bytes_sent"] > IPERF_COOKIE_BYTES:
            self.carrying += 1
            self.ccas.add(row["cca"])


def samples(sampled, data_ports: list[int], cca: str, interval_ms: float) -> tuple[SamplingSummary, list[str]]:
    """The sampler's evidence is whole (:func:`sampler_ended_whole`; it ended by its stop file, with a footer)
    and it saw the data connections (local ``data_ports``), under ``cca``. Returns what the record keeps about
    sampling (the sampler's kind, program, asked and achieved interval, samples, missed ticks, guest CPU per
    sample: :class:`~bbrlab.sampling.summary.SamplingSummary`) and the CCAs seen on the data streams. The log is
    read from its file a line at a time (:mod:`bbrlab.sampling.logscan`), never whole."""
    sampler_ended_whole(sampled)
    seen_rows = _DataRows()
    try:
        numbers = logscan.scan(sampled.kind, sampled.log_file, data_ports, seen_rows.add)
        summary = of_numbers(sampled.kind, numbers, rows=seen_rows.rows, asked_interval_ms=interval_ms,
                             binary=sampled.binary)
    except BbrlabError as e:
        raise RunFailed(f"the {sampled.kind} sampler's samples: {e}") from None
    if summary.ended != "stop_file":
        raise RunFailed(f"the {sampled.kind} sampler ended by {summary.ended!r}, not by its stop file: its samples "
                        "may not reach the transfer's end")
    seen = sorted(seen_rows.ccas)
    if not seen_rows.carrying:
        raise RunFailed("the sampler saw no data connection carrying data")
    if seen != [cca]:
        raise RunFailed(f"the sampler saw congestion control {seen} on the data streams, asked for {cca!r}")
    return summary, seen


def clocks_known(record: RunClocks, interval_ms: float) -> None:
    """Every guest clock offset of ``metadata.clocks`` is known to better than one sample interval
    (``interval_ms``, the finest the run samples at): a guest sample could otherwise not be placed among its
    neighbours on this machine's clock."""
    for host, drift in record.measured().items():
        for when, offset in (("start", drift.start), ("end", drift.end)):
            if offset.uncertainty_s * 1e3 > interval_ms:
                raise RunFailed(f"the {host}'s clock offset at the run's {when} is uncertain by "
                                f"{offset.uncertainty_s * 1e3:.3f} ms (round trip {offset.round_trip_s * 1e3:.3f} "
                                f"ms over {offset.exchanges} exchanges), more than one sample interval "
                                f"({interval_ms:g} ms): its samples cannot be aligned with this machine's clock")


def bottleneck_samples(queue) -> bottleneck.BottleneckSummary:
    """The bottleneck sampler (``queue``, a finished :func:`bbrlab.sampling.bottleneck.queue_sampler`) ended by
    its stop file with samples of the data port's qdiscs: its summary for ``metadata.bottleneck``."""
    text = queue.text or ""
    summary = bottleneck.summary(text, queue.interval_ms)
    if summary is None:
        raise RunFailed(f"the bottleneck sampler's log has no '# end' line: {text[-300:]!r}")
    if summary.reason != "stop_file":
        raise RunFailed(f"the bottleneck sampler ended by {summary.reason}, not by its stop file: {text[-300:]!r}")
    try:
        rows = bottleneck.parse_log(text)
    except ValueError as e:
        raise RunFailed(f"the bottleneck sampler's samples: {e}") from None
    if not rows:
        raise RunFailed("the bottleneck sampler took no sample of the data port's qdiscs")
    return replace(summary, qdiscs=sorted({f"{r.kind} {r.handle}" for r in rows}), binary=queue.binary)


def contention_held(record: ContentionRecord | None, scenario: Scenario) -> None:
    """The contention held on every vCPU thread as configured (``record``: the run's contention record): its
    evidence was collected, no reservation stalled, every thread got CPU time, the model's own checks held
    (``policy_held``: deadline's policy, the cgroup models' cgroup and limit, competing-load's loops and pins),
    every thread ran under SCHED_DEADLINE exactly when the model is deadline below 100 % (the other models
    never use it), and no cgroup quota, burst or bbrlab cgroup but the run's own was on a vCPU thread."""
    evidence = record.evidence if record is not None else None
    if isinstance(evidence, EvidenceMissing):
        raise RunFailed(f"contention evidence missing: {evidence.error}")
    if evidence is None:
        raise RunFailed("the deadline policy did not hold on the vCPU threads: no evidence was recorded")
    if evidence.stalls:
        first = evidence.stalls[0]
        raise RunFailed(f"vCPU thread {first.tid} stayed runnable without CPU for {first.stalled_s} s under "
                        f"SCHED_DEADLINE ({LOST_REPLENISHMENT}; the reservation was restarted): "
                        f"the contention did not hold as configured ({len(evidence.stalls)} stall(s))")
    if evidence.foreign_limits:
        raise RunFailed("something besides the run's contention limited the vCPU threads' CPU (a leftover?): "
                        + "; ".join(evidence.foreign_limits[:5]))
    idle = [t.tid for t in evidence.threads if t.got_cpu is False]
    if idle:
        raise RunFailed(f"vCPU thread(s) {idle} got no CPU time during the run (their run time in "
                        "/proc/<tid>/schedstat did not grow): not the VM's vCPU threads, or the VM was stopped")
    c = scenario.contention
    if not evidence.policy_held:
        raise RunFailed(f"the {c.model} contention did not hold on the vCPU threads: "
                        f"{json.dumps(evidence.to_dict())[:400]}")
    deadline = c.kind.uses_timeslice and not c.unlimited
    for thread in evidence.threads:
        after = thread.policy_after.policy if thread.policy_after is not None else ""
        if deadline != ("DEADLINE" in after):
            raise RunFailed(f"vCPU thread {thread.tid} ran under {after} for a {c.cpu_share_pct} % share "
                            f"(model {c.model})")


def qdiscs_as_asked(link_: Link, ports, qdiscs: Readback) -> None:
    """The emulator's qdiscs read back after the run are the ones the link asks for."""
    try:
        check_readback(build_tree(link_, tuple(ports)), qdiscs)
    except BbrlabError as e:
        raise RunFailed(f"the emulator's qdiscs after the run differ from the request: {e}") from None


def drops_as_configured(link_: Link, delta: LinkCounters) -> NetemLoss:
    """netem dropped what the configured loss explains, and nothing on the ACK port; returns the loss seen.

    With no loss configured netem must drop nothing (a drop would be its own queue overflowing, which
    no router of the scenario does). With uniform loss ``p`` over ``n`` packets the observed fraction
    must lie within :data:`LOSS_SIGMAS` binomial standard deviations of ``p``.

    In the authors' tree (``link_.queue == "authors"``) netem's queue IS the bottleneck: its overflow drops
    are the bottleneck's and cannot be told from its loss, so drops are allowed without loss configured,
    and with loss only a fraction clearly below ``p`` fails the run (:func:`bbrlab.link.counters.loss_observed`).
    """
    seen = loss_observed(delta, link_.queue)
    ack_drops = sum(c.drops for c in delta.ack.values())
    if ack_drops:
        raise RunFailed(f"the emulator dropped {ack_drops} packet(s) on the ACK port, where no loss is configured")
    configured = link_.effective_loss_pct / 100
    n, dropped = seen.entered or 0, seen.netem_dropped
    overflow_counts = link_.queue == "authors"
    if link_.loss_model == "none" and dropped and not overflow_counts:
        raise RunFailed(f"netem dropped {dropped} of {n} packets with no loss configured (its queue overflowed?)")
    if link_.loss_model == "uniform" and n >= LOSS_MIN_PACKETS:
        sigma = math.sqrt(configured * (1 - configured) / n)
        off = seen.fraction - configured
        if (-off if overflow_counts else abs(off)) > LOSS_SIGMAS * sigma:
            raise RunFailed(f"netem dropped {100 * seen.fraction:.3f} % of {n} packets, configured "
                            f"{100 * configured:g} % (more than {LOSS_SIGMAS:g} standard deviations "
                            f"{'below' if overflow_counts else 'apart'})")
    return replace(seen, configured_fraction=configured)


#: Seconds without a byte delivered, after data began to flow, that an uncontended transfer on a loss-free link
#: may not have. An RTO backs off 0.2, 0.4, 0.8, 1.6 s...: a flow that loses a packet or two recovers within
#: about a second there, while the stall issue 35 reports carried nothing for 15 s with cwnd at 1 MSS.
STALL_S = 3.0


def not_stalled(intervals, scenario: Scenario, delta: LinkCounters | None = None) -> None:
    """An uncontended single flow on a link that loses nothing (no loss model) never stops for :data:`STALL_S`
    once it has carried data: such a run measured the testbed, not the congestion control, and fails with where
    the emulator's qdiscs say the packets went. Contended runs (whose collapse is the subject) and lossy links
    (whose RTO backoff is legitimate) are not judged."""
    contention = scenario.contention
    if not contention.unlimited or scenario.link.loss_model != "none" or scenario.flows:
        return
    started, silent_s, silent_from = False, 0.0, None
    for iv in intervals:
        if iv.throughput_mbit > 0:
            started, silent_s, silent_from = True, 0.0, None
            continue
        if not started:
            continue
        silent_from = iv.t_start_s if silent_from is None else silent_from
        silent_s += iv.t_end_s - iv.t_start_s
        if silent_s >= STALL_S:
            where = ""
            if delta is not None:
                where = "; the emulator's qdiscs over the run: " + json.dumps(recordjson.to_json(delta), sort_keys=True)
            raise RunFailed(f"stalled: an uncontended flow on a loss-free link carried nothing for {silent_s:g} s "
                            f"from {silent_from:g} s (the testbed's path, not the congestion control){where}")
