"""iperf3 as a workload: the bulk transfer of ``duration_s`` over ``streams`` connections (the paper's load).

The steps of :class:`bbrlab.run.workloads.Workload` on the mechanisms of :mod:`bbrlab.run.iperf` (server,
client, JSON) and :mod:`bbrlab.run.checks`; its parameters are :class:`bbrlab.scenario.workloads.IperfParams`.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path

from bbrlab.link.counters import LinkCounters
from bbrlab.scenario.scenario import Flow, Scenario
from bbrlab.scenario.workloads import IperfParams

from . import checks, iperf
from . import record as rec
from .runmeta import RunMetadata


class Iperf3:
    """iperf3's bulk transfer of ``flow.params.duration_s`` over ``flow.params.streams`` connections."""

    name = IperfParams.name

    def client_limit_s(self, flow: Flow) -> float:
        """How long the client may take, in seconds: the flow's duration plus a margin for connect and teardown."""
        return flow.params.duration_s + iperf.CLIENT_MARGIN_S

    def prepare(self, testbed, flow: Flow) -> None:
        """Nothing to prepare: iperf3 sends generated data."""
        return None

    def start(self, testbed, flow: Flow, prepared: None, *, lifetime_s: float,
              ready_timeout_s: float) -> AbstractContextManager[iperf.Server]:
        """An iperf3 server on the receiver, ready within ``ready_timeout_s`` and gone after ``lifetime_s``
        seconds.
        """
        return iperf.server(testbed.receiver.host, lifetime_s=lifetime_s, ready_timeout_s=ready_timeout_s,
                            cca=flow.cca)

    def wait(self, testbed, flow: Flow, endpoint: iperf.Server, ports: list[int]):
        """The iperf3 client on the sender, from local port ``ports[0]``, with the flow's CCA, duration and
        streams, until it ends.
        """
        return iperf.run_client(testbed.sender.host, testbed.receiver.experiment_ip, cca=flow.cca,
                                duration_s=flow.params.duration_s, streams=flow.params.streams, port=endpoint.port,
                                cport=ports[0])

    def result(self, flow: Flow, endpoint: iperf.Server, raw, out: Path, meta: RunMetadata) -> iperf.IperfResult:
        """Write ``iperf.json``, parse it (:func:`~bbrlab.run.checks.client_result`: the test ran as asked) and
        record iperf3's view of the run in ``meta``."""
        rec.write_file(out / "iperf.json", raw.stdout)
        parsed = checks.client_result(raw, flow.cca, flow.params.duration_s)
        meta.cca.iperf_sender = parsed.sender_tcp_congestion
        meta.iperf = parsed.summary()
        return parsed

    def check(self, flow: Flow, endpoint: iperf.Server, raw, parsed: iperf.IperfResult,
              ports: list[int]) -> list[int]:
        """The data streams used the ports they were bound to; those ports."""
        checks.data_ports(list(parsed.data_ports), ports)
        return list(parsed.data_ports)

    def check_link(self, scenario: Scenario, parsed: iperf.IperfResult, delta: LinkCounters) -> None:
        """The transfer did not stall where nothing explains it (:func:`~bbrlab.run.checks.not_stalled`)."""
        checks.not_stalled(parsed.intervals, scenario, delta)

    def measured_mbit(self, run_dir: Path, record: dict) -> float | None:
        """iperf3's receiver sum in the run's ``iperf.json``, in Mbit/s."""
        report = json.loads((run_dir / "iperf.json").read_text())
        value = (((report.get("end") or {}).get("sum_received") or {}).get("bits_per_second"))
        return value / 1e6 if value is not None else None
