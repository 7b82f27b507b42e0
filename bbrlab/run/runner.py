"""One measurement run on a testbed, as one recipe (docs/run-record.md says what it leaves behind).

Read :meth:`Runner.run` top to bottom: boot the sender into the scenario's kernel if it runs another,
set the module parameters and sysctls the scenario asks (``cca_params``, ``sender_sysctls``), prepare the
sender, set its root qdisc (``sender_qdisc``), hold the link on the emulator, start the workload's server on the receiver (iperf3's
server, or rsync's sshd: :mod:`bbrlab.run.workloads`) and the sampler, put the sender's vCPUs under the
deadline policy for the client's transfer, then read back and check what held. Each step is a context
manager owned by its tool, composed in one ``ExitStack``: whatever fails or interrupts the run (an
exception, SIGINT, SIGTERM, SIGHUP), the policy comes off, the sampler and the server stop, and the link
is cleared, in reverse order.

A lab's hosts are driven only under their own lock (:mod:`bbrlab.testbed.hostlock`): it is checked before the
run starts and again before the run is handed back to be recorded, and a lock found lost fails the attempt
(:class:`~bbrlab.testbed.hostlock.HostLockLost`); the next attempt takes it again and sets the link afresh.

The runner never catches a failure: it raises a :class:`~bbrlab.run.runmeta.FailedRun` carrying the metadata
measured so far, from the error that ended the run, and the campaign (:func:`bbrlab.campaign.loop.drive`)
records it once, with where that error was raised.
"""

from __future__ import annotations

import hashlib
import sys
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

from bbrlab.contention import hostcpu, outside
from bbrlab.contention import models as contention
from bbrlab.contention import placement as cpuplacement
from bbrlab.core import recordjson
from bbrlab.core.sidebyside import SideBySide
from bbrlab.link import counters as linkcount
from bbrlab.link import emulator as link
from bbrlab.sampling import alignment, logscan, vcputrace
from bbrlab.sampling import bottleneck as queue_sampling
from bbrlab.sampling import sampler as sampling
from bbrlab.scenario.scenario import Scenario
from bbrlab.testbed import hostlock, timingenv

from . import checks, clocks, flows, iperf, sender, senderknobs, senderqdisc, softirqs, workloads
from . import record as rec
from .blockboot import BlockBoot
from .ceiling import Calibration
from .flowrecord import FlowRecord
from .runmeta import CcaUse, RunMetadata
from .session import TestbedSession

#: Seconds the sampler and the server may outlive the client's own limit before they stop by themselves.
SAMPLER_MARGIN_S, SERVER_MARGIN_S = 30.0, 60.0
#: The run directory's file for each sampler's log (``ss.log``: what the ss loop printed, as before).
SAMPLE_FILES = {"ss": "ss.log", "netlink": "samples.log", "bpf": "samples.log"}
#: The run directory's file of the vCPU threads' on/off-CPU intervals (docs/run-record.md).
VCPU_FILE = "vcpu.csv"


def traces_vcpu(flow) -> bool:
    """Whether a run of ``flow`` traces the sender's vCPU threads on the host: ``vcpu_trace`` on, or auto and sampled."""
    return flow.vcpu_trace == "on" or (flow.vcpu_trace == "auto" and flow.sample_ms is not None)


def timed_remotely(flow) -> bool:
    """Whether a run of ``flow`` records timestamps of the guests' clocks (socket or bottleneck samples), and so
    measures those clocks' offsets against this machine's (``metadata.clocks``)."""
    return bool(flow.sample_ms or flow.bottleneck_interval_ms)


def client_ports(run_id: str, attempt: int, streams: int) -> list[int]:
    """The data streams' local ports: below Linux's ephemeral range (32768+), different for each run and
    attempt, so a port still in TIME_WAIT from the previous run is not reused."""
    h = int(hashlib.sha256(f"{run_id}/{attempt}".encode()).hexdigest()[:8], 16)
    base = 20_000 + (h % 90) * 128
    return list(range(base, base + streams))


class Runner:
    """Runs scenarios on ``testbed`` one after the other: the campaign's run function.

    What lasts between the runs (the link held on the emulator, the sender kernel booted, the CCAs'
    identities, what is measured once per sender boot) is its :class:`~bbrlab.run.session.TestbedSession`. With a
    ``calibration`` (:mod:`bbrlab.run.ceiling`) every run's record points to the ceiling of its point
    (``metadata.ceiling``, its file named as ``calibration_source``); a run fails when the calibration
    belongs to another testbed or sender kernel, or lacks the point.
    """

    def __init__(self, testbed, *, ready_timeout_s: float = 15.0, calibration: Calibration | None = None,
                 calibration_source: str | None = None):
        self.ready_timeout_s = ready_timeout_s
        self.calibration, self.calibration_source = calibration, calibration_source
        self.session = TestbedSession(testbed)

    @property
    def testbed(self):
        """The testbed as it is now (a new object after the sender rebooted into another kernel)."""
        return self.session.testbed

    @property
    def link(self) -> link.EmulatorLink:
        """The emulated link this runner's session holds."""
        return self.session.link

    def __call__(self, scenario: Scenario, staging: Path, *, run_id: str, attempt: int = 1,
                 block: BlockBoot | None = None, **_) -> dict:
        """Run ``scenario`` once, its files into ``staging``; the record's metadata (its JSON). ``block``: the
        run's block in a campaign with blocks (the sender is booted afresh for a new one). Raises
        :class:`~bbrlab.run.runmeta.FailedRun` if the run fails (an interruption as itself)."""
        meta = RunMetadata()
        with meta.carried_by_errors():
            if hostlock.check_held(self.testbed):  # taken again after it was lost: the hosts may have changed
                self.session.hosts_retaken()
            try:
                ports = client_ports(run_id, attempt, scenario.flow.params.connections)
                self.run(scenario, Path(staging), meta, ports=ports,
                         **({} if block is None else {"block": block}))
            except Exception:
                # No deadline policy outlives a failed run, even one whose restore failed: the next attempt
                # would otherwise refuse the leftover (or measure under it).
                meta.deadline_after_failure = self.session.clear_deadline()
                raise
            hostlock.check_held(self.testbed)  # held the whole run, or the run is not recorded as ok
        self.session.recovery_recorded = True
        return meta.to_dict()

    def close(self) -> None:
        """Take bbrlab's qdiscs off the emulator (the end of a campaign)."""
        self.link.close()

    def run(self, scenario: Scenario, out: Path, meta: RunMetadata, *, ports: list[int],
            block: BlockBoot | None = None) -> None:
        """The recipe: run ``scenario`` with its files into ``out``, filling ``meta``; raises when the run fails.
        Flows beside flow 0 (``scenario.flows``) run alongside it (:mod:`bbrlab.run.flows`)."""
        with meta.timed("flows_prepare"):
            flows.check_origins(self.testbed, scenario.flows)
            extra = flows.prepare(self.testbed, scenario.flows, ports) if scenario.flows else []
        try:
            self._run(scenario, out, meta, ports, extra, block)
        finally:
            with meta.timed("flows_close"):
                flows.close(extra)

    def _run(self, scenario: Scenario, out: Path, meta: RunMetadata, ports: list[int], extra: list,
             block: BlockBoot | None = None) -> None:
        work = workloads.for_flow(scenario.flow)
        self.session.boot(scenario.kernel, meta, block, sender_vcpus=scenario.sender_vcpus)
        with meta.timed("describe"):
            self.session.describe(meta)
        # a failure inside clears the link and restores the sender's qdisc, module parameters and sysctls, in
        # reverse order
        with ExitStack() as held:
            if scenario.cca_params or scenario.sender_sysctls:  # set before the probe, which reads them back too
                with meta.timed("sender_knobs"):
                    meta.knobs = held.enter_context(senderknobs.held(self.testbed.sender.host, scenario))
            with meta.timed("probe"):
                prepared = self._prepare(scenario, work, meta)
            tb, flow = self.testbed, scenario.flow
            meta.flow = FlowRecord(work.name, ports, tb.receiver.experiment_ip)
            limit_s = max([work.client_limit_s(flow)] + [f.start_s + f.duration_s + iperf.CLIENT_MARGIN_S
                                                         for f in scenario.flows])
            with meta.timed("sender_qdisc"):
                meta.sender_qdisc = held.enter_context(senderqdisc.held(
                    tb.sender.host, tb.receiver.experiment_ip, scenario.sender_qdisc))
            with meta.timed("link"):
                meta.timing["link_set"] = held.enter_context(self.link.holding(scenario.link))
            with meta.timed("counters"):
                before = linkcount.counters(self.link.counters_start(), tb.emulator.ports)
            endpoint, result, sampled, vcpu = self._traffic(scenario, work, prepared, out, meta, ports, extra, limit_s)
            with meta.timed("verify"):
                self._verify(scenario, work, endpoint, out, meta, result, sampled, before, ports, extra)
                if vcpu is not None and sampled is not None:
                    meta.alignment = self._alignment(vcpu, out / SAMPLE_FILES[flow.sampler], flow,
                                                     meta.clocks and meta.clocks.sender)
            with meta.timed("restore"):
                held.close()

    def _traffic(self, scenario: Scenario, work: workloads.Workload, prepared, out: Path, meta: RunMetadata,
                 ports: list[int], extra: list, limit_s: float) -> tuple:
        """Servers and samplers up (``setup``), the sender's vCPUs contended (``contend``), the transfer
        (``client``), the contention off (``release``), the samplers and servers stopped (``stop``); returns the
        endpoint, the client's result, the socket sampler and the vCPU trace."""
        tb, flow = self.testbed, scenario.flow
        with ExitStack() as traffic:
            with meta.timed("setup"):
                endpoint = traffic.enter_context(work.start(tb, flow, prepared, lifetime_s=limit_s + SERVER_MARGIN_S,
                                                             ready_timeout_s=self.ready_timeout_s))
                # who the receiving end ran as
                meta.flow.served_by(endpoint.port, endpoint.account.name, endpoint.account.note, endpoint.caps)
                flows.servers(traffic, tb, extra, lifetime_s=limit_s + SERVER_MARGIN_S,
                              ready_timeout_s=self.ready_timeout_s)
                watch = traffic.enter_context(clocks.ClockWatch(
                    {"sender": tb.sender.host, "emulator": tb.emulator.host})) if timed_remotely(flow) else None
                sampled, queue, irqs = self._samplers(traffic, flow, ports, endpoint.port, out, limit_s)
                vcpus = tb.sender.vcpu_threads()  # hand-given ids: checked against their pinned threads
                checks.sender_vcpus(scenario.sender_vcpus, irqs.before.online_cpus, len(vcpus))
                meta.qemu_cpus = cpuplacement.of_testbed(tb, vcpus)  # where its QEMU threads may run now
                meta.timing_env = timingenv.of_testbed(tb, vcpus[0] if vcpus else None)  # one command per host
            with ExitStack() as contended:
                with meta.timed("contend"):
                    cpu_load = contended.enter_context(hostcpu.watching(self.session.watched_hosts()))
                    ours = self.session.testbed_processes()
                    host_other = contended.enter_context(outside.watching(ours) if ours else nullcontext())
                    held = contended.enter_context(contention.contended(
                        tb.sender.hypervisor, vcpus, scenario.contention, expected=tb.sender.vcpu_pins(),
                        accelerator=getattr(tb, "accelerator", None)))
                    trace = contended.enter_context(
                        vcputrace.traced(tb.sender.hypervisor, vcpus) if traces_vcpu(flow) else nullcontext())
                with meta.timed("client"):
                    threads = flows.start(extra, tb.receiver.experiment_ip, time.monotonic())
                    result = work.wait(tb, flow, endpoint, ports)
                    flows.wait(threads, extra)
                with meta.timed("release"):
                    contended.close()
            meta.contention, meta.cpu_load = held.record(), recordjson.from_json(hostcpu.CpuLoad, cpu_load)
            meta.host_other = None if host_other is None else recordjson.from_json(outside.OutsideLoad, host_other)
            with meta.timed("trace"):
                vcpu = self._record_trace(trace, out, meta)
            with meta.timed("stop"):
                traffic.close()  # now, not at the block's end: the sampler's log is completed here
            meta.softirqs = irqs.record()
            if watch is not None:
                meta.clocks = watch.record()
                checks.clocks_known(meta.clocks, min(ms for ms in (flow.sample_ms, flow.bottleneck_interval_ms) if ms))
            if queue is not None:
                meta.bottleneck = checks.bottleneck_samples(queue)
        return endpoint, result, sampled, vcpu

    def _samplers(self, traffic: ExitStack, flow, ports: list[int], server_port: int, out: Path,
                  limit_s: float) -> tuple:
        """The socket sampler in the sender and the queue sampler in the emulator, each when the flow asks for it,
        and the sender's per-CPU counters (:class:`~bbrlab.run.softirqs.SoftirqWatch`), started side by side and,
        when ``traffic`` closes, stopped side by side (each is SSH round trips into its own guest); ``(socket
        sampler or None, queue sampler or None, the counters' watch)``."""
        tb = self.testbed
        wanted = {"softirqs": softirqs.SoftirqWatch(tb.sender.host, tb.receiver.experiment_ip)}
        if flow.sample_ms:
            wanted["socket"] = sampling.sampler(
                tb.sender.host, ports, flow.sample_ms, limit_s + SAMPLER_MARGIN_S,
                log_file=out / SAMPLE_FILES[flow.sampler], server_port=server_port, kind=flow.sampler)
        if flow.bottleneck_interval_ms:
            wanted["queue"] = queue_sampling.queue_sampler(
                tb.emulator.host, tb.emulator.ports[1], flow.bottleneck_interval_ms, limit_s + SAMPLER_MARGIN_S,
                log_file=out / queue_sampling.LOG_FILE)
        started = dict(zip(wanted, traffic.enter_context(SideBySide(*wanted.values())), strict=True))
        return started.get("socket"), started.get("queue"), started["softirqs"]

    @staticmethod
    def _record_trace(trace, out: Path, meta: RunMetadata) -> vcputrace.VcpuTrace | None:
        """The vCPU trace's intervals into ``vcpu.csv`` and its summary into the metadata."""
        if trace is None:
            return None
        result = trace.result
        result.write_csv(out / VCPU_FILE)
        meta.vcpu_trace = recordjson.from_json(vcputrace.TraceSummary, {"file": VCPU_FILE, **result.summary()})
        if result.schedstat_agrees() is False:
            print(f"bbrlab: WARNING: the vCPU trace's on-CPU time is not within 2 % of schedstat's: "
                  f"{meta.vcpu_trace.schedstat} (inferred switch-ins: {meta.vcpu_trace.inferred_switch_ins})",
                  file=sys.stderr, flush=True)
        return result

    @staticmethod
    def _alignment(vcpu: vcputrace.VcpuTrace, log: Path, flow,
                   drift: clocks.ClockDrift | None) -> alignment.AlignmentCheck:
        """The alignment check of the guest's samples against the vCPU trace, the guest's times put on this
        machine's clock by the sender's measured offset (``metadata.clocks.sender``: its start, and the drift to
        its end); recorded as not aligned when the offset was not measured."""
        times = logscan.guest_sample_times_ns(flow.sampler, log)  # a line at a time, never the whole log
        offset = None
        if drift is not None:
            start, end = drift.start, drift.end
            offset = alignment.ClockOffset.of_remote_minus_local(
                start.offset_s, max(start.uncertainty_s, end.uncertainty_s), drift_ppm=drift.drift_ppm or 0.0,
                measured_at_s=start.measured_at)
        return alignment.check(times, vcpu.on_spans_realtime(), offset, flow.sample_ms,
                               vcpu.window_realtime())

    def _prepare(self, scenario: Scenario, work: workloads.Workload, meta: RunMetadata):
        """TCP on the sender made memoryless; the CCA on offer and identified from the running kernel (BBR
        version, patch); the run's ceiling; the workload's own preparation (its return value)."""
        tb, flow = self.testbed, scenario.flow
        state = sender.prepare(tb.sender.host)
        meta.testbed.update(sender_kernel=state.kernel, sender_boot_id=state.boot_id)
        meta.sysctls = sender.SenderSysctls(state.sysctls)
        meta.cca = CcaUse(flow.cca, list(state.available))
        checks.cca_offered(flow.cca, state.available)
        for f in scenario.flows:  # the competitor's are checked where it runs (bbrlab.run.flows.prepare)
            if f.origin == "sender":
                checks.cca_offered(f.cca, state.available)
        identity = self.session.identities.get(tb.sender.host, flow.cca, state.boot_id)
        meta.cca.bbr_version, meta.cca.patched = identity.bbr_version, identity.patched
        meta.module = sender.module_identity(tb.sender.host, flow.cca)
        if flow.sample_ms:
            checks.sampler_can_read(flow.sampler, flow.cca, meta.cca.bbr_version)
        if self.calibration is not None:
            meta.ceiling = self.calibration.pointer(scenario, meta.testbed.to_dict(), self.calibration_source)
        return work.prepare(tb, flow)

    def _verify(self, scenario: Scenario, work: workloads.Workload, endpoint, out: Path, meta: RunMetadata, result,
                sampled, before, ports, extra: list) -> None:
        tb, flow = self.testbed, scenario.flow
        meta.qdiscs = self.link.readback()
        parsed = work.result(flow, endpoint, result, out, meta)
        data_ports = work.check(flow, endpoint, result, parsed, ports)
        if scenario.flows:
            meta.flows = flows.verify(extra, out)
        if sampled is not None:  # its log is in out/ already: streamed there while it ran
            meta.sampling, meta.cca.ss_seen = checks.samples(sampled, data_ports, flow.cca, flow.sample_ms)
        checks.contention_held(meta.contention, scenario)
        checks.qdiscs_as_asked(scenario.link, tb.emulator.ports, meta.qdiscs)
        delta = linkcount.counters(meta.qdiscs, tb.emulator.ports).minus(before)
        meta.link = linkcount.LinkRecord(delta, linkcount.effective_queue(meta.qdiscs, tb.emulator.ports, scenario.link),
                                         offloads=self.link.offloads)  # as read back when the link was set
        meta.link.loss = checks.drops_as_configured(scenario.link, delta)
        work.check_link(scenario, parsed, delta)


def run_once(testbed, scenario: Scenario, out_dir: str | Path, *, run_id: str | None = None, attempt: int = 1) -> dict:
    """Run one scenario with a fresh :class:`Runner` (it sets the link and clears it afterwards) and return its
    record's JSON, ok or failed (not committed anywhere: the files stay in ``out_dir``; made as a campaign makes
    it, :func:`bbrlab.run.record.record_of_run`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runner, run_id = Runner(testbed), run_id or scenario.run_id
    started = rec.now_iso()
    try:
        metadata = runner(scenario, out, run_id=run_id, attempt=attempt)
    except Exception as e:  # noqa: BLE001 - the one-off run's failure is its record, as in a campaign
        return rec.failure_record(run_id, "adhoc", scenario, attempt, started, e).to_dict()
    finally:
        runner.link.forget()
    return rec.record_of_run(out, run_id=run_id, campaign="adhoc", status="ok", reason=None, attempt=attempt,
                             started_at=started, ended_at=rec.now_iso(), scenario=scenario,
                             metadata=metadata).to_dict()
