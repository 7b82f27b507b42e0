"""Reading the in-kernel (BPF) sampler's output (format 1, described in ``bbrlab/sampling/native/sockbpf_sampler.c``).

Each ``R`` line is one ``struct sockbpf_record`` (``bbrlab/sampling/native/sockbpf_record.h``): what the BPF program
read from a data socket when an ACK arrived in a new sampling slot. :func:`rows` turns records into the
rows :func:`bbrlab.sampling.ss.parse_ss_log` makes (same keys and units), computing what ``tcp_get_info()``
would report from the same fields (rtt = srtt >> 3, the delivery rate from the last rate sample, ...).

BBR's bandwidth estimate, min RTT and gains are decoded from the congestion control's private area with
the layout of Linux 6.1's ``struct bbr`` (``net/ipv4/tcp_bbr.c``; checked against the guest's module BTF
and against ``INET_DIAG_BBRINFO`` in tests/system/test_sockdiag_testbed.py) for the CCAs listed in
:data:`BBR1_LAYOUT`. Another BBR (v2, v3) has another layout: its rows keep the raw area in
``bbr_extra`` and no bw, and :func:`rows` refuses them when checking, instead of guessing.
"""

from __future__ import annotations

import statistics
import struct
from collections import defaultdict
from dataclasses import dataclass, field

from ..inflight import derive_inflight
from .columns import bbr_columns, tcp_columns
from .parse import (
    ESTABLISHED,
    TCP_STATES,
    SockdiagFieldsMissing,
    SockdiagLogError,
    _key_values,
    interval_stats,
    read_header,
)

FORMAT = 1
MAGIC = "# bbrlab-sockbpf-sampler"

RECORD = struct.Struct("<7Q22I2H4B16s128s")
RECORD_FIELDS = (
    "mono_ns", "slot", "bytes_sent", "bytes_acked", "bytes_retrans", "pacing_rate", "max_pacing_rate",
    "snd_cwnd", "snd_ssthresh", "mss_cache", "srtt_us", "mdev_us", "min_rtt_us", "packets_out", "sacked_out",
    "lost_out", "retrans_out", "total_retrans", "delivered", "rate_delivered", "rate_interval_us", "segs_out",
    "data_segs_out", "write_seq", "snd_nxt", "snd_una", "snd_wnd", "rcv_nxt", "copied_seq",
    "sport", "dport", "state", "app_limited", "ca_priv_len", "pad", "ca_name", "ca_priv",
)
#: CCAs whose private area is Linux 6.1's struct bbr (bbr2b is 6.1's tcp_bbr.c patched in unused bits).
BBR1_LAYOUT = frozenset({"bbr", "bbr2b"})
_BBR1_SIZE = 104
_BW_SCALE = 24


@dataclass
class BpfLog:
    """A parsed BPF sampler log. ``footer`` is None when the loader did not end cleanly (killed)."""

    header: dict
    records: list[dict]
    errors: list[str]
    footer: dict | None
    ready: dict | None = None
    stderr: list[str] = field(default_factory=list)

    @property
    def realtime_offset_ns(self) -> int:
        """Realtime minus monotonic clock at the loader's start, in ns (the header's value; 0 when absent):
        a record's Unix time is its ``mono_ns`` plus this."""
        return int(self.header.get("realtime_minus_monotonic_ns", 0))


def decode_record(data: bytes) -> dict:
    """One ``struct sockbpf_record`` as a dict (``ca_name`` as text, ``ca_priv`` trimmed to its length)."""
    if len(data) != RECORD.size:
        raise ValueError(f"a record of {len(data)} bytes, struct sockbpf_record has {RECORD.size}")
    rec = dict(zip(RECORD_FIELDS, RECORD.unpack(data), strict=True))
    rec["ca_name"] = rec["ca_name"].split(b"\0", 1)[0].decode("ascii", "replace")
    rec["ca_priv"] = rec["ca_priv"][: rec["ca_priv_len"]]
    return rec


def parse_log(text: str) -> BpfLog:
    """The structure of a BPF sampler log; :class:`SockdiagLogError` when it is not one."""
    lines = text.splitlines()
    header = read_header(lines, MAGIC, FORMAT, "BPF sampler")
    if header.get("record_size") != RECORD.size:
        raise SockdiagLogError(f"BPF sampler records of {header.get('record_size')} bytes, this bbrlab reads "
                               f"{RECORD.size}")
    log = BpfLog(header, [], [], None)
    for number, line in enumerate(lines[1:], start=2):
        if line.startswith("R "):
            try:
                log.records.append(decode_record(bytes.fromhex(line.split()[4])))
            except (ValueError, IndexError) as e:
                raise SockdiagLogError(f"line {number} of the BPF sampler log is malformed ({e}): {line[:100]!r}") \
                    from None
        elif line.startswith("# error "):
            log.errors.append(line[len("# error "):])
        elif line.startswith("# end "):
            log.footer = _key_values(line.split()[2:])
        elif line.startswith("# ready "):
            log.ready = _key_values(line.split()[2:])
        elif line.strip():
            log.stderr.append(line)  # the loader's and libbpf's messages, when stderr shares the file
    return log


def _signed32(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def tcp_info_fields(rec: dict) -> dict:
    """The ``struct tcp_info`` fields ``tcp_get_info()`` derives from what the record holds."""
    mss = rec["mss_cache"]
    rate, interval_us = rec["rate_delivered"], rec["rate_interval_us"]
    return {
        "state": rec["state"], "rtt": rec["srtt_us"] >> 3, "rttvar": rec["mdev_us"] >> 2, "snd_mss": mss,
        "snd_cwnd": rec["snd_cwnd"], "snd_ssthresh": rec["snd_ssthresh"], "unacked": rec["packets_out"],
        "sacked": rec["sacked_out"], "lost": rec["lost_out"], "retrans": rec["retrans_out"],
        "total_retrans": rec["total_retrans"], "pacing_rate": rec["pacing_rate"],
        "max_pacing_rate": rec["max_pacing_rate"], "bytes_sent": rec["bytes_sent"],
        "bytes_acked": rec["bytes_acked"], "bytes_retrans": rec["bytes_retrans"], "delivered": rec["delivered"],
        "segs_out": rec["segs_out"], "data_segs_out": rec["data_segs_out"], "min_rtt": rec["min_rtt_us"],
        "notsent_bytes": max(0, _signed32((rec["write_seq"] - rec["snd_nxt"]) & 0xFFFFFFFF)),
        "delivery_rate": rate * mss * 1_000_000 // interval_us if rate and interval_us else 0,
        "delivery_rate_app_limited": bool(rec["app_limited"]), "snd_wnd": rec["snd_wnd"],
    }


def bbr1_info(priv: bytes, mss: int) -> dict:
    """What 6.1's ``bbr_get_info()`` reports, from ``struct bbr``: bw (``lt_bw`` when ``lt_use_bw``, else the
    max filter's best) x mss in bytes/s, min_rtt_us, pacing and cwnd gain (<< 8)."""
    if len(priv) < _BBR1_SIZE:
        raise ValueError(f"a BBR private area of {len(priv)} bytes, 6.1's struct bbr has {_BBR1_SIZE}")
    min_rtt_us, = struct.unpack_from("<I", priv, 0)
    max_bw, = struct.unpack_from("<I", priv, 16)  # bw.s[0].v
    flags, lt_bw = struct.unpack_from("<II", priv, 56)
    gains, = struct.unpack_from("<I", priv, 76)
    bw = lt_bw if flags >> 31 & 1 else max_bw  # lt_use_bw is the word's top bit
    return {"bw_bytes_per_s": bw * mss * 1_000_000 >> _BW_SCALE, "min_rtt_us": min_rtt_us,
            "pacing_gain": gains & 0x3FF, "cwnd_gain": gains >> 10 & 0x3FF, "tail_hex": None}


def record_row(rec: dict) -> dict:
    """One record as the ss parser's row (without the sample's index and times)."""
    row: dict = {
        "local": None, "peer": None, "port": rec["sport"], "state": TCP_STATES.get(rec["state"], str(rec["state"])),
        "recv_q": max(0, _signed32((rec["rcv_nxt"] - rec["copied_seq"]) & 0xFFFFFFFF)),
        "send_q": max(0, _signed32((rec["write_seq"] - rec["snd_una"]) & 0xFFFFFFFF)),
        "cca": rec["ca_name"] or None,
        "bw_mbit": None, "mrtt_ms": None, "pacing_gain": None, "cwnd_gain": None, "bbr_extra": None,
        "has_tcp_info": True,
    }
    row.update(tcp_columns(tcp_info_fields(rec)))
    if rec["ca_name"] in BBR1_LAYOUT and rec["ca_priv_len"] >= _BBR1_SIZE:
        row.update(bbr_columns(bbr1_info(rec["ca_priv"], rec["mss_cache"])))
    elif rec["ca_name"].startswith("bbr"):
        row["bbr_extra"] = {"ca_priv_hex": rec["ca_priv"].hex()}
    row["other"] = None
    derive_inflight(row)
    return row


def rows(text: str | BpfLog, *, ports=None, t0_unix_s: float | None = None, check: bool = True,
         states=(ESTABLISHED,)) -> list[dict]:
    """One row per record, as :func:`bbrlab.sampling.sockdiag.parse.rows` (same keys; ``sample`` numbers the slots
    that have records, in order). With ``check`` a failed sampler, a record without its CCA's name, or a
    BBR socket whose BBR state could not be decoded in any record raises."""
    log = text if isinstance(text, BpfLog) else parse_log(text)
    if check and log.errors:
        raise SockdiagLogError(f"the BPF sampler failed: {'; '.join(log.errors)}")
    keep_ports = set(ports) if ports is not None else None
    keep_states = set(states) if states is not None else None
    records = sorted(log.records, key=lambda r: (r["slot"], r["mono_ns"]))
    slots = sorted({r["slot"] for r in records})
    index = {slot: i for i, slot in enumerate(slots)}
    offset = log.realtime_offset_ns
    t0 = (records[0]["mono_ns"] + offset) / 1e9 if t0_unix_s is None and records else t0_unix_s
    out = []
    for rec in records:
        if keep_ports is not None and rec["sport"] not in keep_ports:
            continue
        if keep_states is not None and rec["state"] not in keep_states:
            continue
        row = record_row(rec)
        t_unix_s = (rec["mono_ns"] + offset) / 1e9
        out.append({"sample": index[rec["slot"]], "t_unix_s": t_unix_s, "t_mono_s": rec["mono_ns"] / 1e9,
                    "t_s": t_unix_s - t0, **row})
    if check:
        for row in out:
            if not row["cca"]:
                raise SockdiagFieldsMissing(f"socket :{row['port']}: a record without its congestion control")
        bbr_ports = {r["port"] for r in out if r["cca"].startswith("bbr")}
        for port in sorted(bbr_ports):
            names = {r["cca"] for r in out if r["port"] == port and r["cca"].startswith("bbr")}
            if all(r["bw_mbit"] is None for r in out if r["port"] == port and r["cca"].startswith("bbr")):
                raise SockdiagFieldsMissing(
                    f"socket :{port} runs {', '.join(sorted(names))}, whose private state this bbrlab cannot "
                    f"decode (it knows the layout of {', '.join(sorted(BBR1_LAYOUT))}): no bw, mrtt or gains")
    return out


def missed_slots(records: list[dict]) -> int:
    """Slots without a record between each socket's first and last record, summed over the sockets."""
    by_port: dict[int, set[int]] = defaultdict(set)
    for r in records:
        by_port[r["sport"]].add(r["slot"])
    return sum(max(s) - min(s) + 1 - len(s) for s in by_port.values())


def cpu_numbers(log: BpfLog, records: int) -> dict:
    """The CPU the sampler took, from its ready line and footer, for ``records`` records: ``cpu_s`` in all,
    ``cpu_startup_s`` until it was ready, the BPF program's own run time and runs, and ``cpu_per_sample_ms``
    (see :func:`summary`)."""
    foot, ready = log.footer or {}, log.ready or {}
    startup_us = ready.get("cpu_user_us", 0) + ready.get("cpu_sys_us", 0) if ready else None
    total_us = foot["cpu_user_us"] + foot["cpu_sys_us"] if log.footer else None
    prog_ns = foot.get("prog_run_ns", -1)
    steady_us = total_us - (startup_us or 0) if total_us is not None else None
    per_sample = None
    if steady_us is not None and records and prog_ns >= 0:
        per_sample = (steady_us / 1000 + prog_ns / 1e6) / records
    return {
        "cpu_s": total_us / 1e6 if total_us is not None else None,
        "cpu_startup_s": startup_us / 1e6 if startup_us is not None else None,
        "bpf_prog_s": prog_ns / 1e9 if prog_ns >= 0 else None,
        "bpf_prog_runs": foot.get("prog_runs"),
        "cpu_per_sample_ms": per_sample,
    }


def summary(text: str | BpfLog) -> dict:
    """What a run record keeps about the BPF sampler (the same keys as the netlink sampler's summary).

    ``cpu_per_sample_ms`` is the loader's CPU after it was ready plus the BPF program's own run time
    (every run, sampling or not: BPF_STATS_RUN_TIME), per record; ``cpu_startup_s`` the loader's CPU
    until then (loading the program, relocating against the kernel's BTF).
    """
    log = text if isinstance(text, BpfLog) else parse_log(text)
    foot = log.footer or {}
    records = len(log.records)
    first_of_slot: dict[int, int] = {}
    per_slot: dict[int, int] = defaultdict(int)
    for r in log.records:
        first_of_slot[r["slot"]] = min(first_of_slot.get(r["slot"], r["mono_ns"]), r["mono_ns"])
        per_slot[r["slot"]] += 1
    return {
        "kind": "bpf",
        "asked_interval_ms": log.header.get("interval_ns", 0) / 1e6,
        "samples": records,
        "slots": len(first_of_slot),
        "missed_ticks": missed_slots(log.records),
        **cpu_numbers(log, records),
        "dropped": foot.get("dropped"),
        "interval": interval_stats(sorted(first_of_slot.values())),
        "request_median_ms": None,
        "sockets_discovered": sorted({r["sport"] for r in log.records}),
        "ended": foot.get("reason", "killed (no footer)"),
        "errors": log.errors,
        "median_records_per_slot": statistics.median(  # records per slot, counted once (not per slot: quadratic)
            [per_slot[s] for s in first_of_slot]) if first_of_slot else None,
    }
