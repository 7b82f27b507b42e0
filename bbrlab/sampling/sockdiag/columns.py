"""The ss table's columns from the kernel's own numbers, shared by both samplers' parsers.

:func:`tcp_columns` takes ``struct tcp_info``'s fields (names without ``tcpi_``, as
:func:`bbrlab.sampling.sockdiag.structs.decode_tcp_info` gives them) and returns the keys, units and omissions of
:func:`bbrlab.sampling.ss.parse_ss_log` (a field ss does not print is None; the counters it omits when zero
are 0). :func:`bbr_columns` does the same for BBR's info; inflight and BBR's BDP are added by
:func:`bbrlab.sampling.inflight.derive_inflight`, where they are defined.
"""

from __future__ import annotations

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF


def _ms(us: int | None) -> float | None:
    return us / 1000 if us else None


def _mbit(bytes_per_s: int | None) -> float | None:
    return bytes_per_s * 8 / 1e6 if bytes_per_s and bytes_per_s != U64_MAX else None


def tcp_columns(info: dict) -> dict:
    """tcp_info -> the ss parser's column names and units (None where ss prints nothing, or where the
    sampler did not have the field)."""
    rtt_us, mss, cwnd = info.get("rtt", 0), info.get("snd_mss", 0), info.get("snd_cwnd", 0)
    ssthresh = info.get("snd_ssthresh")
    min_rtt = info.get("min_rtt")
    rto = info.get("rto")
    return {
        "rto_ms": _ms(rto) if rto != 3_000_000 else None,
        "rtt_ms": _ms(rtt_us),
        "rttvar_ms": info["rttvar"] / 1000 if rtt_us and "rttvar" in info else None,
        "ato_ms": _ms(info.get("ato")),
        "mss": mss or None,
        "pmtu": info.get("pmtu"),
        "rcvmss": info.get("rcv_mss"),
        "advmss": info.get("advmss"),
        "cwnd": cwnd or None,
        "ssthresh": ssthresh if ssthresh is not None and ssthresh < 0xFFFF else None,
        "bytes_sent": info.get("bytes_sent", 0),
        "bytes_retrans": info.get("bytes_retrans", 0),
        "bytes_acked": info.get("bytes_acked", 0),
        "bytes_received": info.get("bytes_received"),
        "segs_out": info.get("segs_out"),
        "segs_in": info.get("segs_in"),
        "data_segs_out": info.get("data_segs_out"),
        "data_segs_in": info.get("data_segs_in"),
        "send_mbit": cwnd * mss * 8 / rtt_us if rtt_us and mss and cwnd else None,
        "lastsnd": info.get("last_data_sent"),
        "lastrcv": info.get("last_data_recv"),
        "lastack": info.get("last_ack_recv"),
        "pacing_rate_mbit": _mbit(info.get("pacing_rate")),
        "delivery_rate_mbit": _mbit(info.get("delivery_rate")),
        "delivered": info.get("delivered"),
        "app_limited": bool(info.get("delivery_rate_app_limited", False)),
        "busy_ms": _ms(info.get("busy_time")),
        "rwnd_limited_ms": _ms(info.get("rwnd_limited")),
        "sndbuf_limited_ms": _ms(info.get("sndbuf_limited")),
        "unacked": info.get("unacked", 0),
        "retrans_out": info.get("retrans", 0),
        "retrans_total": info.get("total_retrans", 0),
        "lost": info.get("lost", 0),
        "sacked": info.get("sacked", 0),
        "reordering": info.get("reordering"),
        "reord_seen": info.get("reord_seen"),
        "dsack_dups": info.get("dsack_dups"),
        "rcv_rtt_ms": _ms(info.get("rcv_rtt")),
        "rcv_space": info.get("rcv_space"),
        "rcv_ssthresh": info.get("rcv_ssthresh"),
        "notsent": info.get("notsent_bytes", 0),
        "minrtt_ms": _ms(min_rtt) if min_rtt != U32_MAX else None,
        "snd_wnd": info.get("snd_wnd"),
        "backoff": info.get("backoff"),
        "tcp_info_tail_hex": info.get("tail_hex"),
    }


def bbr_columns(bbr: dict) -> dict:
    """BBR's info (``bw_bytes_per_s``, ``min_rtt_us``, gains in the kernel's fixed point where 256 = 1.0,
    ``tail_hex``) -> bw_mbit, mrtt_ms, pacing_gain, cwnd_gain (None when 0: ss omits them), bbr_extra."""
    return {
        "bw_mbit": bbr["bw_bytes_per_s"] * 8 / 1e6,
        "mrtt_ms": bbr["min_rtt_us"] / 1000,
        "pacing_gain": bbr["pacing_gain"] / 256 if bbr["pacing_gain"] else None,
        "cwnd_gain": bbr["cwnd_gain"] / 256 if bbr["cwnd_gain"] else None,
        "bbr_extra": {"tail_hex": bbr["tail_hex"]} if bbr.get("tail_hex") else None,
    }
