"""The streamed readers (issue 35, item 5) give what the whole-text readers gave, on every real log we have.

The socket-sample log is read a line at a time by :mod:`bbrlab.sampling.logscan` (rows, summary numbers, the guest
sample times) and the vCPU trace reader's raw text by :func:`bbrlab.sampling.vcputrace.read_trace`; both are
compared here with the readers that took the whole text (kept: they are the definition), on the fixtures under
tests/fixtures/sockdiag and tests/fixtures/vcputrace and on the sampled runs of data/demo-sampled (read only).
Functional, not timed: benchmarks/memory.py measures the memory.
"""

from __future__ import annotations

import dataclasses
import gzip
import random
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.analysis import evidence, frames
from bbrlab.run.clocks import ClockDrift
from bbrlab.sampling import alignment, logscan, sockdiag, vcputrace
from bbrlab.sampling import vcpuparse as vp
from bbrlab.sampling.ss import parse_ss_log
from bbrlab.sampling.summary import _ss_numbers

ROOT = Path(__file__).parents[3]
SOCK = ROOT / "tests" / "fixtures" / "sockdiag"
TRACES = ROOT / "tests" / "fixtures" / "vcputrace"
LOGS = [(p.name, "ss" if ".ss." in p.name else "bpf" if ".bpf." in p.name else "netlink")
        for p in sorted(SOCK.iterdir()) if p.name.endswith((".log", ".log.gz"))]
DEMO = sorted((ROOT / "data" / "demo-sampled" / "runs").glob("*/samples.log"))


def _text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text(errors="replace")


def _whole(kind: str, text: str, ports=None):
    """Rows, numbers and guest times as the whole-text readers give them (or the error they raise)."""
    try:
        rows = parse_ss_log(text, ports=ports) if kind == "ss" else sockdiag.rows(text, ports=ports)
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        rows = repr(e)
    numbers = _ss_numbers(text) if kind == "ss" else _or_error(sockdiag.summary, text)
    times = _or_error(alignment.guest_sample_times_ns, text, kind)
    return rows, numbers, times


def _streamed(kind: str, path: Path, ports=None):
    try:
        rows = logscan.rows(kind, path, ports)
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        rows = repr(e)
    numbers = _or_error(logscan.scan, kind, path, ports, lambda r: None, check=False)
    return rows, numbers, _or_error(logscan.guest_sample_times_ns, kind, path)


def _or_error(f, *args, **kw):
    try:
        return f(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        return repr(e)


@pytest.mark.parametrize(("name", "kind"), LOGS, ids=[n for n, _ in LOGS])
def test_a_fixture_log_reads_the_same_streamed(tmp_path, name, kind):
    text = _text(SOCK / name)
    (tmp_path / "log").write_text(text)
    assert _streamed(kind, tmp_path / "log") == _whole(kind, text)


@pytest.mark.parametrize("log", DEMO, ids=[p.parent.name for p in DEMO])
def test_a_committed_bpf_log_reads_the_same_streamed_with_and_without_its_ports(log):
    text = log.read_text()
    assert _streamed("bpf", log) == _whole("bpf", text)
    port = logscan.rows("bpf", log)[0]["port"]
    assert _streamed("bpf", log, [port]) == _whole("bpf", text, [port])


def test_a_bpf_log_out_of_slot_order_reads_the_same_streamed(tmp_path):
    """The ring buffer does not promise order: records shuffled (a real log's) are sorted back by slot and time."""
    lines = _text(SOCK / "live-bbr-both.bpf.log.gz").splitlines(keepends=True)
    records = [line for line in lines if line.startswith("R ")]
    random.Random(35).shuffle(records)
    text = "".join(lines[:2] + records + [line for line in lines[2:] if not line.startswith("R ")])
    (tmp_path / "log").write_text(text)
    assert _streamed("bpf", tmp_path / "log") == _whole("bpf", text)


def test_a_failing_check_reads_the_same_streamed(tmp_path):
    """A BBR socket without BBR's info raises the same error, after the same rows."""
    text = _text(SOCK / "live-bbr.sockdiag.log.gz")
    stripped = "\n".join(" ".join(w for w in line.split() if not w.startswith("16:")) if line.startswith("S ")
                         else line for line in text.splitlines()) + "\n"
    (tmp_path / "log").write_text(stripped)
    whole, streamed = _whole("netlink", stripped), _streamed("netlink", tmp_path / "log")
    assert "INET_DIAG_BBRINFO" in whole[0] and streamed == whole


TRACE_CASES = [("deadline-1ms-4ms.txt", 24769), ("sleeper-2ms-on-5ms-off.txt", 24855),
               ("testbed-sender-vcpu-other.txt.gz", 9726), ("deadline-qemu-vcpu-1ms-25pct.txt.gz", 2653)]


def _trace_whole(text: str, tid: int, capped: bool = False) -> vcputrace.VcpuTrace:
    """As TraceSession.stop built it before: the whole text, split into lines."""
    return vcputrace.build("x", [tid], iter(text.splitlines()), bytes_read=len(text), capped=capped, lost_events=3,
                           reader_cpu_s=vp.parse_times(text))


@pytest.mark.parametrize(("name", "tid"), TRACE_CASES, ids=[n for n, _ in TRACE_CASES])
def test_a_fixture_trace_reads_the_same_streamed(tmp_path, name, tid):
    text = _text(TRACES / name) + "real\t0m0.010s\n0m0.021s 0m0.032s\n0m0.043s 0m0.054s\n"
    (tmp_path / "trace.txt").write_text(text)
    streamed = vcputrace.read_trace("x", [tid], tmp_path / "trace.txt", lost_events=3)
    whole = _trace_whole(text, tid)
    assert dataclasses.asdict(streamed) == dataclasses.asdict(whole)
    assert streamed.summary() == whole.summary() and streamed.reader_cpu_s == 0.15


def test_a_capped_trace_reads_the_same_streamed(tmp_path):
    """A trace cut at its cap (no end exchange; the reader's 'bbrlab-capped' line) ends at its last event."""
    lines = _text(TRACES / "testbed-sender-vcpu-other.txt.gz").splitlines()
    text = "\n".join(lines[: len(lines) // 2]) + "\nbbrlab-capped 123456\n"
    (tmp_path / "trace.txt").write_text(text)
    streamed = vcputrace.read_trace("x", [9726], tmp_path / "trace.txt", lost_events=3)
    assert streamed.capped and dataclasses.asdict(streamed) == dataclasses.asdict(_trace_whole(text, 9726, True))


# -- ingestion: the ss and vcpu tables read in chunks, columns typed as they come ----------------------------

RUNS = sorted((ROOT / "data" / "demo-sampled" / "runs").iterdir())
#: make test reads one run per CCA (each 5-8 s); the other committed runs are read by make test-slow.
FIRST_OF_EACH_CCA = {p.name.split("-")[0]: p for p in reversed(RUNS)}.values()
RUN_PARAMS = [pytest.param(p, id=p.name, marks=() if p in FIRST_OF_EACH_CCA else pytest.mark.slow) for p in RUNS]


@pytest.mark.parametrize("run", RUN_PARAMS)
def test_a_committed_run_ingests_the_same_rows_streamed(run, monkeypatch):
    """The ``ss`` rows of a committed run (samples.log, its clock) and its ``vcpu`` rows (vcpu.csv), read in
    chunks of a few rows, equal the whole-text readers. rows, typed as the tables type them."""
    import json

    from bbrlab.analysis import records_reader as rr
    from bbrlab.analysis import tables

    monkeypatch.setattr(rr, "VCPU_CHUNK_ROWS", 97)  # several chunks of vcpu.csv even for a 10 s run
    record = json.loads((run / "record.json").read_text())
    clock = ClockDrift.from_dict(record["metadata"]["clocks"]["sender"])
    ports = set(record["metadata"]["flow"]["client_ports"])
    streamed, span = rr.ss_frame("r", run / "samples.log", ports, log="samples.log", sender_clock=clock)
    whole = rr.ss_rows("r", (run / "samples.log").read_text(), ports, log="samples.log", sender_clock=clock)
    pd.testing.assert_frame_equal(streamed, frames.typed_frame(whole, tables.SS_SCHEMA))
    assert span == evidence.samples_span_s(whole) and span > 10
    notes: list[str] = []
    vcpu = rr.vcpu_frame("r", run / "vcpu.csv", notes, "r")
    rows = rr.vcpu_rows("r", run / "vcpu.csv", notes, "r")
    # the rows typed by the old path held woken_ns as float64 on the way (its <NA>s): rounded to 128-256 ns; the
    # CSV's own integers are compared, exact
    assert [None if pd.isna(v) else int(v) for v in vcpu["woken_ns"]] == [r["woken_ns"] for r in rows]
    pd.testing.assert_frame_equal(vcpu.drop(columns="woken_ns"),
                                  frames.typed_frame(rows, tables.VCPU_SCHEMA).drop(columns="woken_ns"))
    assert not notes and len(vcpu) > 1000


def test_a_vcpu_csv_without_the_inferred_column_or_unreadable_reads_as_before(tmp_path):
    from bbrlab.analysis import records_reader as rr
    from bbrlab.analysis import tables

    lines = (RUNS[0] / "vcpu.csv").read_text().splitlines()
    old = "\n".join(line.rsplit(",", 1)[0] for line in lines) + "\n"  # made before the inferred column
    (tmp_path / "vcpu.csv").write_text(old)
    notes: list[str] = []
    pd.testing.assert_frame_equal(rr.vcpu_frame("r", tmp_path / "vcpu.csv", notes, "r").drop(columns="woken_ns"),
                                  frames.typed_frame(rr.vcpu_rows("r", tmp_path / "vcpu.csv", notes, "r"),
                                                     tables.VCPU_SCHEMA).drop(columns="woken_ns"))
    (tmp_path / "vcpu.csv").write_text(lines[0] + "\n4281,on,notanumber,1,1,0,,,0,\n")
    new_notes, old_notes = [], []
    assert rr.vcpu_frame("r", tmp_path / "vcpu.csv", new_notes, "r") == [] == \
        rr.vcpu_rows("r", tmp_path / "vcpu.csv", old_notes, "r")
    assert len(new_notes) == len(old_notes) == 1


#: SHA-256 of vcpu.csv and of the on-CPU intervals' JSON as the trace wrote them when it kept a Python object per
#: interval (bbrlab at 9830ade, before the intervals were held column by column), for each fixture trace.
OBJECT_PER_INTERVAL = {
    "deadline-1ms-4ms.txt": ("80016539cce18b1ed11fa38dfb57ba19662a6eb1cee26febd3e987e142393c87",
                             "7f6409ba766cf1cccb8719c76f97585991e5bc7d9a3961230c270e1269dafb73"),
    "sleeper-2ms-on-5ms-off.txt": ("d6ee42fadeea76a97935e34c873659af665323267041a92723f2a1b3ed4f1c8b",
                                   "aa6a008dbd89fb7ee78d99c0c69d9892cb9ffe200f9f11164d0d4b7e4419675c"),
    "testbed-sender-vcpu-other.txt.gz": ("846c890f666e4e85ae516a725a1b92e4d884179f0a1f6be10ffda56671078ce7",
                                         "f919df30e77199024ca5b2814aedd7489e76278eba787ca1e37f1b21e02d34c3"),
    "deadline-qemu-vcpu-1ms-25pct.txt.gz": ("c4d0b7bb24220f9469083f9edc05ec461b2b900d20bf1892d21869394f1a9083",
                                            "06002987b81281304a54413ffb3a8c247b41b52803011ace6ac84531b4c5c20f"),
}


@pytest.mark.parametrize(("name", "tid"), TRACE_CASES, ids=[n for n, _ in TRACE_CASES])
def test_intervals_held_column_by_column_write_what_objects_wrote(tmp_path, name, tid):
    import hashlib
    import json

    trace = _trace_whole(_text(TRACES / name), tid)
    trace.write_csv(tmp_path / "vcpu.csv")
    csv_sha, on_sha = OBJECT_PER_INTERVAL[name]
    assert hashlib.sha256((tmp_path / "vcpu.csv").read_bytes()).hexdigest() == csv_sha
    assert hashlib.sha256(json.dumps(trace.on_intervals_realtime()).encode()).hexdigest() == on_sha
    assert list(trace.intervals) == [trace.intervals[i] for i in range(len(trace.intervals))]


@pytest.mark.parametrize(("name", "tid"), TRACE_CASES, ids=[n for n, _ in TRACE_CASES])
def test_the_alignment_counts_at_once_what_it_counted_sample_by_sample(name, tid):
    """On a real trace's on-CPU intervals, 5000 times spread over its window (and past both ends), with and without
    slack: the numpy count equals the sum of the per-sample test."""
    import numpy as np

    trace = _trace_whole(_text(TRACES / name), tid)
    pairs = trace.on_intervals_realtime()
    starts, ends = [s for s, _ in pairs], [e for _, e in pairs]
    lo, hi = trace.window_realtime()
    times = np.random.default_rng(35).integers(lo - 5_000_000, hi + 5_000_000, 5000)
    for slack in (0, 100_000):
        assert alignment._inside_count(times, *trace.on_spans_realtime(), slack) == \
            sum(alignment._inside(int(t), starts, ends, slack) for t in times)


def test_a_table_written_in_slices_reads_back_as_written_whole(tmp_path, monkeypatch):
    """The ss and vcpu tables of the committed sampled runs, written 1000 rows at a time, read back equal to the
    tables and to what one to_parquet call wrote."""
    from bbrlab.analysis import data, table_cache, tables

    monkeypatch.setattr(table_cache, "PARQUET_SLICE_ROWS", 1000)
    t = data.load(ROOT / "data" / "demo-sampled", cache=False)
    for name in ("ss", "vcpu", "runs"):
        frame = getattr(t, name)
        table_cache._write_parquet(frame, tmp_path / f"{name}.sliced")
        frame.to_parquet(tmp_path / f"{name}.whole", index=False)
        sliced, whole = (frames.typed_frame(pd.read_parquet(tmp_path / f"{name}.{how}"), tables.SCHEMAS[name])
                         for how in ("sliced", "whole"))
        pd.testing.assert_frame_equal(sliced, whole)
        pd.testing.assert_frame_equal(sliced, frame.reset_index(drop=True))
    assert len(t.vcpu) > 1000 and len(t.ss) > 1000


def test_intervals_of_several_threads_merge_as_sorted_objects_did():
    """Two threads of a real trace (the vCPU and QEMU's main thread): the columns merged by (start, thread) equal the
    intervals as objects sorted by the same key, stably."""
    text = _text(TRACES / "testbed-sender-vcpu-other.txt.gz")
    events = [e for e in map(vp.parse_line, text.splitlines()) if e is not None and e.kind != "marker"]
    window = (events[0].mono_ns, events[-1].mono_ns)
    lines = vp.timelines(events, {9726: window, 9722: window}, {})
    expected = sorted((iv for line in lines.values() for iv in line.intervals), key=lambda iv: (iv.start_ns, iv.tid))
    assert len({iv.tid for iv in expected}) == 2
    assert list(vp.IntervalColumns.merged([line.intervals for line in lines.values()])) == expected


def test_freed_heap_memory_is_given_back_after_a_large_read():
    """What the ingest calls after a large log (bbrlab.analysis.heap): on this glibc machine it finds malloc_trim,
    and after 300,000 malloc'd strings (over the 512-byte objects Python's own arenas hold) are freed, the process's
    resident size falls by more than half of what they took. Measured here, 10 runs each: 178 MB taken; without
    give_back 173 MB of it stays, with it 38-41 MB."""
    from bbrlab.analysis import heap

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    assert heap._malloc_trim() is not None
    before = rss_mb()
    held = [b"%d" % i * 100 for i in range(300_000)]
    last = held[-1:]  # one object kept at the heap's top: the middle must be given back, not only the top
    taken = rss_mb() - before
    del held
    heap.give_back()
    assert taken > 100 and rss_mb() - before < taken / 2, last


@pytest.mark.parametrize(("name", "tid"), TRACE_CASES, ids=[n for n, _ in TRACE_CASES])
def test_on_cpu_sums_by_column_equal_the_sums_interval_by_interval(name, tid):
    """The schedstat comparison's on-CPU sums and running-for lags, taken column by column (they took 1.0 s of a
    10 s sampled run's 2.8 s trace read interval by interval), equal the sums over the Interval objects."""
    lines = vp.timelines((e for e in map(vp.parse_line, _text(TRACES / name).splitlines()) if e is not None
                          and e.kind != "marker"), {tid: (0, 2**62)}, {tid: False})
    line = lines[tid]
    intervals = list(line.intervals)
    assert intervals
    starts = sorted({iv.start_ns for iv in intervals})
    probes = [starts[0] - 1, starts[len(starts) // 3], starts[len(starts) // 2] + 1, starts[-1], 2**62]
    for t0, t1 in [(probes[0], probes[-1]), (probes[1], probes[2]), (probes[2], probes[3])]:
        for accounting in (False, True):
            want = 0
            for iv in intervals:
                s, e = iv.start_ns, iv.end_ns
                if accounting and iv.accounted_start_ns is not None:
                    s, e = iv.accounted_start_ns, iv.accounted_end_ns
                if iv.on and e > t0 and s < t1:
                    want += min(e, t1) - max(s, t0)
            assert vcputrace._on_ns(line, t0, t1, to_accounting=accounting) == want
    for at in probes:
        want = next((at - iv.start_ns for iv in intervals if iv.on and iv.start_ns <= at < iv.end_ns), 0)
        assert vcputrace._running_for(line, at) == want
