"""The contention models' constants: the kernel's limits for a CFS period and quota, the credit model's
balance, rearm fraction and tick, competing-load's thread count (:func:`load_threads`).

The models themselves (their names, parameters and checks) are :mod:`bbrlab.scenario.cpumodels`, one module each.
This module stays a leaf of the standard library alone: tests/system/test_cgroup_v2_guest.py copies it into a
guest beside :mod:`bbrlab.contention.creditbalance`, which reads the credit constants from here.
"""

from __future__ import annotations

import math

#: CFS bandwidth control's default period (the kernel's, libvirt's and container runtimes' default) [ms].
CFS_DEFAULT_PERIOD_MS = 100.0
#: The kernel's range for the CFS period (``cpu.cfs_period_us`` / ``cpu.max``: 1 ms .. 1 s) [ms].
CFS_PERIOD_MIN_MS, CFS_PERIOD_MAX_MS = 1.0, 1000.0
#: The kernel's smallest CFS quota (1000 us) [ms].
CFS_QUOTA_MIN_MS = 1.0
#: The credit balance a spec's credit runs start with unless ``credits_s`` says otherwise [CPU-seconds].
DEFAULT_CREDIT_S = 10.0
#: The largest credit balance a run may start with: an hour of one CPU [CPU-seconds].
CREDIT_MAX_S = 3600.0
#: Once spent, full CPU comes back when the balance has earned this fraction of ``credit_s`` again (hysteresis:
#: without it the controller would switch at every tick, as soon as a tick's credit was earned).
CREDIT_REARM_FRACTION = 0.1
#: How often the credit controller reads the vCPU threads' CPU time and settles the balance [s].
CREDIT_TICK_S = 0.1
#: At most this many competing threads (a share below about 1.5 %).
MAX_LOAD_THREADS = 64


def load_threads(share_pct: float) -> int:
    """Equal-weight competing threads that leave the vCPU thread ``share_pct`` of its CPU under the fair scheduler:
    n = (1 - s) / s rounded half up (the vCPU gets 1 / (n + 1): 25 % -> 3, 50 % -> 1, 40 % -> 2 (33 %)); 0 at 100 %."""
    if share_pct >= 100:
        return 0
    return int(math.floor((100.0 - share_pct) / share_pct + 0.5 + 1e-9))  # in percent: 40 % gives 1.5 exactly


def load_share_pct(threads: int) -> float:
    """The share the vCPU thread gets beside ``threads`` equal-weight competitors: 100 / (threads + 1) [%]."""
    return 100.0 / (threads + 1)
