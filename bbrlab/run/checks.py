"""What must hold for a run to be recorded as ``ok``: each check raises :class:`RunFailed` saying what did not.

Every check compares what was asked with what the kernel, iperf3 or the sampler report having done:
the congestion control that carried the data, the data streams' ports, the test's duration, the deadline
policy read back from the vCPU threads, the qdiscs read back from the emulator, and what netem dropped
against the loss configured.
"""

from __future__ import annotations

import json
import math

from bbrlab.core.errors import BbrlabError, RunFailed
from bbrlab.core.scenario import Flow, Link, Scenario
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling.ss import parse_ss_log

from . import iperf

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


def _sampler_summary(kind: str, text: str) -> dict:
    from bbrlab.sampling import sockdiag

    if kind != "ss":
        return sockdiag.summary(text)
    footer = sampling.parse_sampler_footer(text) or {}
    return {"kind": "ss", "samples": footer.get("samples"), "missed_ticks": None,
            "cpu_s": footer.get("cpu_s"), "cpu_per_sample_ms": footer.get("cpu_per_sample_ms"),
            "interval": sockdiag.interval_stats([round(t * 1e9) for t in sampling.sample_times(text)]),
            "ended": "stop_file" if footer else "killed (no footer)"}


def sample_rows(kind: str, text: str, ports) -> list[dict]:
    """The ss table's rows of a sampler log of ``kind`` (ss, netlink or bpf), data streams only."""
    from bbrlab.sampling import sockdiag

    if kind == "ss":
        return parse_ss_log(text, ports=ports)
    return sockdiag.rows(text, ports=ports)


def samples(sampled, data_ports: list[int], cca: str, interval_ms: float) -> dict:
    """The sampler saw the data connections (local ``data_ports``), under ``cca``; returns what the record
    keeps about sampling:
    the sampler (kind, binary and its SHA-256), the asked and achieved interval (median, p99, longest gap),
    samples, missed ticks, guest CPU per sample, and ``ss_seen`` (the CCAs seen on the data streams)."""
    try:
        rows = sample_rows(sampled.kind, sampled.text, data_ports)
        summary = _sampler_summary(sampled.kind, sampled.text)
    except BbrlabError as e:
        raise RunFailed(f"the {sampled.kind} sampler's samples: {e}") from None
    carrying = [r for r in rows if r["bytes_sent"] > IPERF_COOKIE_BYTES]
    seen = sorted({r["cca"] for r in carrying})
    out = {"kind": sampled.kind, "binary": sampled.binary, "asked_interval_ms": interval_ms, "rows": len(rows),
           "ss_seen": seen, **{k: v for k, v in summary.items() if k not in ("kind", "asked_interval_ms")}}
    if not carrying:
        raise RunFailed("the sampler saw no data connection carrying data")
    if seen != [cca]:
        raise RunFailed(f"the sampler saw congestion control {seen} on the data streams, asked for {cca!r}")
    return out


def contention_held(record: dict, scenario: Scenario) -> None:
    evidence = record.get("evidence") or {}
    if "error" in evidence:
        raise RunFailed(f"contention evidence missing: {evidence['error']}")
    stalls = (evidence.get("watch") or {}).get("stalls") or []
    if stalls:
        first = stalls[0]
        raise RunFailed(f"vCPU thread {first['tid']} stayed runnable without CPU for {first['stalled_s']} s under "
                        "SCHED_DEADLINE (the host kernel lost its replenishment; the reservation was restarted): "
                        f"the contention did not hold as configured ({len(stalls)} stall(s))")
    idle = [t["tid"] for t in evidence.get("threads", []) if t.get("got_cpu") is False]
    if idle:
        raise RunFailed(f"vCPU thread(s) {idle} got no CPU time during the run (their run time in "
                        "/proc/<tid>/schedstat did not grow): not the VM's vCPU threads, or the VM was stopped")
    if not evidence.get("policy_held", False):
        raise RunFailed(f"the deadline policy did not hold on the vCPU threads: {json.dumps(evidence)[:400]}")
    for thread in evidence.get("threads", []):
        after = (thread.get("policy_after") or {}).get("policy", "")
        if scenario.contention.unlimited == ("DEADLINE" in str(after)):
            raise RunFailed(f"vCPU thread {thread['tid']} ran under {after} for a "
                            f"{scenario.contention.cpu_share_pct} % share")


def qdiscs_as_asked(link_: Link, ports, qdiscs: dict) -> None:
    from bbrlab.link import emulator as link
    from bbrlab.link.qdisc import build_tree

    try:
        link.check_readback(build_tree(link_, tuple(ports)), qdiscs)
    except BbrlabError as e:
        raise RunFailed(f"the emulator's qdiscs after the run differ from the request: {e}") from None


def drops_as_configured(link_: Link, delta: dict) -> dict:
    """netem dropped what the configured loss explains, and nothing on the ACK port; returns the loss seen.

    With no loss configured netem must drop nothing (a drop would be its own queue overflowing, which
    no router of the scenario does). With uniform loss ``p`` over ``n`` packets the observed fraction
    must lie within :data:`LOSS_SIGMAS` binomial standard deviations of ``p``.

    In the authors' tree (``link_.queue == "authors"``) netem's queue IS the bottleneck: its overflow drops
    are the bottleneck's and cannot be told from its loss, so drops are allowed without loss configured,
    and with loss only a fraction clearly below ``p`` fails the run (:func:`bbrlab.link.emulator.loss_observed`).
    """
    from bbrlab.link.emulator import loss_observed

    seen = loss_observed(delta, link_.queue)
    ack_drops = sum(c.get("drops", 0) for c in delta.get("ack", {}).values())
    if ack_drops:
        raise RunFailed(f"the emulator dropped {ack_drops} packet(s) on the ACK port, where no loss is configured")
    configured = link_.effective_loss_pct / 100
    n, dropped = seen["entered"] or 0, seen["netem_dropped"]
    overflow_counts = link_.queue == "authors"
    if link_.loss_model == "none" and dropped and not overflow_counts:
        raise RunFailed(f"netem dropped {dropped} of {n} packets with no loss configured (its queue overflowed?)")
    if link_.loss_model == "uniform" and n >= LOSS_MIN_PACKETS:
        sigma = math.sqrt(configured * (1 - configured) / n)
        off = seen["fraction"] - configured
        if (-off if overflow_counts else abs(off)) > LOSS_SIGMAS * sigma:
            raise RunFailed(f"netem dropped {100 * seen['fraction']:.3f} % of {n} packets, configured "
                            f"{100 * configured:g} % (more than {LOSS_SIGMAS:g} standard deviations "
                            f"{'below' if overflow_counts else 'apart'})")
    return {**seen, "configured_fraction": configured}
