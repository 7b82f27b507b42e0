"""Per-stream intervals and per-flow summaries of a run, from each flow's iperf3 JSON.

A run carries one or more *flows* (one iperf3 client each; a single-flow run is flow 0 from the sender),
and each flow one or more *streams* (``-P``). iperf3 reports, every interval, for every stream: on the
client (the sender, ``intervals[].streams[]``) the bytes written, retransmits, ``snd_cwnd``, ``rtt`` and
``rttvar``; on the server (``server_output_json``, asked with ``--get-server-output``) the bytes that
arrived. :func:`stream_rows` joins the two by the stream's port (the client's local port is the server's
remote port) and the interval's index, so a row holds the receiver's throughput next to the sender's
RTT and cwnd, on the receiver's interval times.

Times are seconds since the run's first flow started: a flow's interval times plus its start offset
(:class:`FlowReport.start_s`), so flows that start apart share one time axis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The ``streams`` table's columns, in order (their meaning: :data:`bbrlab.analysis.tables.STREAM_SCHEMA`).
STREAM_FIELDS = ("run_id", "flow", "stream", "port", "t_start_s", "t_end_s", "throughput_mbit",
                 "sender_throughput_mbit", "retransmits", "rtt_ms", "rttvar_ms", "cwnd_bytes")


@dataclass(frozen=True)
class FlowReport:
    """One flow of a run and its iperf3 JSON.

    ``index`` numbers the flows of the run from 0; ``origin`` is ``sender`` (the contended sender) or
    ``competitor`` (an uncontended sender on the sender's side of the bottleneck); ``start_s`` is when the
    flow started, in seconds after the run's first flow; ``duration_s`` its asked duration [s].
    """

    index: int
    origin: str
    cca: str | None
    streams: int | None
    start_s: float
    duration_s: float | None
    report: Mapping


def _num(v) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _mbit(bits_per_second) -> float | None:
    v = _num(bits_per_second)
    return v / 1e6 if v is not None else None


def _ms(us) -> float | None:
    v = _num(us)
    return v / 1000 if v is not None else None


def _rate_mbit(stream: Mapping, interval_sum: Mapping) -> float | None:
    """A stream's bytes over its interval's length (the ``sum``'s seconds, which every stream of the interval
    shares, so the streams add up to iperf3's sum exactly), in Mbit/s."""
    nbytes, seconds = _num(stream.get("bytes")), _num(interval_sum.get("seconds"))
    return nbytes * 8 / seconds / 1e6 if nbytes is not None and seconds else None


def _socket_ports(start: Mapping, *, local: bool) -> dict[int, int]:
    """``{socket: port}`` of the connected streams: the local port on the client, the remote one on the server."""
    key = "local_port" if local else "remote_port"
    return {c.get("socket"): c.get(key) for c in start.get("connected") or () if isinstance(c, Mapping)}


def _by_port(intervals, ports: dict[int, int]) -> list[tuple[Mapping, dict[int, Mapping]]]:
    """Each interval's ``sum`` and its streams keyed by the client's port."""
    out = []
    for interval in intervals or ():
        streams = {ports.get(s.get("socket")): s for s in interval.get("streams") or () if isinstance(s, Mapping)}
        out.append((interval.get("sum") or {}, streams))
    return out


def stream_rows(run_id: str, flow: FlowReport) -> list[tuple]:
    """One tuple per interval and stream (:data:`STREAM_FIELDS`), for every interval either side reported
    (the server's last, partial one included). Times are the server's interval (the client's when iperf3 ran
    without the server's output), shared by the interval's streams; ``throughput_mbit`` is the receiver's
    bytes, ``sender_throughput_mbit`` the bytes the sender wrote in the interval of the same index (each over
    its side's interval length); RTT and
    RTT variance in ms, cwnd in bytes."""
    report = flow.report
    ports = _socket_ports(report.get("start") or {}, local=True)
    server = report.get("server_output_json") or {}
    sent = _by_port(report.get("intervals"), ports)
    received = _by_port(server.get("intervals"), _socket_ports(server.get("start") or {}, local=False))
    order = {port: n for n, port in enumerate(sorted(p for p in ports.values() if p is not None))}
    rows = []
    for i in range(max(len(sent), len(received))):
        c_sum, c_streams = sent[i] if i < len(sent) else ({}, {})
        r_sum, r_streams = received[i] if i < len(received) else ({}, {})
        times = r_sum if received else c_sum
        t0, t1 = _num(times.get("start")), _num(times.get("end"))
        if t0 is None or t1 is None:
            continue
        for port, n in order.items():
            c, r = c_streams.get(port, {}), r_streams.get(port, {})
            if not c and not r:
                continue
            rows.append((run_id, flow.index, n, port, t0 + flow.start_s, t1 + flow.start_s,
                         _rate_mbit(r, r_sum), _rate_mbit(c, c_sum),
                         _num(c.get("retransmits")), _ms(c.get("rtt")), _ms(c.get("rttvar")), _num(c.get("snd_cwnd"))))
    return rows


def flow_summary(run_id: str, flow: FlowReport) -> dict:
    """The flow's row of the ``flows`` table without its fairness columns: what it was and iperf3's end
    summary (receiver and sender throughput, retransmits, mean RTT over its streams)."""
    end = flow.report.get("end") or {}
    rtts = [_num((s.get("sender") or {}).get("mean_rtt")) for s in end.get("streams") or ()]
    rtts = [r for r in rtts if r]
    return {"run_id": run_id, "flow": flow.index, "origin": flow.origin, "cca": flow.cca,
            "streams": flow.streams, "start_s": flow.start_s, "duration_s": flow.duration_s,
            "throughput_mbit": _mbit((end.get("sum_received") or {}).get("bits_per_second")),
            "sender_throughput_mbit": _mbit((end.get("sum_sent") or {}).get("bits_per_second")),
            "retransmits": _num((end.get("sum_sent") or {}).get("retransmits")),
            "mean_rtt_ms": sum(rtts) / len(rtts) / 1000 if rtts else None}
