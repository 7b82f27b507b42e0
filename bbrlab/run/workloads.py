"""What a run's flow carries from the sender to the receiver: a workload, found by ``flow.workload``.

Every workload has the same steps, so the run recipe (:mod:`bbrlab.run.runner`) reads the same for each:

- :meth:`~Workload.prepare` once per run before the link is set (rsync: the sender's cached file);
- :meth:`~Workload.start`, a context manager for the receiver's side during the transfer (iperf3's
  server; rsync's sshd), yielding an endpoint with the ``port`` the data connection goes to and the
  ``account`` the receiving end runs as (:class:`bbrlab.run.rxuser.RxUser`);
- :meth:`~Workload.wait` on the sender: the transfer, run until it ends; the only step under CPU contention;
- :meth:`~Workload.result`: the transfer's outcome parsed, its files written and the record's metadata
  filled (raising :class:`~bbrlab.core.errors.RunFailed` when there is no usable outcome);
- :meth:`~Workload.check`: the workload's checks (raising :class:`~bbrlab.core.errors.RunFailed`); returns the
  data connections' local ports, for the socket sampler's check; :meth:`~Workload.check_link` the checks that
  need the emulator's counters, read after the run's other checks;
- :meth:`~Workload.measured_mbit`: what a committed run measured (:mod:`bbrlab.campaign.repetitions`).

:data:`REGISTRY` holds one workload per name, each from its own module (``iperf3``:
:mod:`bbrlab.run.iperf_workload`, ``rsync``: :mod:`bbrlab.run.transfer`), keyed as the parameters types of
:data:`bbrlab.scenario.workloads.PARAMS` are.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from bbrlab.link.counters import LinkCounters
from bbrlab.scenario.scenario import Flow, Scenario

from .iperf_workload import Iperf3
from .runmeta import RunMetadata
from .transfer import Rsync


class Workload(Protocol):
    """The steps of one workload (see the module docstring)."""

    name: str

    def client_limit_s(self, flow: Flow) -> float:
        """Seconds the client may take at most (the server and the sampler outlive it by a margin)."""

    def prepare(self, testbed, flow: Flow) -> object:
        """What must exist before the run (outside the timed transfer); passed on to :meth:`start`."""

    def start(self, testbed, flow: Flow, prepared: object, *, lifetime_s: float,
              ready_timeout_s: float) -> AbstractContextManager:
        """The receiver's side, ready when the block starts and gone when it ends."""

    def wait(self, testbed, flow: Flow, endpoint, ports: list[int]) -> object:
        """The transfer, on the sender, from the local ``ports``, until it ends; its raw outcome, whatever happened."""

    def result(self, flow: Flow, endpoint, raw, out: Path, meta: RunMetadata) -> object:
        """The raw outcome parsed, its files written into ``out`` and ``meta`` filled; the parsed result."""

    def check(self, flow: Flow, endpoint, raw, parsed, ports: list[int]) -> list[int]:
        """What must hold of the transfer for the run to be ok; the data connections' local ports."""

    def check_link(self, scenario: Scenario, parsed, delta: LinkCounters) -> None:
        """What must hold of the transfer given the emulator's counters over the run (``delta``)."""

    def measured_mbit(self, run_dir: Path, record: dict) -> float | None:
        """The throughput a committed run in ``run_dir`` measured, in Mbit/s (None: none); may raise on a bad file."""


#: Each workload by its name (the names of :data:`bbrlab.scenario.workloads.PARAMS`).
REGISTRY: dict[str, Workload] = {w.name: w for w in (Iperf3(), Rsync())}


def for_flow(flow: Flow) -> Workload:
    """The workload ``flow.workload`` names (its parameters validated by :class:`~bbrlab.scenario.scenario.Flow`)."""
    return REGISTRY[flow.workload]
