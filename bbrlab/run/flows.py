"""The flows beside a run's own (``Scenario.flows``): their senders, servers, clients and records.

Flow 0 is the scenario's flow, run by the recipe (:mod:`bbrlab.run.runner`) as always. Each extra flow gets
an iperf3 server of its own on the receiver (port :data:`~bbrlab.run.iperf.DEFAULT_PORT` + its index) and a
client that starts ``start_s`` after flow 0's client was launched, in a thread of its own with an SSH
connection of its own, from its origin:

- ``sender``: the contended sender VM (its flows share the VM's contention with flow 0);
- ``competitor``: on the local testbed, a network namespace on this machine bridged to the sender's side
  of the emulator (:func:`bbrlab.testbed.local.plumbing.ensure_competitor`; the host's kernel, not
  contended). A lab's testbed has no competitor: such a scenario is refused before anything changes.

Every client runs inside the contended block and is waited for there; each flow's JSON is written as
``iperf-flow<N>.json`` and described in the record's ``metadata.flows`` (docs/run-record.md), with the
start measured on this machine (seconds after flow 0's client was launched).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core.errors import RunFailed, ValidationError
from bbrlab.core.hosts import Host, NetnsHost
from bbrlab.scenario.competition import ExtraFlow
from bbrlab.testbed.local import plumbing

from . import checks, iperf
from . import record as rec
from .flowrecord import FlowOutcome

#: The experiment subnet's prefix on the local testbed (as ``bbrlab.testbed.local.lifecycle.SUBNET_PREFIX``).
SUBNET_PREFIX = 24


@dataclass
class ExtraRun:
    """One extra flow during a run: where it runs, its ports, and what became of it."""

    index: int
    flow: ExtraFlow
    host: Host
    ports: list[int]
    server_port: int = 0
    launched_s: float | None = None
    result: object = None
    error: BaseException | None = None


def check_origins(testbed, flows: tuple[ExtraFlow, ...]) -> None:
    """Refuse competitor flows on a testbed that has no competitor (a lab's), naming the flow."""
    for i, f in enumerate(flows, start=1):
        if f.origin == "competitor" and testbed.kind != "local":
            raise ValidationError(f"flows[{i}].origin", f.origin, "sender on a lab's testbed (only the local "
                                  "testbed has a competitor sender: docs/competition.md)")


def flow_ports(base_ports: list[int], index: int, streams: int) -> list[int]:
    """Flow ``index``'s local ports: a block of 128 above flow 0's, wrapped within 20000..31519."""
    base = 20_000 + (base_ports[0] - 20_000 + 128 * index) % (90 * 128)
    return list(range(base, base + streams))


def prepare(testbed, flows: tuple[ExtraFlow, ...], base_ports: list[int]) -> list[ExtraRun]:
    """One :class:`ExtraRun` per flow, each with a host of its own (its own SSH connection for the sender;
    the competitor's namespace, made if missing)."""
    check_origins(testbed, flows)
    out = []
    for i, f in enumerate(flows, start=1):
        if f.origin == "competitor":
            host: Host = NetnsHost(name="competitor", netns=plumbing.ensure_competitor(testbed.name, SUBNET_PREFIX))
            offered = host.output(["cat", "/proc/sys/net/ipv4/tcp_available_congestion_control"], timeout=10).split()
            if f.cca not in offered:
                raise RunFailed(f"flow {i}: the competitor (this machine's kernel) offers {offered}, not {f.cca!r}")
        else:
            host = dataclasses.replace(testbed.sender.host)
        out.append(ExtraRun(i, f, host, flow_ports(base_ports, i, f.streams)))
    return out


def servers(stack: ExitStack, testbed, runs: list[ExtraRun], *, lifetime_s: float, ready_timeout_s: float) -> None:
    """An iperf3 server per extra flow on the receiver, held by ``stack``."""
    for r in runs:
        server = stack.enter_context(iperf.server(testbed.receiver.host, port=iperf.DEFAULT_PORT + r.index,
                                                  lifetime_s=lifetime_s, ready_timeout_s=ready_timeout_s,
                                                  cca=r.flow.cca))
        r.server_port = server.port


def _client(r: ExtraRun, receiver_ip: str, t0: float) -> None:
    try:
        time.sleep(max(0.0, t0 + r.flow.start_s - time.monotonic()))
        r.launched_s = round(time.monotonic() - t0, 3)
        r.result = iperf.run_client(r.host, receiver_ip, cca=r.flow.cca, duration_s=r.flow.duration_s,
                                    streams=r.flow.streams, port=r.server_port, cport=r.ports[0])
    except BaseException as e:  # noqa: BLE001 - handed to the run's thread, which raises it
        r.error = e


def start(runs: list[ExtraRun], receiver_ip: str, t0: float) -> list[threading.Thread]:
    """Start each extra flow's client thread; each launches its client ``start_s`` after ``t0``."""
    threads = [threading.Thread(target=_client, args=(r, receiver_ip, t0), daemon=True, name=f"flow{r.index}")
               for r in runs]
    for t in threads:
        t.start()
    return threads


def wait(threads: list[threading.Thread], runs: list[ExtraRun]) -> None:
    """Wait for every client (each bounded by its own command timeout)."""
    for t, r in zip(threads, runs, strict=True):
        t.join(r.flow.start_s + r.flow.duration_s + iperf.CLIENT_MARGIN_S + 60)
        if t.is_alive():
            raise RunFailed(f"flow {r.index}'s iperf3 client did not end in time")


def verify(runs: list[ExtraRun], out: Path) -> list[FlowOutcome]:
    """Write each flow's ``iperf-flow<N>.json``, check it (its CCA, duration and ports); the records'
    ``metadata.flows``."""
    described = []
    for r in runs:
        if r.error is not None:
            raise RunFailed(f"flow {r.index} ({r.flow.cca} from the {r.flow.origin}): {r.error}") from r.error
        name = f"iperf-flow{r.index}.json"
        rec.write_file(out / name, r.result.stdout)
        parsed = checks.client_result(r.result, r.flow.cca, r.flow.duration_s)
        checks.data_ports(list(parsed.data_ports), r.ports, f"flow {r.index}'s data streams")
        described.append(FlowOutcome(r.index, r.flow.cca, r.flow.streams, r.launched_s, r.flow.duration_s,
                                     r.flow.origin, r.flow.start_s, name, r.server_port, list(r.ports),
                                     parsed.sender_tcp_congestion, parsed.receiver_mbit))
    return described


def close(runs: list[ExtraRun]) -> None:
    """Close the extra flows' own SSH connections."""
    for r in runs:
        r.host.close()
