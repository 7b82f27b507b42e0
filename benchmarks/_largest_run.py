"""A SYNTHETIC run directory as large as the spec bounds allow, for the memory benchmark (benchmarks/memory.py).

Nothing here was measured: the files are real logs repeated and shifted in time, written only into a
temporary directory the benchmark makes and removes, never into ``data/``. The campaign is named
``synthetic-largest-run`` and every file says so in its record.

- ``samples.log``: a BPF sampler log of :data:`~bbrlab.scenario.sampling_limits.MAX_SAMPLE_RECORDS` records (one stream
  sampled every 1 ms for 500 s, the most a flow may ask for), each a real record of
  tests/fixtures/sockdiag/live-bbr-both.bpf.log.gz with its time, slot and byte counters moved on;
- ``trace.txt``: the vCPU trace reader's raw text at its cap (:data:`bbrlab.sampling.vcputrace.MAX_BYTES`), the
  events of tests/fixtures/vcputrace/testbed-sender-vcpu-other.txt.gz repeated one after the other between the
  real start and end markers;
- ``record.json`` and ``iperf.json`` of a real run of data/demo-sampled, rewritten to the synthetic run's
  duration, interval and port (the record's sampling and trace summaries are filled in by the check step).
"""

from __future__ import annotations

import gzip
import json
import re
import struct
from pathlib import Path

from bbrlab.sampling import vcputrace
from bbrlab.scenario.sampling_limits import MAX_SAMPLE_RECORDS

ROOT = Path(__file__).resolve().parents[1]
BPF_FIXTURE = ROOT / "tests" / "fixtures" / "sockdiag" / "live-bbr-both.bpf.log.gz"
TRACE_FIXTURE = ROOT / "tests" / "fixtures" / "vcputrace" / "testbed-sender-vcpu-other.txt.gz"
RUN_FIXTURE = next((ROOT / "data" / "demo-sampled" / "runs").glob("bbr-ts1ms-sh25-*"))
CAMPAIGN = "synthetic-largest-run"
RUN_ID = "synthetic-largest-run-r00"
PORT, TID = 28900, 9726
SAMPLE_MS, DURATION_S = 1, MAX_SAMPLE_RECORDS // 1000  # one stream: 500 s at 1 ms is the bound exactly
_TIME = re.compile(r"(\s)(\d+)\.(\d{6}):")


def _bpf_log(out: Path, realtime_offset_ns: int, t0_mono_ns: int) -> None:
    """``MAX_SAMPLE_RECORDS`` records, one per 1 ms slot, cycling over the fixture's real records."""
    lines = gzip.decompress(BPF_FIXTURE.read_bytes()).decode().splitlines()
    header = re.sub(r"interval_ns=\d+", f"interval_ns={SAMPLE_MS * 1_000_000}", lines[0])
    header = re.sub(r"realtime_minus_monotonic_ns=\d+", f"realtime_minus_monotonic_ns={realtime_offset_ns}", header)
    records = [bytes.fromhex(line.split()[4]) for line in lines if line.startswith("R ")]
    sent_per_record = 12_500  # 100 Mbit/s over 1 ms
    with open(out, "w") as f:
        f.write(header + " synthetic=1\n# ready cpu_user_us=198733 cpu_sys_us=249390\n")
        for i in range(MAX_SAMPLE_RECORDS):
            rec = bytearray(records[i % len(records)])
            mono = t0_mono_ns + i * SAMPLE_MS * 1_000_000 + 250_000
            struct.pack_into("<4Q", rec, 0, mono, i, (i + 1) * sent_per_record, i * sent_per_record + 1)
            f.write(f"R {PORT} {i} {mono} {rec.hex()}\n")
        f.write(f"# end records={MAX_SAMPLE_RECORDS} dropped=0 drains=2000 prog_runs={3 * MAX_SAMPLE_RECORDS} "
                f"prog_run_ns=40000000000 cpu_user_us=100000000 cpu_sys_us=100000000 maxrss_kb=10184 "
                f"wall_ns={DURATION_S * 1_000_000_000} realtime_minus_monotonic_ns={realtime_offset_ns} "
                "reason=stop_file\n")


def _shift(line: str, by_us: int) -> str:
    def moved(m: re.Match) -> str:
        us = int(m.group(2)) * 1_000_000 + int(m.group(3)) + by_us
        return f"{m.group(1)}{us // 1_000_000}.{us % 1_000_000:06d}:"
    return _TIME.sub(moved, line, count=1)


def _trace(out: Path) -> tuple[int, int]:
    """The reader's raw text at the cap; returns the start marker's trace time and realtime in ns."""
    lines = gzip.decompress(TRACE_FIXTURE.read_bytes()).decode().splitlines()
    start = [ln for ln in lines if "tracing_mark_write: bbrlab-" in ln and " start" in ln]
    end = [ln for ln in lines if "tracing_mark_write: bbrlab-" in ln and " end" in ln]
    body = [ln for ln in lines if "tracing_mark_write" not in ln and _TIME.search(ln)]
    first_us = int(_TIME.search(body[0]).group(2)) * 1_000_000 + int(_TIME.search(body[0]).group(3))
    last_us = int(_TIME.search(body[-1]).group(2)) * 1_000_000 + int(_TIME.search(body[-1]).group(3))
    span_us = last_us - first_us + 100
    body_bytes = sum(len(ln) + 1 for ln in body)
    reps = (vcputrace.MAX_BYTES - 4096) // body_bytes
    run_start, run_end = (int(w) for w in re.search(r"bbrlab-st start \d+ (\d+)", start[2]).groups() +
                          re.search(r"bbrlab-st end \d+ (\d+)", end[2]).groups())
    with open(out, "w") as f:
        f.write("\n".join(start) + "\n")
        for k in range(reps):
            f.write("\n".join(_shift(ln, k * span_us) for ln in body) + "\n")
        moved = (reps - 1) * span_us
        for ln in end:
            if "bbrlab-st end" in ln:  # schedstat's run time grew as much as the repeated trace's
                ln = ln.replace(f" {run_end} ", f" {run_start + (run_end - run_start) * reps} ")
            if "bbrlab-rt end" in ln:
                sec, usec = re.search(r"bbrlab-rt end (\d+)\.(\d+)", ln).groups()
                rt = int(sec) * 1_000_000 + int(usec) + moved
                ln = re.sub(r"bbrlab-rt end \S+", f"bbrlab-rt end {rt // 1_000_000}.{rt % 1_000_000:06d}", ln)
            f.write(_shift(ln, moved) + "\n")
        f.write("real\t0m1.000s\nuser\t0m0.500s\nsys\t0m0.500s\n")
    m = re.search(r"(\d+)\.(\d{6}): tracing_mark_write: bbrlab-rt start (\d+)\.(\d+)", "\n".join(start))
    mono_ns = (int(m.group(1)) * 1_000_000 + int(m.group(2))) * 1000
    realtime_ns = (int(m.group(3)) * 1_000_000 + int(m.group(4))) * 1000
    return mono_ns, realtime_ns


def make(campaign_dir: Path) -> Path:
    """Write the synthetic campaign (one run) into ``campaign_dir``; returns the run's directory."""
    run = campaign_dir / "runs" / RUN_ID
    run.mkdir(parents=True)
    mono_ns, realtime_ns = _trace(run / "trace.txt")
    guest_t0_mono = 4_000_000_000_000
    # the guest's samples begin 1 s into the trace's window on the realtime clock
    _bpf_log(run / "samples.log", realtime_ns + 1_000_000_000 - guest_t0_mono, guest_t0_mono)
    record = json.loads((RUN_FIXTURE / "record.json").read_text())
    record.update(run_id=RUN_ID, campaign=CAMPAIGN, synthetic="made by benchmarks/_largest_run.py, not measured")
    record["scenario"]["flow"].update(duration_s=DURATION_S, sample_ms=SAMPLE_MS)
    record["metadata"]["flow"]["client_ports"] = [PORT]
    record["metadata"].pop("alignment", None)
    (run / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    report = json.loads((RUN_FIXTURE / "iperf.json").read_text())
    for c in report["start"]["connected"]:
        c["local_port"] = PORT
    (run / "iperf.json").write_text(json.dumps(report))
    return run
