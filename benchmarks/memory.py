"""Peak memory of checking and ingesting the largest run the spec bounds allow (issue 35, item 5): under 300 MB.

A SYNTHETIC run as large as the bounds allow (benchmarks/_largest_run.py: a BPF sampler log of 500,000 records and a
vCPU trace at the reader's 256 MiB cap, made of real logs repeated) is written into a temporary directory, never
into ``data/``. Each step (benchmarks/_memory_step.py: the checks of the socket samples, the vCPU trace and the
alignment, then ``bbrlab ingest``) runs in a child of a fresh intermediate process, which reports
``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the child's peak resident set. A step that has not ended after
``BBRLAB_BENCH_STEP_S`` seconds (default 900) is stopped and reported so. The directory is removed afterwards;
``BBRLAB_BENCH_KEEP=DIR`` writes it into DIR and keeps it instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import _largest_run

TARGET_MB = 300
ROOT = Path(__file__).resolve().parents[1]
_MEASURE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_mb(step: str, where: Path, timeout_s: float) -> tuple[float | None, float]:
    """The peak RSS (MB, 10^6 bytes) and wall time (s) of one step in its own process (None: not ended in time)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _MEASURE, sys.executable, "-m", "benchmarks._memory_step", step,
                             str(where)], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return None, time.monotonic() - t0
    if proc.returncode:
        raise RuntimeError(f"step {step} failed (exit {proc.returncode})")
    return int(out.split()[-1]) * 1024 / 1e6, time.monotonic() - t0


def main() -> None:
    """Print each step's peak RSS against the target."""
    keep = os.environ.get("BBRLAB_BENCH_KEEP")
    top = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="bbrlab-bench-memory-"))
    try:
        t0 = time.monotonic()
        run = _largest_run.make(top / _largest_run.CAMPAIGN)
        sizes = {p.name: p.stat().st_size / 1e6 for p in run.iterdir()}
        print(f"synthetic largest run in {time.monotonic() - t0:.0f} s: " +
              ", ".join(f"{n} {mb:.0f} MB" for n, mb in sorted(sizes.items())))
        timeout_s = float(os.environ.get("BBRLAB_BENCH_STEP_S", "900"))
        steps = [a for a in sys.argv[1:] if a in ("samples", "trace", "ingest")] or ["samples", "trace", "ingest"]
        for step in steps:
            mb, s = peak_mb(step, run.parent.parent if step == "ingest" else run, timeout_s)
            if mb is None:
                print(f"{step:>8}: did not end within {timeout_s:.0f} s")
                continue
            print(f"{step:>8}: peak RSS {mb:6.0f} MB ({mb / TARGET_MB:.2f}x the {TARGET_MB} MB target) in {s:.0f} s",
                  flush=True)
    finally:
        if not keep:
            shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
