"""The cgroup models' throttling evidence (``contention.evidence.throttling``) on this machine's real kernel, with
a thread of the test's own standing in for a vCPU thread (no QEMU): a busy thread under a 25 % quota is throttled
in most periods and waits about three quarters of the time; a thread that uses less than its quota and one without
a quota (100 %) are never throttled. Each count is checked against the cgroup's ``cpu.stat`` read here, not
through bbrlab's parser."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from bbrlab.contention import cgroups
from bbrlab.contention.models import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.cpumodels import CfsParams
from bbrlab.scenario.scenario import Contention
from tests import cpuloops

pytestmark = pytest.mark.system

#: How long each contention holds [s] and its CFS period [ms].
HOLD_S, PERIOD_MS = 2.0, 100


@pytest.fixture
def busy():
    """One busy loop (one thread) on one CPU; any bbrlab cgroup of this process removed at the end."""
    with cpuloops.busy_loop() as p:
        yield p


def _raw_stat(cgroup: Path) -> dict[str, int]:
    """cpu.stat read here, as the kernel writes it."""
    return {k: int(v) for k, v in (line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())}


def _throttled(p, share_pct: float):
    """Hold ``p``'s thread under cfs-quota at ``share_pct`` for HOLD_S; the evidence's throttling, how far the raw
    cpu.stat of its cgroup moved over the hold (inside the evidence's window, which opens a moment before and
    closes a moment after), and the share achieved."""
    with contended(LocalHost(), [p.pid], Contention(PERIOD_MS * share_pct / 100, share_pct, "cfs-quota",
                                                    CfsParams(PERIOD_MS))) as s:
        cgroup = s.stat_cgroup
        start = _raw_stat(cgroup)
        time.sleep(HOLD_S)
        end = _raw_stat(cgroup)
    evidence = s.record().evidence
    return evidence.throttling, {k: end[k] - start[k] for k in end}, evidence.achieved.achieved_share_pct


def test_a_busy_thread_under_a_quarter_quota_is_throttled_in_most_periods(busy):
    """2 s at 25 % of a 100 ms period: 20 periods; on a quiet CPU the thread would run 25 ms of each and wait
    75 ms throttled (1.5 s in all). This 2-core machine is shared (other sessions' tests: the same loop without a
    quota got 32-60 % of a CPU), so the 25 ms take longer and some periods end before the quota is spent.
    Measured in 14 runs here (load average 1-7): 20-21 periods, 14-20 of them throttled, 464-893 ms
    throttled, 19.1-26.1 % achieved; the evidence's counts equal cpu.stat's over the hold (the raw counts read
    here) to the microsecond. The bounds: 17-24 periods, at least half throttled, and a throttled time above 0
    and at most 75 ms per throttled period plus one period."""
    t, raw, share = _throttled(busy, 25)
    print(f"\ncfs-quota 25 % of {PERIOD_MS} ms, {HOLD_S} s on {cgroups.detect().name}: {t}; achieved {share} %; "
          f"cpu.stat over the hold {raw}")
    key = "throttled_time" if "throttled_time" in raw else "throttled_usec"
    raw_ms = raw[key] / (1e6 if key == "throttled_time" else 1e3)
    # the evidence's window holds the hold and a moment either side: at most a period or two more
    assert 0 <= t.nr_periods - raw["nr_periods"] <= 2 and 0 <= t.nr_throttled - raw["nr_throttled"] <= 2
    assert -0.001 <= t.throttled_ms - raw_ms <= 2 * PERIOD_MS  # the record keeps microseconds
    assert 17 <= t.nr_periods <= 24 and t.nr_throttled >= 0.5 * t.nr_periods
    assert 0 < t.throttled_ms <= t.nr_throttled * PERIOD_MS * 0.75 + PERIOD_MS
    assert t.cgroup.rsplit("/", 1)[-1].startswith(cgroups.PREFIX)


def test_a_thread_within_its_quota_and_one_without_a_quota_are_never_throttled(busy):
    """A thread that wakes every 50 ms for a moment uses far less than 25 % of a CPU: some periods are counted
    (the kernel's period timer idles while the cgroup does; measured: 4-6 in 2 s, 0.07-0.78 % achieved), none
    throttled. At 100 % no quota is applied: the evidence reads the thread's own cgroup (here the root of the v1
    cpu hierarchy), where nothing throttles (measured: 0 periods, 0 throttled)."""
    light = cpuloops.pinned([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])  # no fork: one thread
    try:
        t, _, share = _throttled(light, 25)
    finally:
        light.kill()
        light.wait()
    print(f"\ncfs-quota 25 %, a light loop: {t}; achieved {share} %")
    assert t.nr_periods >= 1 and t.nr_throttled == 0 and t.throttled_ms == 0
    t, raw, share = _throttled(busy, 100)
    print(f"cfs-quota 100 % (no quota), a busy loop: {t}; achieved {share} %")
    assert t.cgroup == str(cgroups.detect().thread_cgroup(busy.pid))
    assert t.nr_throttled == 0 and t.throttled_ms == 0 and raw["nr_throttled"] >= 0
