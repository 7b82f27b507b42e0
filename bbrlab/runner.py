"""One measurement run on a testbed, as one recipe (docs/run-record.md says what it leaves behind).

Read :meth:`Runner.run` top to bottom: prepare the sender, hold the link on the emulator, start the
iperf3 server (and the sampler), put the sender's vCPUs under the deadline policy for the client's
transfer, then read back and check what held. Each step is a context manager owned by its tool, composed
in one ``ExitStack``: whatever fails or interrupts the run (an exception, SIGINT, SIGTERM, SIGHUP), the
policy comes off, the sampler and the server stop, and the link is cleared, in reverse order.

The runner never catches a failure: it raises, carrying the metadata measured so far, and the campaign
(:func:`bbrlab.campaign.execute_run`) records it once, with where it was raised.
"""

from __future__ import annotations

import hashlib
from contextlib import ExitStack
from pathlib import Path

from . import __version__, checks, contention, iperf, link, sampling, sender
from . import record as rec
from .recovery import recover
from .runmeta import CcaUse, RunMetadata
from .scenario import Scenario

#: Seconds the sampler and the server may outlive the client's own limit before they stop by themselves.
SAMPLER_MARGIN_S, SERVER_MARGIN_S = 30.0, 60.0


def client_ports(run_id: str, attempt: int, streams: int) -> list[int]:
    """The data streams' local ports: below Linux's ephemeral range (32768+), different for each run and
    attempt, so a port still in TIME_WAIT from the previous run is not reused."""
    h = int(hashlib.sha256(f"{run_id}/{attempt}".encode()).hexdigest()[:8], 16)
    base = 20_000 + (h % 90) * 128
    return list(range(base, base + streams))


class Runner:
    """Runs scenarios on ``testbed`` one after the other: the campaign's run function.

    Keeps what lasts between the runs of a campaign: the link set on the emulator, and what was measured
    once about the testbed.
    """

    def __init__(self, testbed, *, ready_timeout_s: float = 15.0):
        self.testbed, self.ready_timeout_s = testbed, ready_timeout_s
        self.link = link.EmulatorLink(testbed.emulator.host, testbed.emulator.ports)
        self._static: dict | None = None
        self._recovered: dict | None = None

    def __call__(self, scenario: Scenario, staging: Path, *, run_id: str, attempt: int = 1, **_) -> dict:
        """Run ``scenario`` once, its files into ``staging``; the record's metadata. Raises if the run fails."""
        meta = RunMetadata()
        with meta.carried_by_errors():
            self.run(scenario, Path(staging), meta, ports=client_ports(run_id, attempt, scenario.flow.streams))
        return meta.to_dict()

    def close(self) -> None:
        """Take bbrlab's qdiscs off the emulator (the end of a campaign)."""
        self.link.close()

    def run(self, scenario: Scenario, out: Path, meta: RunMetadata, *, ports: list[int]) -> None:
        tb, flow = self.testbed, scenario.flow
        self._describe(meta)
        with meta.timed("probe"):
            state = sender.prepare(tb.sender.host)
            meta.testbed["sender_kernel"], meta.sysctls = state.kernel, {"sender": state.sysctls}
            meta.cca = CcaUse(flow.cca, list(state.available))
            checks.cca_offered(flow.cca, state.available)
            meta.module = sender.module_identity(tb.sender.host, flow.cca)
            meta.cca.bbr_version, meta.cca.patched = sender.bbr_identity(flow.cca, meta.module)
        meta.flow = {"client_ports": ports, "server_ip": tb.receiver.experiment_ip}
        limit_s = flow.duration_s + iperf.CLIENT_MARGIN_S
        with self.link.holding(scenario.link) as changed:  # a failure inside clears the link
            meta.timing["link_set"] = changed
            before = link.counters(self.link.readback(), tb.emulator.ports)
            with ExitStack() as traffic:
                with meta.timed("setup"):
                    traffic.enter_context(iperf.server(tb.receiver.host, lifetime_s=limit_s + SERVER_MARGIN_S,
                                                       ready_timeout_s=self.ready_timeout_s))
                    sampled = traffic.enter_context(sampling.sampler(
                        tb.sender.host, ports, flow.sample_ss_ms, limit_s + SAMPLER_MARGIN_S)) if flow.sample_ss_ms else None
                with meta.timed("client"), contention.contended(tb.sender.hypervisor, tb.sender.vcpu_threads(),
                                                               scenario.contention) as held:
                    result = iperf.run_client(tb.sender.host, tb.receiver.experiment_ip, cca=flow.cca,
                                              duration_s=flow.duration_s, streams=flow.streams, cport=ports[0])
                meta.contention = held.record()
                with meta.timed("stop"):
                    traffic.close()  # now, not at the block's end: the sampler's samples are fetched here
            with meta.timed("verify"):
                self._verify(scenario, out, meta, result, sampled, before, ports)

    def _verify(self, scenario: Scenario, out: Path, meta: RunMetadata, result, sampled, before, ports) -> None:
        tb, flow = self.testbed, scenario.flow
        meta.qdiscs = self.link.readback()
        rec.write_file(out / "iperf.json", result.stdout)
        parsed = checks.client_result(result, flow)
        meta.cca.iperf_sender = parsed.sender_tcp_congestion
        meta.iperf = {k: v for k, v in parsed.to_dict().items() if k != "intervals"}
        if sampled is not None:
            rec.write_file(out / "ss.log", sampled.text)
            meta.sampling = checks.samples(sampled.text, parsed, flow.cca)
            meta.cca.ss_seen = meta.sampling.pop("ss_seen")
        checks.data_ports(parsed, ports)
        checks.contention_held(meta.contention, scenario)
        checks.qdiscs_as_asked(scenario.link, tb.emulator.ports, meta.qdiscs)
        delta = link.counter_delta(before, link.counters(meta.qdiscs, tb.emulator.ports))
        meta.link = {"counters": delta}
        meta.link["loss"] = checks.drops_as_configured(scenario.link, delta)

    def _describe(self, meta: RunMetadata) -> None:
        """What is measured once per campaign (testbed, versions, offloads), and the first run's recovery."""
        tb = self.testbed
        if self._static is None:
            self._static = {"testbed": tb.describe(), "offloads": {"sender": sender.offloads(
                tb.sender.host, tb.receiver.experiment_ip)}, "versions": {
                "hypervisor": tb.hypervisor_name, "bbrlab": __version__, "bbrlab_git": rec.git_commit(),
                **sender.tool_versions(tb.sender.host)}}
        meta.testbed, meta.offloads = dict(self._static["testbed"]), self._static["offloads"]
        meta.versions = dict(self._static["versions"])
        if self._recovered is None:
            meta.recovered = self._recovered = recover(tb)


def run_once(testbed, scenario: Scenario, out_dir: str | Path, *, run_id: str | None = None, attempt: int = 1) -> dict:
    """Run one scenario with a fresh :class:`Runner` (it sets the link and clears it afterwards) and return its
    record, ok or failed (not committed anywhere: the files stay in ``out_dir``)."""
    from .campaign import failure_record

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runner, run_id = Runner(testbed), run_id or scenario.run_id
    started = rec.now_iso()
    try:
        metadata = runner(scenario, out, run_id=run_id, attempt=attempt)
    except Exception as e:  # noqa: BLE001 - the one-off run's failure is its record, as in a campaign
        return failure_record(run_id, "adhoc", scenario, attempt, started, e)
    finally:
        runner.link.forget()
    return rec.build_record(run_id=run_id, campaign="adhoc", status="ok", reason=None, attempt=attempt,
                            started_at=started, ended_at=rec.now_iso(), scenario=scenario.to_dict(), metadata=metadata)
