"""One step of the memory benchmark, run in a process of its own: ``samples RUN_DIR``, ``trace RUN_DIR`` or
``ingest CAMPAIGN_DIR``.

``samples`` and ``trace`` do what a run's checks do with its evidence: bbrlab.run.checks.samples on the
socket-sample log; the vCPU trace built from the reader's raw text, written as vcpu.csv, and the samples' alignment
with it. Each writes its summary into the run's record. ``ingest`` reads the campaign into its tables
(``bbrlab ingest``). Written against the entry points bbrlab has had before and after the logs were streamed,
so the same step measures either (benchmarks/memory.py prints both).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bbrlab.run import checks
from bbrlab.sampling import alignment, vcputrace
from bbrlab.sampling import vcpuparse as vp
from bbrlab.sampling.sampler import Sampler

from ._largest_run import PORT, SAMPLE_MS, TID


def _trace(run: Path) -> vcputrace.VcpuTrace:
    raw = run / "trace.txt"
    if hasattr(vcputrace, "read_trace"):
        return vcputrace.read_trace("synthetic", [TID], raw, lost_events=0)
    text = raw.read_text(errors="replace")  # as TraceSession.stop read it before
    return vcputrace.build("synthetic", [TID], iter(text.splitlines()), bytes_read=len(text),
                           capped="\nbbrlab-capped " in text, lost_events=0, reader_cpu_s=vp.parse_times(text))


def _guest_times(log: Path) -> list[int]:
    try:
        from bbrlab.sampling import logscan
    except ImportError:
        return alignment.guest_sample_times_ns(log.read_text(errors="replace"), "bpf")
    return logscan.guest_sample_times_ns("bpf", log)


def _update_record(run: Path, **parts) -> None:
    record = json.loads((run / "record.json").read_text())
    record["metadata"].update(parts)
    (run / "record.json").write_text(json.dumps(record, indent=2) + "\n")


def samples(run: Path) -> None:
    sampled = Sampler("bpf", None, "/nonexistent", SAMPLE_MS, run / "samples.log", complete=True)
    if hasattr(sampled, "exit_code"):
        sampled.exit_code = 0
    summary, _ = checks.samples(sampled, [PORT], "bbr", SAMPLE_MS)
    _update_record(run, sampling=summary.to_dict())


def trace(run: Path) -> None:
    result = _trace(run)
    result.write_csv(run / "vcpu.csv")
    offset = alignment.ClockOffset.of_remote_minus_local(0.0, 0.0005)
    spans = result.on_spans_realtime() if hasattr(result, "on_spans_realtime") else result.on_intervals_realtime()
    aligned = alignment.check(_guest_times(run / "samples.log"), spans, offset, SAMPLE_MS,
                              result.window_realtime())
    _update_record(run, vcpu_trace={"file": "vcpu.csv", **result.summary()}, alignment=aligned.to_dict())


def ingest(campaign: Path) -> None:
    from bbrlab.analysis import data

    tables = data.load(campaign, force=True)
    print(f"ingested: {tables.counts()}", file=sys.stderr)


if __name__ == "__main__":
    step, where = sys.argv[1], Path(sys.argv[2])
    {"samples": samples, "trace": trace, "ingest": ingest}[step](where)
