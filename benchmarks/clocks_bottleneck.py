"""One clock and the bottleneck on it (issue 27): how well the guests' clocks are known, what the emulator's
queue sampler costs, and what it would cost with a ``tc`` fork per sample instead.

On the local testbed (holds its lock), link 20 ms / 100 Mbit/s, 1 BDP. Printed:

1. the sender's and the emulator's clock offsets (``bbrlab.run.clocks``), ``BBRLAB_BENCH_CLOCK_REPS``
   measurements of 20 exchanges each, a second apart (default 10): median and worst uncertainty (target < 1 ms), round trip,
   and the drift between the first and the last;
2. the bottleneck sampler's cost in the emulator during a sampled Cubic run (``run_once``, 10 s, sampled
   every 10 ms by the netlink sampler, the queue every 5 ms): CPU per sample, CPU share, samples per second,
   missed ticks;
3. the same information through ``tc -s -j qdisc show`` (a fork and exec per sample): ms per call in the
   emulator, timed by bash's ``$EPOCHREALTIME`` over 50 calls.
4. throughput with the host's vCPU trace and the bottleneck sampler on, against both off (``flow.vcpu_trace``
   on / off with ``flow.bottleneck_ms`` 5 / 0; both socket-sampled, Cubic, at 100 % and at 1 ms / 25 %), in
   pairs, the order within a pair alternating; ``BBRLAB_BENCH_REPS`` pairs (default 3; 0 skips it): the ratio
   of the medians and the median of the pairs' ratios, target >= 0.98.

``BBRLAB_TESTBED`` names the testbed (default ``local``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from bbrlab.run import clocks
from bbrlab.run.runner import run_once
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

LINK = Link(rtt_ms=20, rate_mbit=100)

#: $1 interface: 50 calls of tc -s -j, then the ms per call.
_TC_LOOP = r"""
t0=$EPOCHREALTIME
for i in $(seq 50); do tc -s -j qdisc show dev "$1" > /dev/null; done
t1=$EPOCHREALTIME
echo "${t0/,/.} ${t1/,/.}"
"""


def clock_offsets(tb, reps: int) -> None:
    for name, host in (("sender", tb.sender.host), ("emulator", tb.emulator.host)):
        clock = clocks.RemoteClock(host)
        try:
            got = []
            for _ in range(reps):  # a second apart: the drift between the first and the last means something
                got.append(clock.measure(20))
                time.sleep(1)
        finally:
            clock.close()
        unc_ms = [g.uncertainty_s * 1e3 for g in got]
        drift = clocks.ClockDrift(got[0], got[-1])
        print(f"{name:8s} offset {got[-1].offset_s * 1e3:+.3f} ms; uncertainty median {statistics.median(unc_ms):.3f} "
              f"ms, worst {max(unc_ms):.3f} ms (target < 1 ms); round trip median "
              f"{statistics.median(g.round_trip_s for g in got) * 1e3:.3f} ms; drift {drift.drift_ppm:+.1f} ppm "
              f"+- {drift.drift_uncertainty_ppm:.1f} over {got[-1].measured_at - got[0].measured_at:.1f} s", flush=True)


def sampler_cost(tb) -> None:
    scenario = Scenario(LINK, Contention(10, 100),
                        Flow("cubic", IperfParams(duration_s=10), sample_ms=10, sampler="netlink"))
    with tempfile.TemporaryDirectory(prefix="bbrlab-bench-") as out:
        record = run_once(tb, scenario, out)
    if record["status"] != "ok":
        print(f"sampled run failed: {record['reason']}")
        return
    b = record["metadata"]["bottleneck"]
    print(f"qdisc sampler every {b['interval_ms']} ms: {b['samples']} samples, {b['missed']} missed of {b['ticks']} "
          f"ticks, {b['samples_per_s']} samples/s, CPU {b['cpu_per_sample_us']} us per sample, share "
          f"{b['cpu_share'] * 100:.2f} % of one emulator CPU; throughput "
          f"{record['metadata']['iperf']['receiver_mbit'] if record['metadata'].get('iperf') else '?'}", flush=True)
    t0, t1 = (float(x) for x in tb.emulator.host.output(["bash", "-c", _TC_LOOP, "tc-loop", tb.emulator.ports[1]],
                                                          timeout=300).split())
    print(f"tc -s -j qdisc show: {(t1 - t0) * 1e3 / 50:.1f} ms per call in the emulator (a fork and exec each); "
          f"ratio to the qdisc sampler's CPU per sample: {(t1 - t0) * 1e6 / 50 / b['cpu_per_sample_us']:.0f}x",
          flush=True)


def perturbation(tb, reps: int) -> None:
    for contention in (Contention(10, 100), Contention(1, 25)):
        mbit: dict[bool, list[float]] = {True: [], False: []}
        pairs: list[float] = []
        for rep in range(reps):
            got = {}
            for traced in ((True, False) if rep % 2 == 0 else (False, True)):
                flow = Flow("cubic", IperfParams(duration_s=10), sample_ms=10, sampler="netlink",
                            vcpu_trace="on" if traced else "off", bottleneck_ms=5 if traced else 0)
                with tempfile.TemporaryDirectory(prefix="bbrlab-bench-") as out:
                    record = run_once(tb, Scenario(LINK, contention, flow), out)
                if record["status"] == "ok":
                    got[traced] = record["metadata"]["iperf"]["receiver_mbit"]
                    mbit[traced].append(got[traced])
            if len(got) == 2:
                pairs.append(got[True] / got[False])
        if mbit[True] and mbit[False]:
            ratio = statistics.median(mbit[True]) / statistics.median(mbit[False])
            print(f"{contention.timeslice_ms:g} ms / {contention.cpu_share_pct:g} %: traced {mbit[True]}, untraced "
                  f"{mbit[False]} Mbit/s; ratio of medians {ratio:.3f}, median of {len(pairs)} paired ratios "
                  f"{statistics.median(pairs):.3f} (target >= 0.98)", flush=True)


def main() -> None:
    import bbrlab.testbed as tbmod

    name = os.environ.get("BBRLAB_TESTBED", "local")
    with tbmod.testbed_lock(name):
        tb = tbmod.up(name, progress=False)
        try:
            print(f"testbed {name} ({tb.accelerator})", flush=True)
            clock_offsets(tb, int(os.environ.get("BBRLAB_BENCH_CLOCK_REPS", "10")))
            sampler_cost(tb)
            perturbation(tb, int(os.environ.get("BBRLAB_BENCH_REPS", "3")))
        finally:
            tb.close()


if __name__ == "__main__":
    main()
