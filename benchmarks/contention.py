"""Achieved vs configured CPU share under SCHED_DEADLINE, for a busy loop and for the cost of the API.

A ``sh -c 'while :; do :; done'`` process is held under each (timeslice, share) for a few seconds
by :func:`bbrlab.contention.deadline.contended`; the CPU it really got comes from ``/proc/<pid>/schedstat``.
Both methods (sched_setattr here, chrt as on a remote hypervisor) are timed for apply + restore.
"""

from __future__ import annotations

import subprocess
import time

from bbrlab.contention.deadline import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.scenario import Contention

SETTINGS = [(1, 25), (10, 50), (1, 10), (10, 10), (20, 70)]
HOLD_S = 3.0


def _busy_loop() -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", "while :; do :; done"])


def achieved_shares() -> None:
    host = LocalHost()
    print(f"{'timeslice':>10} {'share':>6} {'achieved':>9} {'wall s':>7} {'slices':>7} held")
    for timeslice_ms, share_pct in SETTINGS:
        loop = _busy_loop()
        try:
            with contended(host, [loop.pid], Contention(timeslice_ms, share_pct)) as c:
                time.sleep(HOLD_S)  # the measurement interval
            t = c.evidence.threads[0].usage
            print(f"{timeslice_ms:>8} ms {share_pct:>5} % {t.cpu_share_pct:>8.2f} % {t.wall_s:>7.2f} "
                  f"{t.timeslices:>7} {c.evidence.policy_held}")
        finally:
            loop.kill()
            loop.wait()


def apply_restore_cost() -> None:
    host = LocalHost()
    loop = _busy_loop()
    try:
        for method in ("syscall", "chrt"):
            n = 10
            t0 = time.monotonic()
            for _ in range(n):
                with contended(host, [loop.pid], Contention(10, 50), method=method, watch_interval_s=None):
                    pass
            print(f"apply + read back + evidence + restore, {method}: {1000 * (time.monotonic() - t0) / n:.1f} ms")
    finally:
        loop.kill()
        loop.wait()


def main() -> None:
    achieved_shares()
    apply_restore_cost()


if __name__ == "__main__":
    main()
