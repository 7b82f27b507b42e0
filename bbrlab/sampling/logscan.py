"""A sampler's log read from its file in one pass, in memory that does not grow with its rows.

A run's socket-sample log may hold :data:`~bbrlab.scenario.sampling_limits.MAX_SAMPLE_RECORDS` samples (about 350 MB).
Read whole, split into lines, parsed into every sample's raw attributes and then into rows, it took about
1.4 GB; :func:`scan` reads it a line at a time instead and hands each data-stream row to a callback as soon as
it is made, keeping only what the log's summary needs (one number or two per sample). It gives the rows of
:func:`bbrlab.sampling.summary.data_rows` in the same order and the numbers of
:func:`bbrlab.sampling.sockdiag.summary` (netlink, bpf) or of the ss loop's footer, and raises what they raise.

The BPF sampler's rows are ordered by slot and time, which its ring buffer does not guarantee: a first pass
keeps each record's slot, time, port and place in the file (numpy arrays, 32 bytes a record) and, when the
file is out of order, the second pass reads the records in sorted order by their places.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from . import sockdiag
from .sampler import parse_sampler_footer
from .sockdiag import bpf
from .sockdiag import parse as netlink
from .ss import sample_rows

RowSink = Callable[[dict], None]
_T_LINE = re.compile(r"^# t=([0-9.]+)\s*$")


def _lines(path: Path) -> Iterator[str]:
    """The file's lines without their ends, decoded as the old whole-file read did (bad bytes replaced)."""
    with open(path, errors="replace", newline=None) as f:
        for line in f:
            yield line.rstrip("\n")


def log_kind(path: Path) -> str:
    """``netlink`` or ``bpf`` from the log's first line (:class:`SockdiagLogError` for neither)."""
    with open(path, errors="replace") as f:
        return sockdiag.log_kind(f.readline())


def scan(kind: str, path: str | Path, ports: Iterable[int] | None, on_row: RowSink, *, check: bool = True,
         numbers: bool = True) -> dict:
    """Pass every row of the log at ``path`` (a sampler of ``kind``: ss, netlink or bpf; ``ports`` the data
    streams' local ports, None for all) to ``on_row``, in order; return the log's summary numbers (an empty dict
    without ``numbers``: the BPF log's per-slot numbers are then not computed)."""
    path = Path(path)
    keep = set(ports) if ports is not None else None
    if kind == "ss":
        return _ss(path, keep, on_row, check)
    actual = log_kind(path)
    if actual != kind:
        from bbrlab.core.errors import BbrlabError

        raise BbrlabError(f"the log is a {actual} sampler's, not a {kind} sampler's")
    if kind == "netlink":
        return _netlink(path, keep, on_row, check)
    return _bpf(path, keep, on_row, check, numbers)


#: What starts a line that may give a row, by kind of log (the ss loop: any line).
_ROW_LINE = {"bpf": b"\nR ", "netlink": b"\nS ", "ss": b"\n"}


def row_bound(kind: str, path: str | Path) -> int:
    """At least as many as the rows :func:`scan` can give from the log at ``path``: its lines that may hold one,
    counted in the file's bytes (a fast pass, 4 MiB at a time)."""
    pattern, count, tail = _ROW_LINE[kind], 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            data = tail + block
            count += data.count(pattern)
            tail = data[-(len(pattern) - 1):] if len(pattern) > 1 else b""
    return count + 1


def rows(kind: str, path: str | Path, ports: Iterable[int] | None = None, *, check: bool = True) -> list[dict]:
    """Every row of the log as a list (for tests and small logs)."""
    out: list[dict] = []
    scan(kind, path, ports, out.append, check=check)
    return out


# -- the ss loop ----------------------------------------------------------------------------------

def _ss(path: Path, keep: set[int] | None, on_row: RowSink, check: bool) -> dict:
    index, t0, current, lines = -1, None, None, []
    times_ns: list[int] = []
    footer_line = None

    def flush() -> None:
        for row in sample_rows(index, current, t0, lines, keep, check=check):
            on_row(row)

    for line in _lines(path):
        m = _T_LINE.match(line)
        if m:
            if current is not None:
                flush()
            current, lines, index = float(m.group(1)), [], index + 1
            t0 = current if t0 is None else t0
            times_ns.append(round(current * 1e9))
        elif line.startswith("#"):
            if footer_line is None and parse_sampler_footer(line):
                footer_line = line
        elif current is not None:
            lines.append(line)
    if current is not None:
        flush()
    footer = parse_sampler_footer(footer_line or "") or {}
    return {"samples": footer.get("samples"), "missed_ticks": None, "cpu_s": footer.get("cpu_s"),
            "cpu_per_sample_ms": footer.get("cpu_per_sample_ms"), "interval": netlink.interval_stats(times_ns),
            "ended": "stop_file" if footer else "killed (no footer)"}


# -- the netlink sampler --------------------------------------------------------------------------

class _NetlinkRows:
    """Rows of one netlink log as its samples complete, with the checks of :func:`sockdiag.parse.rows`; a
    failed check is kept (and the rows stop) until the log's errors are known, which take precedence."""

    def __init__(self, keep: set[int] | None, on_row: RowSink, check: bool, log: netlink.SockdiagLog):
        self.keep, self.on_row, self.check, self.log = keep, on_row, check, log
        self.t0: float | None = None
        self.failure: Exception | None = None
        self.bbr_has_bw: dict[int, bool] = {}

    def sample(self, index: int, sample: netlink.Sample) -> None:
        if self.failure is not None:
            return
        t_unix_s = sample.realtime_ns / 1e9
        for sock in sample.sockets:
            if self.keep is not None and sock.sport not in self.keep:
                continue
            if sock.state != netlink.ESTABLISHED:
                continue
            row = netlink.socket_row(sock, self.log.discovered.get(sock.sport))
            if self.check:
                try:
                    netlink._check(row, sample)
                except netlink.SockdiagLogError as e:
                    self.failure = e
                    return
                if (row["cca"] or "").startswith("bbr"):
                    self.bbr_has_bw[row["port"]] = self.bbr_has_bw.get(row["port"], False) or row["bw_mbit"] is not None
            self.on_row({"sample": index, "t_unix_s": t_unix_s, "t_mono_s": sample.monotonic_ns / 1e9,
                         "t_s": t_unix_s - self.t0, **row})

    def finish(self) -> None:
        if self.check and self.log.errors:
            raise netlink.SockdiagLogError(f"the sockdiag sampler failed: {'; '.join(self.log.errors)}")
        if self.failure is not None:
            raise self.failure
        for port in sorted(p for p, has in self.bbr_has_bw.items() if not has):
            raise netlink.SockdiagFieldsMissing(
                f"socket :{port} runs BBR but came without INET_DIAG_BBRINFO (bw, mrtt, pacing_gain, cwnd_gain) in "
                "every sample")


def _netlink(path: Path, keep: set[int] | None, on_row: RowSink, check: bool) -> dict:
    lines = _lines(path)
    header = netlink.read_header([next(lines, "")], netlink.MAGIC, netlink.FORMAT, "sockdiag sampler")
    log = netlink.SockdiagLog(header, {}, [], {}, [], None)
    out = _NetlinkRows(keep, on_row, check, log)
    samples, monotonic_ns, request_ms = 0, array("q"), array("d")
    for sample in netlink.samples_of(log, enumerate(lines, start=2)):
        monotonic_ns.append(sample.monotonic_ns)
        out.t0 = sample.realtime_ns / 1e9 if out.t0 is None else out.t0
        if sample.sockets:
            request_ms.append(sample.request_ns / 1e6)
        out.sample(samples, sample)
        samples += 1
    out.finish()
    return netlink.summary_numbers(log, samples, monotonic_ns.tolist(), np.sort(np.frombuffer(request_ms)).tolist())


# -- the BPF sampler ------------------------------------------------------------------------------

def _record_lines(path: Path) -> Iterator[tuple[int, int, str]]:
    """``(line number, byte offset, text)`` of every line (the offset lets a record be read again)."""
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            yield number, offset, raw.decode(errors="replace").rstrip("\r\n")
            offset += len(raw)


def _decode(number: int, line: str) -> dict:
    try:
        return bpf.decode_record(bytes.fromhex(line.split()[4]))
    except (ValueError, IndexError) as e:
        raise netlink.SockdiagLogError(f"line {number} of the BPF sampler log is malformed ({e}): {line[:100]!r}") \
            from None


def _bpf(path: Path, keep: set[int] | None, on_row: RowSink, check: bool, numbers: bool = True) -> dict:
    log = bpf.BpfLog({}, [], [], None)
    slot, mono, sport, where = array("Q"), array("Q"), array("q"), array("q")  # 8 bytes a record each
    for number, offset, line in _record_lines(path):
        if number == 1:
            log.header = netlink.read_header([line], bpf.MAGIC, bpf.FORMAT, "BPF sampler")
            if log.header.get("record_size") != bpf.RECORD.size:
                raise netlink.SockdiagLogError(f"BPF sampler records of {log.header.get('record_size')} bytes, this "
                                               f"bbrlab reads {bpf.RECORD.size}")
        elif line.startswith("R "):
            rec = _decode(number, line)
            slot.append(rec["slot"]), mono.append(rec["mono_ns"]), sport.append(rec["sport"])
            where.append(offset)
        elif line.startswith("# error "):
            log.errors.append(line[len("# error "):])
        elif line.startswith("# end "):
            log.footer = netlink._key_values(line.split()[2:])
        elif line.startswith("# ready "):
            log.ready = netlink._key_values(line.split()[2:])
        elif line.strip():
            log.stderr.append(line)
    if check and log.errors:
        raise netlink.SockdiagLogError(f"the BPF sampler failed: {'; '.join(log.errors)}")
    slots, monos = np.frombuffer(slot, dtype=np.uint64), np.frombuffer(mono, dtype=np.uint64)
    ports, offsets = np.frombuffer(sport, dtype=np.int64), np.frombuffer(where, dtype=np.int64)
    _bpf_rows(path, log, slots, monos, offsets, keep, on_row, check)
    return _bpf_numbers(log, slots, monos, ports) if numbers else {}


def _sorted_records(path: Path, order: np.ndarray, offsets: np.ndarray) -> Iterator[dict]:
    """The records in ``order`` (indices into the file's records): in one sequential read when the file is in
    that order already, else read back one by one at their byte offsets."""
    if len(order) < 2 or bool(np.all(order[1:] > order[:-1])):
        for number, _, line in _record_lines(path):
            if number > 1 and line.startswith("R "):
                yield _decode(number, line)
        return
    with open(path, "rb") as f:
        for i in order:
            f.seek(int(offsets[i]))
            yield _decode(0, f.readline().decode(errors="replace").rstrip("\r\n"))


def _bpf_rows(path: Path, log: bpf.BpfLog, slots: np.ndarray, monos: np.ndarray, offsets: np.ndarray,
              keep: set[int] | None, on_row: RowSink, check: bool) -> None:
    """The rows of :func:`bpf.rows`, in its order (by slot, then time; stable), with its checks."""
    if not len(slots):
        return
    order = np.lexsort((monos, slots))
    distinct = np.unique(slots)
    offset = log.realtime_offset_ns
    first = int(order[0])
    t0 = (int(monos[first]) + offset) / 1e9
    no_cca: int | None = None
    bbr: dict[int, tuple[set[str], bool]] = {}
    for rec in _sorted_records(path, order, offsets):
        if keep is not None and rec["sport"] not in keep:
            continue
        if rec["state"] != netlink.ESTABLISHED:
            continue
        row = bpf.record_row(rec)
        t_unix_s = (rec["mono_ns"] + offset) / 1e9
        on_row({"sample": int(np.searchsorted(distinct, rec["slot"])), "t_unix_s": t_unix_s,
                "t_mono_s": rec["mono_ns"] / 1e9, "t_s": t_unix_s - t0, **row})
        if check:
            if not row["cca"] and no_cca is None:
                no_cca = row["port"]
            elif row["cca"] and row["cca"].startswith("bbr"):
                names, has_bw = bbr.get(row["port"], (set(), False))
                names.add(row["cca"])
                bbr[row["port"]] = (names, has_bw or row["bw_mbit"] is not None)
    if no_cca is not None:
        raise netlink.SockdiagFieldsMissing(f"socket :{no_cca}: a record without its congestion control")
    for port in sorted(bbr):
        names, has_bw = bbr[port]
        if not has_bw:
            raise netlink.SockdiagFieldsMissing(
                f"socket :{port} runs {', '.join(sorted(names))}, whose private state this bbrlab cannot decode (it "
                f"knows the layout of {', '.join(sorted(bpf.BBR1_LAYOUT))}): no bw, mrtt or gains")


def _bpf_numbers(log: bpf.BpfLog, slots: np.ndarray, monos: np.ndarray, ports: np.ndarray) -> dict:
    """:func:`bpf.summary`'s numbers from the records' slots, times and ports."""
    foot = log.footer or {}
    records = len(slots)
    distinct, first_index, per_slot = np.unique(slots, return_index=True, return_counts=True)
    by_slot = np.lexsort((monos, slots))  # each slot's earliest record first
    firsts = monos[by_slot][np.searchsorted(slots[by_slot], distinct)] if len(slots) else monos
    missed = 0
    for port in np.unique(ports):
        mine = np.unique(slots[ports == port])
        missed += int(mine[-1]) - int(mine[0]) + 1 - len(mine)
    counts = np.sort(per_slot[np.argsort(first_index, kind="stable")])
    return {
        "kind": "bpf",
        "asked_interval_ms": log.header.get("interval_ns", 0) / 1e6,
        "samples": records,
        "slots": len(distinct),
        "missed_ticks": missed,
        **bpf.cpu_numbers(log, records),
        "dropped": foot.get("dropped"),
        "interval": netlink.interval_stats(np.sort(firsts).tolist()),
        "request_median_ms": None,
        "sockets_discovered": sorted(int(p) for p in np.unique(ports)),
        "ended": foot.get("reason", "killed (no footer)"),
        "errors": log.errors,
        "median_records_per_slot": _median(counts) if len(counts) else None,
    }


def _median(sorted_counts: np.ndarray) -> int | float:
    """:func:`statistics.median` of whole numbers already sorted: the middle one, or the mean of the middle two."""
    n = len(sorted_counts)
    if n % 2:
        return int(sorted_counts[n // 2])
    return (int(sorted_counts[n // 2 - 1]) + int(sorted_counts[n // 2])) / 2


def guest_sample_times_ns(kind: str, path: str | Path) -> list[int]:
    """:func:`bbrlab.sampling.alignment.guest_sample_times_ns` read a line at a time from the log's file."""
    path = Path(path)
    if kind == "ss":
        out = []
        for line in _lines(path):
            m = re.match(r"^# t=(\d+)[.,](\d+)\s*$", line)
            if m:
                out.append(int(m.group(1)) * 1_000_000_000 + int(m.group(2).ljust(9, "0")[:9]))
        return out
    if kind == "bpf":
        header, times = None, array("Q")
        for number, _, line in _record_lines(path):
            if number == 1:
                header = netlink.read_header([line], bpf.MAGIC, bpf.FORMAT, "BPF sampler")
            elif line.startswith("R "):
                times.append(_decode(number, line)["mono_ns"])
        if header is None:
            netlink.read_header([], bpf.MAGIC, bpf.FORMAT, "BPF sampler")
        offset = int(header.get("realtime_minus_monotonic_ns", 0))
        return [t + offset for t in np.unique(np.frombuffer(times, dtype=np.uint64)).tolist()]
    lines = _lines(path)
    netlink.read_header([next(lines, "")], netlink.MAGIC, netlink.FORMAT, "sockdiag sampler")
    return [int(line.split()[2]) for line in lines if line.startswith("T ")]
