"""Parsing what ``ss -tin`` prints: the ``ss`` sampler's log (:mod:`bbrlab.sampling.sampler`) and the
authors' socket logs.

Parsing: :func:`parse_ss_log` turns a log into one row per (sample, connection), :func:`parse_ss_line`
parses one connection. Units are normalised: rates in Mbit/s, times in ms, sizes in bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from bbrlab.core.errors import BbrlabError

from .inflight import derive_inflight


class SsFieldsMissing(BbrlabError):
    """ss printed a connection without the TCP_INFO fields the analyses need."""


_RATE = re.compile(r"([0-9.]+(?:[eE][+-]?\d+)?)([KMGT]?)bps")
_RATE_SCALE_BPS = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_ADDRESS = re.compile(r"^(?:\[[^\]]*\]|[^\s\[\]]*):(\d+|\*)$")

#: Words ss prints without a value (TCP options, flags); everything else bare is the CCA name.
_FLAGS = {"ts", "sack", "ecn", "ecnseen", "fastopen", "app_limited", "ecn_low", "tcp-ulp-tls", "tcp-ulp-mptcp"}
#: Words followed by a value in the next token.
_SPACED = {"send", "pacing_rate", "delivery_rate"}
_INT_FIELDS = {
    "mss", "pmtu", "rcvmss", "advmss", "cwnd", "ssthresh", "bytes_sent", "bytes_retrans", "bytes_acked",
    "bytes_received", "segs_out", "segs_in", "data_segs_out", "data_segs_in", "lastsnd", "lastrcv",
    "lastack", "delivered", "delivered_ce", "unacked", "lost", "sacked", "fackets", "reordering",
    "reord_seen", "rcv_space", "rcv_ssthresh", "notsent", "snd_wnd", "rcv_wnd", "dsack_dups", "backoff",
}
#: Fields every connection must have when ss got TCP_INFO through inet_diag.
REQUIRED = ("cca", "rtt_ms", "mss", "cwnd")
#: Extra fields a BBR connection must have.
REQUIRED_BBR = ("bw_mbit", "mrtt_ms", "pacing_gain", "cwnd_gain")


def parse_rate_mbit(text: str) -> float:
    """An ss rate (``772266616bps``, ``61.4Mbps``, ``9.2Gbps``, ``X/Y`` = rate/max) -> Mbit/s."""
    m = _RATE.fullmatch(text.split("/", 1)[0])
    if not m:
        raise ValueError(f"not an ss rate: {text!r}")
    return float(m.group(1)) * _RATE_SCALE_BPS[m.group(2)] / 1e6


def _number(text: str) -> float | int | str:
    """An ss value as int, float, Mbit/s (rates) or, failing all, the text itself."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(?:[eE][+-]?\d+)?", text):
        return float(text)
    if _RATE.fullmatch(text.split("/", 1)[0]):
        return parse_rate_mbit(text)
    return text


def _parse_bbr(inner: str, row: dict) -> None:
    """``bw:772266616bps,mrtt:0.012,pacing_gain:2.88672,cwnd_gain:2.88672[,more]`` into row."""
    extra: dict = {}
    for part in inner.split(","):
        key, _, value = part.partition(":")
        key = key.strip()
        if key == "bw":
            row["bw_mbit"] = parse_rate_mbit(value)
        elif key == "mrtt":
            row["mrtt_ms"] = float(value)
        elif key in ("pacing_gain", "cwnd_gain"):
            row[key] = float(value)
        elif key:
            extra[key] = _number(value)  # bbr3 and patched kernels add fields: keep them, typed
    row["bbr_extra"] = extra or None


def _tokens(info: str) -> list[str]:
    """Split on whitespace, keeping ``bbr:(...)`` (which has no spaces in ss's output) as one token."""
    return info.split()


def _address_tokens(tokens: list[str]) -> list[str]:
    return [t for t in tokens if _ADDRESS.match(t)]


def _port(address: str) -> int | None:
    tail = address.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _parse_info(tokens: list[str], row: dict) -> None:
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in _SPACED and i + 1 < len(tokens):
            row[f"{tok}_mbit"] = parse_rate_mbit(tokens[i + 1])
            i += 2
            continue
        i += 1
        if tok.startswith("bbr:(") and tok.endswith(")"):
            _parse_bbr(tok[5:-1], row)
        elif ":" in tok:
            key, _, value = tok.partition(":")
            if key == "rtt":
                rtt, _, var = value.partition("/")
                row["rtt_ms"], row["rttvar_ms"] = float(rtt), float(var) if var else None
            elif key == "retrans":
                cur, _, total = value.partition("/")
                row["retrans_out"], row["retrans_total"] = int(cur), int(total or cur)
            elif key in ("minrtt", "rcv_rtt", "ato", "rto"):
                row[f"{key}_ms"] = float(value)
            elif key in ("busy", "rwnd_limited", "sndbuf_limited"):
                row[f"{key}_ms"] = float(value.split("ms", 1)[0].split("(", 1)[0])
            elif key in _INT_FIELDS and value.isdigit():
                row[key] = int(value)
            else:
                row.setdefault("other", {})[key] = _number(value)
        elif tok == "app_limited":
            row["app_limited"] = True
        elif tok in _FLAGS:
            row.setdefault("flags", []).append(tok)
        elif re.fullmatch(r"[a-z][a-z0-9_]{0,14}", tok) and "cca" not in row:
            row["cca"] = tok
        else:
            row.setdefault("unparsed", []).append(tok)


def _derive(row: dict) -> None:
    """Fill the absent counters with 0 (ss omits zero counters) and compute inflight and BDP."""
    for key in ("bytes_sent", "bytes_acked", "bytes_retrans", "unacked", "lost", "sacked", "retrans_out",
                "notsent"):
        row.setdefault(key, 0)
    row.setdefault("app_limited", False)
    for key in ("bw_mbit", "mrtt_ms", "pacing_gain", "cwnd_gain", "pacing_rate_mbit", "delivery_rate_mbit",
                "send_mbit", "ssthresh", "minrtt_ms", "bbr_extra"):
        row.setdefault(key, None)
    derive_inflight(row)


def _check_fields(row: dict, text: str) -> None:
    missing = [k for k in REQUIRED if row.get(k) is None]
    if row.get("cca", "").startswith("bbr") and all(row.get(k) is None for k in REQUIRED_BBR):
        # No bbr:(...) block at all. A block without some fields is normal: ss omits pacing_gain and
        # cwnd_gain while they are still 0 (a sample taken before BBR's first ACK).
        missing += list(REQUIRED_BBR)
    if missing:
        raise SsFieldsMissing(
            f"ss printed a connection without {', '.join(missing)}: {text.strip()[:300]!r}. "
            "ss falls back to /proc/net/tcp (rto, cwnd, ssthresh only) when the inet_diag and tcp_diag "
            "modules are not loaded on that host: load them (modprobe tcp_diag) before sampling."
        )


def parse_ss_line(text: str, *, check: bool = True) -> dict:
    """Parse one connection as ``ss -tin`` prints it: the address line and its info line(s).

    Returns a dict with ``local``, ``peer``, ``port`` (local), ``recv_q``, ``send_q``, the normalised
    fields (``cca``, ``rtt_ms``, ``bw_mbit``, ``pacing_rate_mbit``, ``bytes_sent`` ...) and the derived
    ``inflight_bytes``, ``bdp_bytes``, ``inflight_bdp`` (see the module docstring). Unknown ``key:value``
    fields land in ``other``, unknown bbr fields in ``bbr_extra``. With ``check`` a connection that lacks
    the TCP_INFO fields raises :class:`SsFieldsMissing`.
    """
    tokens = _tokens(text)
    addresses = _address_tokens(tokens[:6]) if text[:1].strip() else []  # the address line comes first
    row: dict = {"local": None, "peer": None, "port": None, "recv_q": None, "send_q": None}
    info = tokens
    if len(addresses) >= 2:
        a = tokens.index(addresses[0])
        row["local"], row["peer"] = addresses[0], addresses[1]
        row["port"] = _port(addresses[0])
        queues = [t for t in tokens[:a] if t.isdigit()]
        if len(queues) >= 2:
            row["recv_q"], row["send_q"] = int(queues[-2]), int(queues[-1])
        info = tokens[tokens.index(addresses[1], a + 1) + 1:]
    _parse_info(info, row)
    _derive(row)
    if check:
        _check_fields(row, text)
    return row


def _connections(lines: list[str]) -> list[str]:
    """Group a sample's lines into connections: an address line and the indented lines after it."""
    groups: list[list[str]] = []
    for line in lines:
        if not line.strip():
            continue
        if line[:1].isspace() and groups:
            groups[-1].append(line)
        else:
            groups.append([line])
    return ["\n".join(g) for g in groups]


def parse_ss_log(text: str, *, ports: Iterable[int] | None = None, t0_unix_s: float | None = None,
                 check: bool = True) -> list[dict]:
    """One row per (sample, connection) of a sampler log (``# t=`` lines, then ss output).

    ``ports`` keeps only connections whose local port is listed (iperf3's data streams). Each row has
    ``t_unix_s`` and ``t_s`` (seconds since ``t0_unix_s``, by default the first sample). Lines ss
    printed before the first ``# t=`` and the sampler's ``# end`` footer are not samples.
    """
    keep = set(ports) if ports is not None else None
    rows: list[dict] = []
    samples: list[tuple[float, list[str]]] = []
    for line in text.splitlines():
        m = re.match(r"^# t=([0-9.]+)\s*$", line)
        if m:
            samples.append((float(m.group(1)), []))
        elif line.startswith("#"):
            continue
        elif samples:
            samples[-1][1].append(line)
    if not samples:
        return rows
    t0 = samples[0][0] if t0_unix_s is None else t0_unix_s
    for index, (t_unix_s, lines) in enumerate(samples):
        rows.extend(sample_rows(index, t_unix_s, t0, lines, keep, check=check))
    return rows


def sample_rows(index: int, t_unix_s: float, t0_unix_s: float, lines: list[str], keep: set[int] | None, *,
                check: bool = True) -> Iterator[dict]:
    """The rows of sample number ``index`` (taken at ``t_unix_s``; ``t_s`` counts from ``t0_unix_s``), one per
    connection in its ss output ``lines`` whose local port is in ``keep`` (None: all), each checked as
    :func:`parse_ss_log` says when ``check``."""
    for conn in _connections(lines):
        row = parse_ss_line(conn, check=False)
        if keep is not None and row["port"] not in keep:
            continue
        if check:
            _check_fields(row, conn)
        yield {"sample": index, "t_unix_s": t_unix_s, "t_s": t_unix_s - t0_unix_s, **row}


def filter_log_by_ports(text: str, local_ports: Iterable[int]) -> str:
    """Keep the ``#`` lines and only the connections whose local port is in ``local_ports``.

    Lines are kept byte for byte; whole connections (address line + info lines) are dropped. Used to
    remove iperf3's control connection when the sampler could not filter by port.
    """
    keep_ports = set(local_ports)
    out: list[str] = []
    keep = True
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):
            keep = True
            out.append(line)
        elif line[:1].isspace():
            if keep:
                out.append(line)
        elif line.strip():
            addresses = _address_tokens(line.split()[:6])
            keep = bool(addresses) and _port(addresses[0]) in keep_ports
            if keep:
                out.append(line)
    return "".join(out)
