"""The vCPU trace's own cost on the host: the reader's CPU per traced second (docs/vcpu-trace.md).

A busy thread on this machine (a spinning Python child: the events a busy vCPU thread gives, without starting a
QEMU on the shared testbed) is traced for ``BBRLAB_BENCH_TRACE_S`` seconds (default 10) at 100 % share and
under SCHED_DEADLINE 1 ms / 25 %. Printed per setting: events per second, the reader's host CPU (its own and
its children's, bash's ``times``) per traced second, and the trace's on-CPU time against schedstat's.
The kernel's cost of recording each event is not included (it is spent in the traced thread's context).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bbrlab.contention.deadline import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.sampling import vcputrace
from bbrlab.scenario.scenario import Contention

SETTINGS = (Contention(10, 100), Contention(1, 25))


def _one(contention: Contention, seconds: float) -> dict:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        host = LocalHost()
        with contended(host, [spinner.pid], contention), vcputrace.traced(host, [spinner.pid]) as trace:
            time.sleep(seconds)
        return trace.result.summary()
    finally:
        spinner.kill()
        spinner.wait()


def main() -> None:
    """Print the tracer's host CPU per traced second at 100 % and at 1 ms / 25 %."""
    seconds = float(os.environ.get("BBRLAB_BENCH_TRACE_S", "10"))
    print(f"load average at start: {os.getloadavg()}")
    for c in SETTINGS:
        s = _one(c, seconds)
        [cmp] = s["schedstat"]
        label = "100 %" if c.unlimited else f"{c.timeslice_ms:g} ms / {c.cpu_share_pct:g} %"
        print(f"{label:>12}: traced {s['traced_s']:.2f} s, {s['events'] / s['traced_s']:.0f} events/s, "
              f"reader CPU {s['reader_cpu_per_traced_s_ms']} ms per traced s ({s['reader_cpu_s']} s), "
              f"on-CPU share {s['on_cpu_share']:.3f}, gaps p50 {s['gaps']['p50_ms']} ms max {s['gaps']['max_ms']} ms, "
              f"trace vs schedstat {100 * cmp['relative_diff']:+.2f} %, lost {s['lost_events']}, "
              f"inferred switch-ins {s['inferred_switch_ins']}")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
