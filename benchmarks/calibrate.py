"""The demo's calibration on the local testbed: time per point and the ceiling grid of this machine.

Runs ``bbrlab calibrate`` over the demo's timeslices, shares and RTT (:func:`bbrlab.demo.calibration_spec`,
the settings ``make demo`` uses) into a temporary directory and prints:

- wall time in all, per run (against its 5 s transfer) and per point (stream counts x repetitions);
- the ceiling grid: per point the ceiling, the stream count that carried it, the limit measured and its
  evidence, and the bridge reference (no qdisc on the emulator);
- the host's load average before and after: the ceilings depend on everything else the machine runs.

``BBRLAB_TESTBED`` names the testbed (default ``local``); ``BBRLAB_BENCH_CALIBRATION_REPS`` overrides the
repetitions (default: the demo's).
"""

from __future__ import annotations

import os
import tempfile
import time


def main() -> None:
    import bbrlab.testbed as tbmod
    from bbrlab.calibration.calibrate import calibrate, format_grid, host_load
    from bbrlab.campaign.spec import load_spec
    from bbrlab.demo import DEMO_SPECS, calibration_spec
    from bbrlab.run.runner import Runner

    name = os.environ.get("BBRLAB_TESTBED", "local")
    spec = calibration_spec([load_spec(p) for p in DEMO_SPECS])
    reps = os.environ.get("BBRLAB_BENCH_CALIBRATION_REPS")
    if reps:
        from dataclasses import replace

        spec = replace(spec, repetitions=int(reps))
    runs, points = len(spec.plan()), len(spec.points()) + (1 if spec.reference_point() else 0)
    with tbmod.testbed_lock(name):
        tb = tbmod.up(name, progress=False)
        runner = Runner(tb)
        try:
            print(f"calibration of the demo grid on testbed {name} ({tb.accelerator}): {points} points (with the "
                  f"bridge reference) x {len(spec.streams)} stream counts x {spec.repetitions} repetitions = {runs} "
                  f"runs of {spec.duration_s:g} s; host load before {host_load()['loadavg_1_5_15']}", flush=True)
            with tempfile.TemporaryDirectory(prefix="bbrlab-bench-") as out:
                t0 = time.monotonic()
                cal = calibrate(tb, spec, out, runner=runner, progress=False, say=lambda line: print(line, flush=True))
                wall = time.monotonic() - t0
        finally:
            runner.close()
            tb.close()
    print(f"\ncalibration wall time {wall:.0f} s: {wall / runs:.1f} s per run ({wall / runs / spec.duration_s:.2f} x "
          f"its {spec.duration_s:g} s transfer), {wall / points:.0f} s per point; host load after "
          f"{host_load()['loadavg_1_5_15']}")
    print(format_grid(cal))
    for p in cal.points:
        print(f"  {p.key}: {p.limit}: {'; '.join(p.evidence)}; per stream count "
              + ", ".join(f"{n}: {v['repetitions_mbit']}" for n, v in p.by_streams.items()))


if __name__ == "__main__":
    main()
