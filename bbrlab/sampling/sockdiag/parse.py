"""Reading the sockdiag sampler's output (format 1, described in ``bbrlab/sampling/native/sockdiag_sampler.c``).

:func:`parse_log` gives the log's structure (header, discovered sockets, samples with their raw
attributes, sockets gone, errors, footer). :func:`rows` turns it into exactly the rows
:func:`bbrlab.sampling.ss.parse_ss_log` makes from ``ss -tin``: the same keys, units (rates in Mbit/s,
times in ms, sizes in bytes) and derivations (``inflight_bytes``, ``bdp_bytes``, ``inflight_bdp``: see
:mod:`bbrlab.sampling.sampler`). A field ``ss`` leaves out (a zero rtt, an infinite ssthresh, an unset
pacing rate) is None here too, so both samplers fill one table. Values are exact: ``ss`` prints
``%g`` (6 significant digits) where this reads the kernel's integers, e.g. a pacing gain of
739/256 is 2.88671875 here and 2.88672 in ``ss``.

:func:`summary` gives what a run record keeps: samples, missed ticks, CPU per sample, and the
achieved interval (median, p99, longest gap) from the samples' monotonic timestamps.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from bbrlab.core.errors import BbrlabError

from ..inflight import derive_inflight
from .columns import bbr_columns, tcp_columns
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
        """The socket's local end as ``address:port`` (an IPv6 address in brackets)."""
        return f"[{self.src}]:{self.sport}" if self.family == 6 else f"{self.src}:{self.sport}"

    @property
    def peer(self) -> str:
        """The socket's remote end as ``address:port`` (an IPv6 address in brackets)."""
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
    stderr: list[str] = field(default_factory=list)
    ready: dict | None = None


def _key_values(words: Iterable[str]) -> dict:
    out: dict = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep:
            out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def _socket(words: list[str]) -> SocketState:
    attrs: dict[int, bytes] = {}
    for word in words[5:]:
        kind, _, data = word.partition(":")
        attrs[int(kind)] = bytes.fromhex(data)
    return SocketState(int(words[1]), int(words[2]), int(words[3]), int(words[4]), attrs)


def read_header(lines: list[str], magic: str, fmt: int, what: str) -> dict:
    """The key=value words of a sampler log's first line, which must start with ``magic`` and name format
    ``fmt``; :class:`SockdiagLogError` naming ``what`` log it is not."""
    if not lines or not lines[0].startswith(magic + " "):
        raise SockdiagLogError(f"not a {what} log (first line {lines[0][:80] if lines else ''!r})")
    header = _key_values(lines[0].split()[2:])
    if header.get("format") != fmt:
        raise SockdiagLogError(f"{what} log format {header.get('format')!r}, this bbrlab reads {fmt}")
    return header


def parse_log(text: str) -> SockdiagLog:
    """The structure of a sampler log; raises :class:`SockdiagLogError` when it is not one."""
    lines = text.splitlines()
    header = read_header(lines, MAGIC, FORMAT, "sockdiag sampler")
    log = SockdiagLog(header, {}, [], {}, [], None)
    log.samples.extend(samples_of(log, enumerate(lines[1:], start=2)))
    return log


def samples_of(log: SockdiagLog, numbered_lines: Iterable[tuple[int, str]]) -> Iterator[Sample]:
    """Each sample of the log's ``(line number, text)`` lines after its header, once its last socket is read;
    what is not a sample (sockets discovered and gone, errors, the ready line, the footer, the sampler's
    stderr) goes into ``log`` as it comes. Raises :class:`SockdiagLogError` at a malformed line."""
    current: Sample | None = None
    for number, line in numbered_lines:
        words = line.split()
        if not words:
            continue
        try:
            kind = words[0]
            if kind == "T":
                if current is not None:
                    yield current
                current = Sample(*(int(w) for w in words[1:5]))
            elif kind == "S":
                if current is None:
                    raise ValueError("a socket before the first sample")
                current.sockets.append(_socket(words))
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
            elif line.startswith("# ready "):
                log.ready = _key_values(words[2:])
            elif line.startswith("sockdiag_sampler: "):
                log.stderr.append(line[len("sockdiag_sampler: "):])  # its stderr, when both go to one file
            elif not line.startswith("#"):
                raise ValueError("unknown record")
        except (ValueError, IndexError, TypeError) as e:
            raise SockdiagLogError(f"line {number} of the sockdiag log is malformed ({e}): {line[:120]!r}") from None
    if current is not None:
        yield current


# -- rows as the ss parser makes them ---------------------------------------------------------------

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
    row.update(tcp_columns(decode_tcp_info(info) if info is not None else {}))
    row["has_tcp_info"] = info is not None
    if ATTR_BBRINFO in sock.attrs:
        row.update(bbr_columns(decode_bbr_info(sock.attrs[ATTR_BBRINFO])))
    other = {f"attr_{k}": v.hex() for k, v in sorted(sock.attrs.items()) if k not in _DECODED}
    row["other"] = other or None
    derive_inflight(row)
    return row


def _check(row: dict, sample: Sample) -> None:
    missing = [k for k in ("cca", "rtt_ms", "mss", "cwnd") if row.get(k) is None]
    if not row["has_tcp_info"]:
        missing.insert(0, "INET_DIAG_INFO (tcp_info)")
    if missing:
        raise SockdiagFieldsMissing(f"socket :{row['port']} at tick {sample.tick} came without {', '.join(missing)}")


def _check_bbr_info(out: list[dict]) -> None:
    """A BBR socket must have BBR's info. A single sample without it happens (the socket closed while the
    kernel answered: it reads the state before the CCA's info) and keeps None there; never any is a
    kernel that does not send it."""
    bbr_ports = {r["port"] for r in out if (r["cca"] or "").startswith("bbr")}
    for port in sorted(bbr_ports):
        if all(r["bw_mbit"] is None for r in out if r["port"] == port and (r["cca"] or "").startswith("bbr")):
            raise SockdiagFieldsMissing(f"socket :{port} runs BBR but came without INET_DIAG_BBRINFO (bw, mrtt, "
                                        "pacing_gain, cwnd_gain) in every sample")


def rows(text: str | SockdiagLog, *, ports: Iterable[int] | None = None, t0_unix_s: float | None = None,
         check: bool = True, states: Iterable[int] | None = (ESTABLISHED,)) -> list[dict]:
    """One row per (sample, socket), with the keys and units of :func:`bbrlab.sampling.ss.parse_ss_log`.

    ``ports`` keeps only those local ports; ``states`` only sockets in those TCP states (by default
    established, as the ss sampler's filter; None keeps all). ``t_unix_s`` is the sample's realtime
    clock, ``t_mono_s`` its monotonic one, ``t_s`` seconds since ``t0_unix_s`` (by default the first
    sample). With ``check`` a socket without tcp_info or its CCA, or a BBR socket without BBR's info in
    every sample, raises :class:`SockdiagFieldsMissing`; a log whose sampler reported an error raises
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
    if check:
        _check_bbr_info(out)
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
    """What a run record keeps about the sampler: asked interval, samples, missed ticks, CPU per sample (its
    own ``getrusage`` after it was ready, per sample; ``cpu_startup_s`` before), the achieved interval, how
    the sampler ended, and its errors."""
    log = text if isinstance(text, SockdiagLog) else parse_log(text)
    return summary_numbers(log, len(log.samples), [s.monotonic_ns for s in log.samples],
                           sorted(s.request_ns / 1e6 for s in log.samples if s.sockets))


def summary_numbers(log: SockdiagLog, samples_seen: int, monotonic_ns: list[int], request_ms: list[float]) -> dict:
    """:func:`summary` from the log's header, ready line, footer and errors and what its samples gave: how many
    were read, their monotonic times [ns] and their netlink requests' times [ms], sorted (a streamed read
    keeps only these, not the samples: :mod:`bbrlab.sampling.logscan`)."""
    foot, ready = log.footer or {}, log.ready or {}
    samples = foot.get("samples", samples_seen)
    cpu_us = foot["cpu_user_us"] + foot["cpu_sys_us"] if log.footer else None
    startup_us = ready.get("cpu_user_us", 0) + ready.get("cpu_sys_us", 0)
    return {
        "kind": "netlink",
        "asked_interval_ms": log.header.get("interval_ns", 0) / 1e6,
        "samples": samples,
        "ticks": foot.get("ticks"),
        "missed_ticks": foot.get("missed"),
        "cpu_s": cpu_us / 1e6 if cpu_us is not None else None,
        "cpu_startup_s": startup_us / 1e6 if log.ready else None,
        "cpu_per_sample_ms": (cpu_us - startup_us) / 1000 / samples if cpu_us is not None and samples else None,
        "request_median_ms": statistics.median(request_ms) if request_ms else None,
        "interval": interval_stats(monotonic_ns),
        "sockets_discovered": sorted(log.discovered),
        "ended": foot.get("reason", "killed (no footer)"),
        "errors": log.errors,
    }
