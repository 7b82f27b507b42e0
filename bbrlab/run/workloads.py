"""What a run's flow carries from the sender to the receiver: a workload, chosen by ``flow.workload``.

Every workload has the same shape, so the run recipe (:mod:`bbrlab.run.runner`) reads the same for each:

- :meth:`~Workload.prepare` once per run before the link is set (rsync: the sender's cached file);
- :meth:`~Workload.server`, a context manager for the receiver's side during the transfer (iperf3's
  server; rsync's sshd), yielding an endpoint with the ``port`` the data connection goes to and the
  ``account`` the receiving end runs as (:class:`bbrlab.run.rxuser.RxUser`);
- :meth:`~Workload.run_client` on the sender, the only step under CPU contention;
- :meth:`~Workload.verify`: the result parsed, its files written, the record's metadata filled and the
  workload's checks run (raising :class:`~bbrlab.core.errors.RunFailed`); returns the data connections' local
  ports, for the socket sampler's check.

:func:`for_flow` picks the workload. ``iperf3`` is here; ``rsync`` is :class:`bbrlab.run.transfer.Rsync`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from bbrlab.core.scenario import Flow

from . import checks, iperf
from . import record as rec
from .runmeta import RunMetadata
from .transfer import Rsync


class Workload(Protocol):
    """The steps of one workload (see the module docstring)."""

    name: str

    def client_limit_s(self, flow: Flow) -> float:
        """Seconds the client may take at most (the server and the sampler outlive it by a margin)."""

    def prepare(self, testbed, flow: Flow) -> object:
        """What must exist before the run (outside the timed transfer); passed on to :meth:`server`."""

    def server(self, testbed, flow: Flow, prepared: object, *, lifetime_s: float,
               ready_timeout_s: float) -> AbstractContextManager:
        """The receiver's side, ready when the block starts and gone when it ends."""

    def run_client(self, testbed, flow: Flow, endpoint, ports: list[int]) -> object:
        """The transfer, on the sender, from the local ``ports``; its raw result, whatever happened."""

    def verify(self, flow: Flow, endpoint, result, ports: list[int], out: Path, meta: RunMetadata) -> list[int]:
        """Write the result's files into ``out``, fill ``meta``, check; the data connections' local ports."""


class Iperf3:
    """iperf3's bulk transfer of ``flow.duration_s`` over ``flow.streams`` connections (the paper's load)."""

    name = "iperf3"

    def client_limit_s(self, flow: Flow) -> float:
        """How long the client may take, in seconds: the flow's duration plus a margin for connect and teardown."""
        return flow.duration_s + iperf.CLIENT_MARGIN_S

    def prepare(self, testbed, flow: Flow) -> None:
        """Nothing to prepare: iperf3 sends generated data."""
        return None

    def server(self, testbed, flow: Flow, prepared: None, *, lifetime_s: float,
               ready_timeout_s: float) -> AbstractContextManager[iperf.Server]:
        """An iperf3 server on the receiver, ready within ``ready_timeout_s`` and gone after ``lifetime_s``
        seconds.
        """
        return iperf.server(testbed.receiver.host, lifetime_s=lifetime_s, ready_timeout_s=ready_timeout_s,
                            cca=flow.cca)

    def run_client(self, testbed, flow: Flow, endpoint: iperf.Server, ports: list[int]):
        """The iperf3 client on the sender, from local port ``ports[0]``, with the flow's CCA, duration and
        streams.
        """
        return iperf.run_client(testbed.sender.host, testbed.receiver.experiment_ip, cca=flow.cca,
                                duration_s=flow.duration_s, streams=flow.streams, port=endpoint.port, cport=ports[0])

    def verify(self, flow: Flow, endpoint: iperf.Server, result, ports: list[int], out: Path,
               meta: RunMetadata) -> list[int]:
        """Write ``iperf.json``, record iperf3's view of the run in ``meta``, check it; the data connections'
        local ports.
        """
        rec.write_file(out / "iperf.json", result.stdout)
        parsed = checks.client_result(result, flow)
        meta.cca.iperf_sender = parsed.sender_tcp_congestion
        meta.iperf = {k: v for k, v in parsed.to_dict().items() if k != "intervals"}
        checks.data_ports(list(parsed.data_ports), ports)
        return list(parsed.data_ports)


def for_flow(flow: Flow) -> Workload:
    """The workload ``flow.workload`` names (validated by :class:`~bbrlab.core.scenario.Flow`)."""
    if flow.workload == "rsync":
        return Rsync()
    return Iperf3()
