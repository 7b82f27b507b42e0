"""Reading the sockdiag sampler's output (format 1, described in ``bbrlab/native/sockdiag_sampler.c``).

:func:`parse_log` gives the log's structure (header, discovered sockets, samples with their raw
attributes, sockets gone, errors, footer). :func:`rows` turns it into exactly the rows
:func:`bbrlab.sampling.parse_ss_log` makes from ``ss -tin``: the same keys, units (rates in Mbit/s,
times in ms, sizes in bytes) and derivations (``inflight_bytes``, ``bdp_bytes``, ``inflight_bdp``: see
:mod:`bbrlab.sampling`). A field ``ss`` leaves out (a zero rtt, an infinite ssthresh, an unset
pacing rate) is None here too, so both samplers fill one table. Values are exact: ``ss`` prints
``%g`` (6 significant digits) where this reads the kernel's integers, e.g. a pacing gain of
739/256 is 2.88671875 here and 2.88672 in ``ss``.

:func:`summary` gives what a run record keeps: samples, missed ticks, CPU per sample, and the
achieved interval (median, p99, longest gap) from the samples' monotonic timestamps.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import BbrlabError
from .structs import decode_bbr_info, decode_tcp_info

FORMAT = 1
MAGIC = "# bbrlab-sockdiag-sampler"

# inet_diag attribute types (include/uapi/linux/inet_diag.h)
ATTR_INFO = 2
ATTR_VEGASINFO = 3
ATTR_CONG = 4
ATTR_DCTCPINFO = 9
ATTR_BBRINFO = 16
#: Attributes turned into columns; every other one is kept, as hex, in the row's ``other``.
_DECODED = {ATTR_INFO, ATTR_CONG, ATTR_BBRINFO}
TCP_STATES = {1: "established", 2: "syn-sent", 3: "syn-recv", 4: "fin-wait-1", 5: "fin-wait-2",
              6: "time-wait", 7: "close", 8: "close-wait", 9: "last-ack", 10: "listen", 11: "closing"}
ESTABLISHED = 1
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


class SockdiagLogError(BbrlabError):
    """The text is not a sockdiag sampler log, or the sampler reported a failure."""


class SockdiagFieldsMissing(SockdiagLogError):
    """A socket came without the attributes the analyses need (tcp_info, the CCA, BBR's info)."""


@dataclass
class SocketState:
    """One socket in one sample: the inet_diag header fields and the raw attributes (type -> bytes)."""

    sport: int
    state: int
    rqueue: int
    wqueue: int
    attrs: dict[int, bytes]


@dataclass
class Sample:
    """One tick at which the sampler asked the kernel: times in ns, the sockets it got."""

    tick: int
    realtime_ns: int
    monotonic_ns: int
    request_ns: int
    sockets: list[SocketState] = field(default_factory=list)


@dataclass
class Discovered:
    """A data socket of the flow as first seen (a ``D`` line)."""

    sport: int
    family: int
    src: str
    dst: str
    dport: int
    cookie: str
    tick: int

    @property
    def local(self) -> str:
        return f"[{self.src}]:{self.sport}" if self.family == 6 else f"{self.src}:{self.sport}"

    @property
    def peer(self) -> str:
        return f"[{self.dst}]:{self.dport}" if self.family == 6 else f"{self.dst}:{self.dport}"


@dataclass
class SockdiagLog:
    """A parsed log. ``footer`` is None when the sampler did not end cleanly (killed)."""

    header: dict
    discovered: dict[int, Discovered]
    samples: list[Sample]
    gone: dict[int, tuple[int, str]]
    errors: list[str]
    footer: dict | None


def _key_values(words: Iterable[str]) -> dict:
    out: dict = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep:
            out[key] = int(value) if value.isdigit() else value
    return out


def _socket(words: list[str]) -> SocketState:
    attrs: dict[int, bytes] = {}
    for word in words[5:]:
        kind, _, data = word.partition(":")
        attrs[int(kind)] = bytes.fromhex(data)
    return SocketState(int(words[1]), int(words[2]), int(words[3]), int(words[4]), attrs)


def parse_log(text: str) -> SockdiagLog:
    """The structure of a sampler log; raises :class:`SockdiagLogError` when it is not one."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith(MAGIC + " "):
        raise SockdiagLogError(f"not a sockdiag sampler log (first line {lines[0][:80] if lines else ''!r})")
    header = _key_values(lines[0].split()[2:])
    if header.get("format") != FORMAT:
        raise SockdiagLogError(f"sockdiag sampler log format {header.get('format')!r}, this bbrlab reads {FORMAT}")
    log = SockdiagLog(header, {}, [], {}, [], None)
    for number, line in enumerate(lines[1:], start=2):
        words = line.split()
        if not words:
            continue
        try:
            kind = words[0]
            if kind == "T":
                log.samples.append(Sample(*(int(w) for w in words[1:5])))
            elif kind == "S":
                if not log.samples:
                    raise ValueError("a socket before the first sample")
                log.samples[-1].sockets.append(_socket(words))
            elif kind == "D":
                d = Discovered(int(words[1]), int(words[2]), words[3], words[4], int(words[5]), words[6],
                               int(words[7]))
                log.discovered[d.sport] = d
            elif kind == "G":
                log.gone[int(words[1])] = (int(words[2]), words[3])
            elif line.startswith("# error "):
                log.errors.append(line[len("# error "):])
            elif line.startswith("# end "):
                log.footer = _key_values(words[2:])
            elif not line.startswith("#"):
                raise ValueError("unknown record")
        except (ValueError, IndexError, TypeError) as e:
            raise SockdiagLogError(f"line {number} of the sockdiag log is malformed ({e}): {line[:120]!r}") from None
    return log


# -- rows as the ss parser makes them ---------------------------------------------------------------

def _ms(us: int | None) -> float | None:
    return us / 1000 if us else None


def _mbit(bytes_per_s: int | None) -> float | None:
    return bytes_per_s * 8 / 1e6 if bytes_per_s and bytes_per_s != _U64_MAX else None


def _tcp_columns(info: dict) -> dict:
    """tcp_info -> the ss parser's column names and units (None where ss prints nothing)."""
    rtt_us, mss, cwnd = info.get("rtt", 0), info.get("snd_mss", 0), info.get("snd_cwnd", 0)
    ssthresh = info.get("snd_ssthresh")
    min_rtt = info.get("min_rtt")
    return {
        "rto_ms": _ms(info.get("rto")) if info.get("rto") != 3_000_000 else None,
        "rtt_ms": _ms(rtt_us),
        "rttvar_ms": info["rttvar"] / 1000 if rtt_us else None,
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
        "bytes_received": info.get("bytes_received", 0),
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
        "busy_ms": _ms(info.get("busy_time")) or None,
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
        "minrtt_ms": _ms(min_rtt) if min_rtt != _U32_MAX else None,
        "snd_wnd": info.get("snd_wnd"),
        "backoff": info.get("backoff"),
        "tcp_info_tail_hex": info.get("tail_hex"),
    }


def _bbr_columns(data: bytes) -> dict:
    bbr = decode_bbr_info(data)
    return {
        "bw_mbit": bbr["bw_bytes_per_s"] * 8 / 1e6,
        "mrtt_ms": bbr["min_rtt_us"] / 1000,
        "pacing_gain": bbr["pacing_gain"] / 256 if bbr["pacing_gain"] else None,
        "cwnd_gain": bbr["cwnd_gain"] / 256 if bbr["cwnd_gain"] else None,
        "bbr_extra": {"tail_hex": bbr["tail_hex"]} if bbr["tail_hex"] else None,
    }


def _derive(row: dict) -> None:
    """inflight and BBR's BDP, with the definitions of :mod:`bbrlab.sampling` (see its docstring)."""
    mss = row["mss"] or 0
    row["sent_minus_acked_bytes"] = row["bytes_sent"] - row["bytes_acked"]
    row["inflight_bytes"] = max(0, row["bytes_sent"] - row["bytes_retrans"] - row["bytes_acked"])
    row["unacked_bytes"] = row["unacked"] * mss
    row["pipe_bytes"] = max(0, row["unacked"] - row["sacked"] - row["lost"] + row["retrans_out"]) * mss
    if row["bw_mbit"] is not None and row["mrtt_ms"] is not None:
        row["bdp_bytes"] = row["bw_mbit"] * 1e6 / 8 * row["mrtt_ms"] / 1e3
        row["inflight_bdp"] = row["inflight_bytes"] / row["bdp_bytes"] if row["bdp_bytes"] > 0 else None
    else:
        row["bdp_bytes"] = None
        row["inflight_bdp"] = None


def socket_row(sock: SocketState, where: Discovered | None = None) -> dict:
    """One socket of one sample as the ss parser's row (without the sample's index and times)."""
    cca_raw = sock.attrs.get(ATTR_CONG)
    row: dict = {
        "local": where.local if where else None,
        "peer": where.peer if where else None,
        "port": sock.sport,
        "state": TCP_STATES.get(sock.state, str(sock.state)),
        "recv_q": sock.rqueue,
        "send_q": sock.wqueue,
        "cca": cca_raw.split(b"\0", 1)[0].decode("ascii", "replace") if cca_raw is not None else None,
        "bw_mbit": None, "mrtt_ms": None, "pacing_gain": None, "cwnd_gain": None, "bbr_extra": None,
    }
    info = sock.attrs.get(ATTR_INFO)
    row.update(_tcp_columns(decode_tcp_info(info) if info is not None else {}))
    row["has_tcp_info"] = info is not None
    if ATTR_BBRINFO in sock.attrs:
        row.update(_bbr_columns(sock.attrs[ATTR_BBRINFO]))
    other = {f"attr_{k}": v.hex() for k, v in sorted(sock.attrs.items()) if k not in _DECODED}
    row["other"] = other or None
    _derive(row)
    return row


def _check(row: dict, sample: Sample) -> None:
    missing = [k for k in ("cca", "rtt_ms", "mss", "cwnd") if row.get(k) is None]
    if not row["has_tcp_info"]:
        missing.insert(0, "INET_DIAG_INFO (tcp_info)")
    if (row.get("cca") or "").startswith("bbr") and row["bw_mbit"] is None:
        missing.append("INET_DIAG_BBRINFO (bw, mrtt, pacing_gain, cwnd_gain)")
    if missing:
        raise SockdiagFieldsMissing(f"socket :{row['port']} at tick {sample.tick} came without {', '.join(missing)}")


def rows(text: str | SockdiagLog, *, ports: Iterable[int] | None = None, t0_unix_s: float | None = None,
         check: bool = True, states: Iterable[int] | None = (ESTABLISHED,)) -> list[dict]:
    """One row per (sample, socket), with the keys and units of :func:`bbrlab.sampling.parse_ss_log`.

    ``ports`` keeps only those local ports; ``states`` only sockets in those TCP states (by default
    established, as the ss sampler's filter; None keeps all). ``t_unix_s`` is the sample's realtime
    clock, ``t_mono_s`` its monotonic one, ``t_s`` seconds since ``t0_unix_s`` (by default the first
    sample). With ``check`` a socket without tcp_info, its CCA, or (BBR) its BBR info raises
    :class:`SockdiagFieldsMissing`; a log whose sampler reported an error raises
    :class:`SockdiagLogError`.
    """
    log = text if isinstance(text, SockdiagLog) else parse_log(text)
    if check and log.errors:
        raise SockdiagLogError(f"the sockdiag sampler failed: {'; '.join(log.errors)}")
    keep_ports = set(ports) if ports is not None else None
    keep_states = set(states) if states is not None else None
    if not log.samples:
        return []
    t0 = log.samples[0].realtime_ns / 1e9 if t0_unix_s is None else t0_unix_s
    out: list[dict] = []
    for index, sample in enumerate(log.samples):
        t_unix_s = sample.realtime_ns / 1e9
        for sock in sample.sockets:
            if keep_ports is not None and sock.sport not in keep_ports:
                continue
            if keep_states is not None and sock.state not in keep_states:
                continue
            row = socket_row(sock, log.discovered.get(sock.sport))
            if check:
                _check(row, sample)
            out.append({"sample": index, "t_unix_s": t_unix_s, "t_mono_s": sample.monotonic_ns / 1e9,
                        "t_s": t_unix_s - t0, **row})
    return out


# -- what a run record keeps ----------------------------------------------------------------------

def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def interval_stats(monotonic_ns: list[int]) -> dict | None:
    """Gaps between consecutive samples in ms: median, p99 (nearest rank), mean, longest; None for < 2."""
    gaps = sorted((b - a) / 1e6 for a, b in zip(monotonic_ns, monotonic_ns[1:], strict=False))
    if not gaps:
        return None
    return {"median_ms": statistics.median(gaps), "p99_ms": _percentile(gaps, 99), "mean_ms": statistics.fmean(gaps),
            "longest_gap_ms": gaps[-1], "gaps": len(gaps)}


def summary(text: str | SockdiagLog) -> dict:
    """What a run record keeps about the sampler: asked interval, samples, missed ticks, CPU (its own
    ``getrusage``) per sample, the achieved interval, how the sampler ended, and its errors."""
    log = text if isinstance(text, SockdiagLog) else parse_log(text)
    foot = log.footer or {}
    samples = foot.get("samples", len(log.samples))
    cpu_us = foot["cpu_user_us"] + foot["cpu_sys_us"] if log.footer else None
    request_ms = sorted(s.request_ns / 1e6 for s in log.samples if s.sockets)
    return {
        "kind": "netlink",
        "asked_interval_ms": log.header.get("interval_ns", 0) / 1e6,
        "samples": samples,
        "ticks": foot.get("ticks"),
        "missed_ticks": foot.get("missed"),
        "cpu_s": cpu_us / 1e6 if cpu_us is not None else None,
        "cpu_per_sample_ms": cpu_us / 1000 / samples if cpu_us is not None and samples else None,
        "request_median_ms": statistics.median(request_ms) if request_ms else None,
        "interval": interval_stats([s.monotonic_ns for s in log.samples]),
        "sockets_discovered": sorted(log.discovered),
        "ended": foot.get("reason", "killed (no footer)"),
        "errors": log.errors,
    }
