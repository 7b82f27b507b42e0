"""The other contention models (#28): what the vCPU got against what was asked, and what watching them costs.

A busy loop (``sh -c 'while :; do :; done'``, one thread) stands in for a vCPU thread, pinned to the last CPU.

- achieved / asked share, printed as a ratio (target: within 2 percentage points for cfs-quota, as for deadline
  in ``benchmarks/contention.py``), for cfs-quota (10 and 100 ms periods), cfs-burst and competing-load, each held
  :data:`HOLD_S` seconds; and a credit run's share in its burst and baseline phases and when it ran out;
- the host CPU the state watch (one check a second in a run) and the credit controller (a tick every 0.1 s) cost
  per 20 s run, from this process's CPU time over many checks/ticks, as a fraction of the run.
"""

from __future__ import annotations

import os
import subprocess
import time

from bbrlab.contention.creditbalance import CreditController
from bbrlab.contention.models import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.contention_models import CREDIT_TICK_S
from bbrlab.scenario.cpumodels import BurstParams, CfsParams, CreditParams
from bbrlab.scenario.scenario import Contention

HOLD_S = 5.0
RUN_S = 20.0
SETTINGS = [Contention(25, 25, "cfs-quota", CfsParams(100)), Contention(2.5, 25, "cfs-quota", CfsParams(10)),
            Contention(50, 50, "cfs-quota", CfsParams(100)),
            Contention(25, 25, "cfs-burst", BurstParams(period_ms=100, burst_ms=10)),
            Contention(1, 50, "competing-load"), Contention(1, 25, "competing-load")]


def _busy_loop() -> subprocess.Popen:
    loop = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    os.sched_setaffinity(loop.pid, {max(os.sched_getaffinity(0))})
    return loop


def achieved_shares() -> None:
    print(f"{'contention':>24} {'asked':>6} {'achieved':>9} {'ratio':>6} {'off pp':>7} held")
    for c in SETTINGS:
        loop = _busy_loop()
        try:
            with contended(LocalHost(), [loop.pid], c) as s:
                time.sleep(HOLD_S)  # the measurement interval
            got = s.record().evidence
            asked = got.configured_share_pct
            share = got.achieved.achieved_share_pct
            print(f"{c.id_tag:>24} {asked:>5.1f} % {share:>8.2f} % {share / asked:>6.3f} {share - asked:>+7.2f} "
                  f"{got.policy_held}")
        finally:
            loop.kill()
            loop.wait()


def credit_phases() -> None:
    loop = _busy_loop()
    try:
        with contended(LocalHost(), [loop.pid], Contention(25, 25, "credit", CreditParams(credit_s=0.3))) as s:
            time.sleep(HOLD_S)
        credit = s.record().evidence.credit
        shares = ", ".join(f"{p.state} {p.from_s:.1f}-{p.to_s:.1f} s: {p.achieved_share_pct:.1f} %" for p in credit.phases)
        print(f"credit 0.3 CPU-s at a 25 % baseline, busy: ran out after {credit.ran_out_after_s} s (at full CPU: "
              f"{0.3 / 0.75:.2f} s; later on a busy machine); {shares}")
    finally:
        loop.kill()
        loop.wait()


def _cpu_per_call_s(call, n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        call()
    return (time.process_time() - t0) / n


def watch_cost() -> None:
    loop = _busy_loop()
    try:
        for c in (Contention(25, 25, "cfs-quota"), Contention(1, 50, "competing-load")):
            with contended(LocalHost(), [loop.pid], c, watch_interval_s=None) as s:
                per_check = _cpu_per_call_s(s.deviations, 2000)
            per_run = per_check * RUN_S  # one check a second
            print(f"state watch, {c.model}: {1e6 * per_check:.0f} us CPU a check, {1e3 * per_run:.2f} ms per "
                  f"{RUN_S:g} s run ({per_run / RUN_S:.2e} of the run)")
        controller = CreditController([loop.pid], credit_s=1e6, baseline_pct=25, tick_s=CREDIT_TICK_S,
                                      write_quota=lambda quota: None, baseline_quota_us=25000)
        per_tick = _cpu_per_call_s(controller.tick, 5000)
        per_run = per_tick * RUN_S / CREDIT_TICK_S
        print(f"credit controller: {1e6 * per_tick:.0f} us CPU a tick, {1e3 * per_run:.2f} ms per {RUN_S:g} s run "
              f"({per_run / RUN_S:.2e} of the run; its quota writes, at most one a switch, not counted)")
    finally:
        loop.kill()
        loop.wait()


def main() -> None:
    achieved_shares()
    credit_phases()
    watch_cost()


if __name__ == "__main__":
    main()
