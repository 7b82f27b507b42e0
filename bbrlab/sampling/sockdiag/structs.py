"""The kernel structs the sockdiag sampler writes out as hex: ``struct tcp_info`` and ``struct tcp_bbr_info``.

Both are decoded by their uapi layout (``include/uapi/linux/tcp.h`` and ``inet_diag.h``), little-endian
(x86-64, the only sender architecture here). Older kernels send a shorter ``tcp_info``: only the fields
that fit are decoded. Newer kernels send a longer one (more fields at the end), and BBRv3-style kernels a
longer ``tcp_bbr_info``: the bytes beyond the layout below are kept as ``tail_hex``, never an error.
"""

from __future__ import annotations

import struct

#: ``struct tcp_info`` as of Linux 6.1, in order: (name, struct format). The two bitfield bytes are
#: decoded separately (``wscale``, ``flags``).
TCP_INFO_FIELDS: tuple[tuple[str, str], ...] = (
    ("state", "B"), ("ca_state", "B"), ("retransmits", "B"), ("probes", "B"), ("backoff", "B"),
    ("options", "B"), ("wscale", "B"), ("flags", "B"),
    ("rto", "I"), ("ato", "I"), ("snd_mss", "I"), ("rcv_mss", "I"),
    ("unacked", "I"), ("sacked", "I"), ("lost", "I"), ("retrans", "I"), ("fackets", "I"),
    ("last_data_sent", "I"), ("last_ack_sent", "I"), ("last_data_recv", "I"), ("last_ack_recv", "I"),
    ("pmtu", "I"), ("rcv_ssthresh", "I"), ("rtt", "I"), ("rttvar", "I"), ("snd_ssthresh", "I"),
    ("snd_cwnd", "I"), ("advmss", "I"), ("reordering", "I"),
    ("rcv_rtt", "I"), ("rcv_space", "I"),
    ("total_retrans", "I"),
    ("pacing_rate", "Q"), ("max_pacing_rate", "Q"), ("bytes_acked", "Q"), ("bytes_received", "Q"),
    ("segs_out", "I"), ("segs_in", "I"),
    ("notsent_bytes", "I"), ("min_rtt", "I"), ("data_segs_in", "I"), ("data_segs_out", "I"),
    ("delivery_rate", "Q"),
    ("busy_time", "Q"), ("rwnd_limited", "Q"), ("sndbuf_limited", "Q"),
    ("delivered", "I"), ("delivered_ce", "I"),
    ("bytes_sent", "Q"), ("bytes_retrans", "Q"),
    ("dsack_dups", "I"), ("reord_seen", "I"),
    ("rcv_ooopack", "I"),
    ("snd_wnd", "I"),
)

#: ``struct tcp_bbr_info`` (INET_DIAG_BBRINFO): bw in bytes/s split in two u32, min_rtt in us, gains << 8.
BBR_INFO_FIELDS: tuple[tuple[str, str], ...] = (
    ("bw_lo", "I"), ("bw_hi", "I"), ("min_rtt", "I"), ("pacing_gain", "I"), ("cwnd_gain", "I"),
)


def _layout(fields: tuple[tuple[str, str], ...]) -> list[tuple[str, int, struct.Struct]]:
    """(name, offset, Struct) of each field, with C's natural alignment (every field here is aligned)."""
    out, offset = [], 0
    for name, fmt in fields:
        s = struct.Struct("<" + fmt)
        offset += -offset % s.size
        out.append((name, offset, s))
        offset += s.size
    return out


_TCP_INFO = _layout(TCP_INFO_FIELDS)
_BBR_INFO = _layout(BBR_INFO_FIELDS)
#: Sizes of the structs as laid out above (232 and 20 bytes).
TCP_INFO_SIZE = _TCP_INFO[-1][1] + _TCP_INFO[-1][2].size
BBR_INFO_SIZE = _BBR_INFO[-1][1] + _BBR_INFO[-1][2].size


def _decode(layout: list[tuple[str, int, struct.Struct]], size: int, data: bytes) -> dict:
    out: dict = {}
    for name, offset, s in layout:
        if offset + s.size > len(data):
            break
        out[name] = s.unpack_from(data, offset)[0]
    out["tail_hex"] = data[size:].hex() if len(data) > size else None
    return out


def decode_tcp_info(data: bytes) -> dict:
    """``struct tcp_info`` bytes as a dict keyed by the field names without ``tcpi_``.

    The bitfield bytes become ``snd_wscale``/``rcv_wscale`` and ``delivery_rate_app_limited``/
    ``fastopen_client_fail``; a field the (older) kernel did not send is absent; bytes beyond 6.1's
    struct are in ``tail_hex``.
    """
    out = _decode(_TCP_INFO, TCP_INFO_SIZE, data)
    if "wscale" in out:
        w = out.pop("wscale")
        out["snd_wscale"], out["rcv_wscale"] = w & 0x0F, w >> 4
    if "flags" in out:
        f = out.pop("flags")
        out["delivery_rate_app_limited"], out["fastopen_client_fail"] = bool(f & 1), (f >> 1) & 3
    return out


def decode_bbr_info(data: bytes) -> dict:
    """``struct tcp_bbr_info`` bytes: ``bw_bytes_per_s``, ``min_rtt_us``, ``pacing_gain``/``cwnd_gain`` (as
    the kernel's fixed point: 256 = 1.0) and ``tail_hex`` (what a newer BBR appends)."""
    raw = _decode(_BBR_INFO, BBR_INFO_SIZE, data)
    if len(data) < BBR_INFO_SIZE:
        raise ValueError(f"INET_DIAG_BBRINFO of {len(data)} bytes, shorter than struct tcp_bbr_info "
                         f"({BBR_INFO_SIZE} bytes)")
    return {
        "bw_bytes_per_s": raw["bw_hi"] << 32 | raw["bw_lo"],
        "min_rtt_us": raw["min_rtt"],
        "pacing_gain": raw["pacing_gain"],
        "cwnd_gain": raw["cwnd_gain"],
        "tail_hex": raw["tail_hex"],
    }
