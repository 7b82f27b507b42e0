"""The paper's set-up validation of the emulated link: configured versus measured.

Three measurements from the sender to the receiver, through the emulator, with no CPU contention:

1. **RTT**: ``ping`` (200 echoes, 10 ms apart by default); the median reply time is compared with the
   configured RTT (the minimum, mean and maximum are reported too).
2. **UDP**: after a one-second warm-up (discarded), iperf3 sends :data:`UDP_OVERDRIVE` times the configured
   rate, counted in frames on the wire, for a few seconds. The bucket, not the sender's pacing, is then the
   limit: its queue stays full, so a sender that sends in bursts (a TCG guest does) cannot leave it idle, and
   what the receiver gets is what the bucket lets through. ``measured`` is that rate in frames on the wire
   (payload + UDP/IP/Ethernet headers: what tbf meters; ``goodput_mbit`` is iperf3's payload). The datagrams
   lost are accounted for from the emulator's counters: dropped by the bottleneck's queue (expected, since it
   is overdriven), dropped by netem, and lost anywhere else (``lost_elsewhere``: the sender, the taps, the
   receiver's socket). A rate below the configured one means the emulator could not keep its rate (it lost
   tokens while it waited for the CPU), which is the link's fault and fails the check.

   Sending at exactly the rate, as earlier versions did, judged the sender's burstiness and a cold start
   instead: a burst overflows a 1 BDP queue, the queue then runs empty while the sender waits, and a third
   of the validations right after ``link set`` on a quiet machine lost 13-18 % of their datagrams, all of
   them at tbf (docs/link.md has the numbers).
3. **TCP**: one bulk iperf3 transfer (cubic by default), its goodput at the receiver.

With loss configured, a fourth run counts loss over ``loss_packets`` UDP datagrams sent at half the
rate, so that only netem drops them (the bucket has room).

Each entry is ``{"configured": x, "measured": y, ...}`` plus ``"ok"`` against the tolerances below,
which are the project's done-when criteria.
"""

from __future__ import annotations

import re
import statistics

from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.link.emulator import show
from bbrlab.scenario.scenario import Link

from . import iperf

RTT_TOLERANCE_PCT = 10.0
UDP_TOLERANCE_PCT = 5.0
#: TCP reaching 90 % of the rate through one bottleneck without contention.
TCP_MIN_FRACTION = 0.90
UDP_PAYLOAD_BYTES = 1448
#: UDP (8) + IPv4 (20) + Ethernet header (14): what tbf counts beyond iperf3's payload.
UDP_FRAME_OVERHEAD_BYTES = 42
VALIDATE_PORT = 5211
#: The UDP test sends this many times the configured rate (in frames on the wire), so the bucket is the limit.
UDP_OVERDRIVE = 1.10
UDP_WARMUP_S = 1.0

_PING_TIME = re.compile(r"\btime[=<]([0-9.]+) ms")


def check_uncontended(testbed) -> None:
    """Raise :class:`TestbedError` when the sender's vCPU threads are under a deadline policy."""
    from bbrlab.contention.deadline import show_policies

    threads = testbed.sender.vcpu_threads()
    held = [tid for tid, p in show_policies(testbed.sender.hypervisor, threads).items() if p.is_deadline]
    if held:
        raise TestbedError(f"the sender's vCPU thread(s) {held} run under SCHED_DEADLINE: validating the link "
                           f"now would measure the contention, not the link (bbrlab contention clear first)")


def ping_rtts_ms(sender: Host, target_ip: str, *, count: int, interval_s: float) -> tuple[list[float], int]:
    """Reply times in ms of ``count`` pings from ``sender`` (one per reply line), and how many were sent."""
    argv = ["ping", "-n", "-c", str(count), "-i", f"{interval_s:g}", "-W", "2", target_ip]
    res = sender.run(argv, check=False, timeout=count * interval_s + 30)
    rtts = [float(m.group(1)) for m in _PING_TIME.finditer(res.stdout)]
    if not rtts:
        raise TestbedError(f"no ping replies from {target_ip} via {sender.name}: {res.stdout[-300:]} {res.stderr[-300:]}")
    return rtts, count


def _within(measured: float, configured: float, tolerance_pct: float) -> bool:
    return abs(measured - configured) <= configured * tolerance_pct / 100


def measure_rtt(testbed, link: Link, *, count: int = 200, interval_s: float = 0.01) -> dict:
    """Ping RTT from the sender to the receiver through the emulator against the configured RTT: the median reply time (ms), with min, mean and max."""
    rtts, sent = ping_rtts_ms(testbed.sender.host, testbed.receiver.experiment_ip, count=count, interval_s=interval_s)
    median = statistics.median(rtts)
    return {"configured": link.rtt_ms, "measured": round(median, 3), "min": min(rtts),
            "mean": round(statistics.fmean(rtts), 3), "max": max(rtts), "pings": sent,
            "replies": len(rtts), "tolerance_pct": RTT_TOLERANCE_PCT,
            "ok": _within(median, link.rtt_ms, RTT_TOLERANCE_PCT)}


def _udp_client_argv(server_ip: str, port: int, rate_bit: int, *, duration_s: float | None = None,
                     packets: int | None = None) -> list[str]:
    """iperf3 UDP at ``rate_bit`` payload bits/s for a duration or a datagram count."""
    amount = ["-t", f"{duration_s:g}"] if packets is None else ["-k", str(packets)]
    return ["timeout", "--kill-after=5", "120", "iperf3", "-c", server_ip, "-p", str(port), "-u",
            "-b", str(rate_bit), "-l", str(UDP_PAYLOAD_BYTES), *amount, "-J", "--get-server-output"]


def _with_server(testbed, client_argv: list[str], port: int, cca: str | None = None) -> str:
    """Run one iperf3 test: server (one-off) on the receiver, client on the sender; the client's JSON text.
    ``cca``: the congestion control the client sets (the server, unprivileged, may need a capability for it)."""
    with iperf.server(testbed.receiver.host, port=port, lifetime_s=180, cca=cca):
        res = testbed.sender.host.run(client_argv, check=False, timeout=180)
    return res.stdout or res.stderr


def _udp_counts(data: dict) -> tuple[int, int, float]:
    """(datagrams the client sent, datagrams the server received, seconds the server measured).

    The sender's count is the denominator: a datagram lost at the very end leaves no gap in the
    sequence numbers, so the server's own ``packets`` can be one short.
    """
    sent = int(data["end"]["sum_sent"]["packets"])
    rx = data["end"]["sum_received"]
    received = int(rx["packets"]) - int(rx["lost_packets"])
    return sent, received, float(rx["seconds"])


def _payload_bit(wire_bit: float) -> int:
    """iperf3's ``-b`` (payload bits/s) that puts ``wire_bit`` bits/s of full UDP frames on the wire."""
    return int(round(wire_bit * UDP_PAYLOAD_BYTES / (UDP_PAYLOAD_BYTES + UDP_FRAME_OVERHEAD_BYTES)))


def _data_port_drops(testbed) -> dict[str, int]:
    """The drops counted so far on the emulator's data port (the receiver side): ``all`` (its root qdisc's, which
    include its child's) and ``bottleneck`` (the queue in force's: tbf's in bbrlab's tree and on a bare token
    bucket, netem's in the authors' tree, where tbf's limit is not in force)."""
    qdiscs = show(testbed.emulator.host, testbed.emulator.ports)[testbed.emulator.ports[1]]
    drops = {q.get("kind"): int(q.get("drops") or 0) for q in qdiscs}
    root = next((q for q in qdiscs if q.get("root")), None)
    authors = root is not None and root.get("kind") == "tbf" and "netem" in drops
    return {"all": int(root.get("drops") or 0) if root else 0, "bottleneck": drops.get("netem" if authors else "tbf", 0)}


def measure_udp(testbed, link: Link, *, duration_s: float = 5.0, port: int = VALIDATE_PORT) -> dict:
    """The rate the bottleneck delivers, overdriven by UDP (see the module docstring), and where the datagrams
    that did not arrive were lost."""
    wire_bit = link.rate_mbit * 1e6
    warmup = _udp_client_argv(testbed.receiver.experiment_ip, port, _payload_bit(wire_bit), duration_s=UDP_WARMUP_S)
    _with_server(testbed, warmup, port)  # ARP, the emulator's first packets after idle: not measured
    before = _data_port_drops(testbed)
    argv = _udp_client_argv(testbed.receiver.experiment_ip, port, _payload_bit(wire_bit * UDP_OVERDRIVE),
                            duration_s=duration_s)
    data = iperf.parse_json(_with_server(testbed, argv, port))
    after = _data_port_drops(testbed)
    sent, got, seconds = _udp_counts(data)
    goodput = got * UDP_PAYLOAD_BYTES * 8 / seconds / 1e6
    wire = got * (UDP_PAYLOAD_BYTES + UDP_FRAME_OVERHEAD_BYTES) * 8 / seconds / 1e6
    dropped = {k: after[k] - before[k] for k in after}
    return {"configured": link.rate_mbit, "measured": round(wire, 3), "goodput_mbit": round(goodput, 3),
            "sent_mbit": round(float(data["end"]["sum_sent"]["bits_per_second"]) / 1e6, 3),
            "overdrive": UDP_OVERDRIVE, "sent_datagrams": sent, "lost_pct": round(100 * (sent - got) / sent, 3) if sent else None,
            "dropped_at_bottleneck": dropped["bottleneck"], "dropped_by_emulator": dropped["all"],
            "lost_elsewhere": sent - got - dropped["all"],
            "seconds": seconds, "tolerance_pct": UDP_TOLERANCE_PCT,
            "ok": _within(wire, link.rate_mbit, UDP_TOLERANCE_PCT)}


def measure_loss(testbed, link: Link, *, packets: int = 10_000, port: int = VALIDATE_PORT) -> dict:
    """Loss over ``packets`` datagrams at half the rate: only netem drops them."""
    rate_bit = int(round(link.rate_mbit * 1e6 / 2))
    argv = _udp_client_argv(testbed.receiver.experiment_ip, port, rate_bit, packets=packets)
    data = iperf.parse_json(_with_server(testbed, argv, port))
    total, received, _ = _udp_counts(data)
    lost = total - received
    measured = 100 * lost / total if total else float("nan")
    # Three binomial standard deviations (and at least 0.1 point) around the configured loss.
    p = link.effective_loss_pct / 100
    band_pct = max(300 * (p * (1 - p) / max(total, 1)) ** 0.5, 0.1)
    return {"configured": link.effective_loss_pct, "measured": round(measured, 3), "packets": total,
            "lost": lost, "band_pct": round(band_pct, 3),
            "ok": abs(measured - link.effective_loss_pct) <= band_pct}


def measure_tcp(testbed, link: Link, *, duration_s: float = 5.0, cca: str = "cubic",
                port: int = VALIDATE_PORT) -> dict:
    """One TCP bulk transfer (``cca``, ``duration_s``) through the link: the receiver's goodput against the configured rate."""
    argv = iperf.client_argv(testbed.receiver.experiment_ip, cca=cca, duration_s=duration_s, port=port)
    result = iperf.parse_result(_with_server(testbed, argv, port, cca))
    return {"configured": link.rate_mbit, "measured": round(result.receiver_mbit, 3), "cca": cca,
            "used_cca": result.sender_tcp_congestion, "retransmits": result.retransmits,
            "min_fraction": TCP_MIN_FRACTION, "ok": result.receiver_mbit >= TCP_MIN_FRACTION * link.rate_mbit}


def validate(testbed, link: Link, *, pings: int = 200, ping_interval_s: float = 0.01, udp_s: float = 5.0,
             tcp_s: float = 5.0, loss_packets: int = 10_000, cca: str = "cubic") -> dict:
    """Measure the link that is set on ``testbed`` and compare with ``link`` (see the module docstring).

    The caller holds the testbed lock; the link must already be set (:func:`bbrlab.link.emulator.set`). Refused
    while any vCPU thread of the sender runs under SCHED_DEADLINE: the numbers would describe the
    contention, not the link.
    """
    if not link.shaped:
        raise ValidationError("link.rate_mbit", None, "a rate: validate measures the link against its rate "
                              "(what an unshaped path carries is measured by bbrlab calibrate)")
    check_uncontended(testbed)
    out = {"rtt_ms": measure_rtt(testbed, link, count=pings, interval_s=ping_interval_s),
           "udp_mbit": measure_udp(testbed, link, duration_s=udp_s)}
    if link.effective_loss_pct > 0:
        out["loss_pct"] = measure_loss(testbed, link, packets=loss_packets)
    out["tcp_mbit"] = measure_tcp(testbed, link, duration_s=tcp_s, cca=cca)
    return out
