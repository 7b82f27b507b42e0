"""What must hold for a run to be recorded as ``ok``: each check raises :class:`RunFailed` saying what did not.

Every check compares what was asked with what the kernel, iperf3 or the sampler report having done:
the congestion control that carried the data, the data streams' ports, the test's duration, the deadline
policy read back from the vCPU threads, the qdiscs read back from the emulator, and what netem dropped
against the loss configured.
"""

from __future__ import annotations

import json
import math

from . import iperf, sampling
from .errors import BbrlabError, RunFailed
from .scenario import Flow, Link, Scenario

#: Standard deviations a run's observed netem loss may differ from the configured one (binomial): far
#: enough that a correct run fails about once in a million, near enough that a loss that did not apply
#: (or applied twice) is caught.
LOSS_SIGMAS = 5.0
#: Below this many packets the loss is recorded but not judged.
LOSS_MIN_PACKETS = 200


def cca_offered(cca: str, available: tuple[str, ...]) -> None:
    if cca not in available:
        raise RunFailed(f"the sender offers {list(available)}, not {cca!r}")


def client_result(result, flow: Flow) -> iperf.IperfResult:
    """The client's JSON parsed; the test ran for the asked duration with the asked CCA."""
    if not result.stdout.strip():
        raise RunFailed(f"iperf3 client printed nothing (exit {result.exit_code}): {result.stderr.strip()[:300]}")
    parsed = iperf.parse_result(result.stdout)
    if result.exit_code != 0:
        raise RunFailed(f"iperf3 client exit code {result.exit_code}")
    if parsed.sender_tcp_congestion != flow.cca:
        raise RunFailed(f"iperf3 reports sender_tcp_congestion {parsed.sender_tcp_congestion!r}, asked for {flow.cca!r}")
    if not math.isclose(parsed.duration_s, flow.duration_s):
        raise RunFailed(f"iperf3 ran a {parsed.duration_s:g} s test, the scenario asked for {flow.duration_s:g} s")
    return parsed


def data_ports(parsed: iperf.IperfResult, ports: list[int]) -> None:
    if sorted(parsed.data_ports) != ports:
        raise RunFailed(f"iperf3's data streams used local ports {list(parsed.data_ports)}, expected {ports}")


def samples(text: str, parsed: iperf.IperfResult, cca: str) -> dict:
    """The sampler saw the data streams, under ``cca``; returns what the record keeps about sampling."""
    rows = sampling.parse_ss_log(text, ports=parsed.data_ports)
    seen = sorted({r["cca"] for r in rows})
    summary = {"rows": len(rows), "ss_seen": seen, "footer": sampling.parse_sampler_footer(text),
               "interval": sampling.achieved_interval_ms(text)}
    if not rows:
        raise RunFailed("the sampler saw no data connection")
    if seen != [cca]:
        raise RunFailed(f"the sampler saw congestion control {seen} on the data streams, asked for {cca!r}")
    return summary


def contention_held(record: dict, scenario: Scenario) -> None:
    evidence = record.get("evidence") or {}
    if "error" in evidence:
        raise RunFailed(f"contention evidence missing: {evidence['error']}")
    if not evidence.get("policy_held", False):
        raise RunFailed(f"the deadline policy did not hold on the vCPU threads: {json.dumps(evidence)[:400]}")
    for thread in evidence.get("threads", []):
        after = (thread.get("policy_after") or {}).get("policy", "")
        if scenario.contention.unlimited == ("DEADLINE" in str(after)):
            raise RunFailed(f"vCPU thread {thread['tid']} ran under {after} for a "
                            f"{scenario.contention.cpu_share_pct} % share")


def qdiscs_as_asked(link_: Link, ports, qdiscs: dict) -> None:
    from . import link
    from .qdisc import build_tree

    try:
        link.check_readback(build_tree(link_, tuple(ports)), qdiscs)
    except BbrlabError as e:
        raise RunFailed(f"the emulator's qdiscs after the run differ from the request: {e}") from None


def drops_as_configured(link_: Link, delta: dict) -> dict:
    """netem dropped what the configured loss explains, and nothing on the ACK port; returns the loss seen.

    With no loss configured netem must drop nothing (a drop would be its own queue overflowing, which
    no router of the scenario does). With uniform loss ``p`` over ``n`` packets the observed fraction
    must lie within :data:`LOSS_SIGMAS` binomial standard deviations of ``p``.
    """
    from .link import loss_observed

    seen = loss_observed(delta)
    ack_drops = sum(c.get("drops", 0) for c in delta.get("ack", {}).values())
    if ack_drops:
        raise RunFailed(f"the emulator dropped {ack_drops} packet(s) on the ACK port, where no loss is configured")
    configured = link_.effective_loss_pct / 100
    n, dropped = seen["entered"] or 0, seen["netem_dropped"]
    if link_.loss_model == "none" and dropped:
        raise RunFailed(f"netem dropped {dropped} of {n} packets with no loss configured (its queue overflowed?)")
    if link_.loss_model == "uniform" and n >= LOSS_MIN_PACKETS:
        sigma = math.sqrt(configured * (1 - configured) / n)
        if abs(seen["fraction"] - configured) > LOSS_SIGMAS * sigma:
            raise RunFailed(f"netem dropped {100 * seen['fraction']:.3f} % of {n} packets, configured "
                            f"{100 * configured:g} % (more than {LOSS_SIGMAS:g} standard deviations apart)")
    return {**seen, "configured_fraction": configured}
