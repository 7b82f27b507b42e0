"""The cgroup models' throttling evidence (``contention.evidence.throttling``) on this machine's real kernel, with
a thread of the test's own standing in for a vCPU thread (no QEMU): a busy thread under a 25 % quota is throttled
in most periods and waits about three quarters of the time; a thread that uses less than its quota and one without
a quota (100 %) are never throttled. Each count is checked against the cgroup's ``cpu.stat`` read here, not
through bbrlab's parser."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bbrlab.contention import cgroups
from bbrlab.contention.models import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.cpumodels import CfsParams
from bbrlab.scenario.scenario import Contention

pytestmark = pytest.mark.system

#: How long each contention holds [s] and its CFS period [ms].
HOLD_S, PERIOD_MS = 2.0, 100


def _loop(script: str):
    p = subprocess.Popen(["sh", "-c", script])
    os.sched_setaffinity(p.pid, {max(os.sched_getaffinity(0))})
    return p


@pytest.fixture
def busy():
    """One busy loop (one thread) on one CPU; any bbrlab cgroup of this process removed at the end."""
    p = _loop("while :; do :; done")
    yield p
    p.kill()
    p.wait()
    for own in cgroups.leftovers(include_live_owners=True):
        if own.entry.owner.pid == os.getpid():
            cgroups.remove(own)


def _raw_stat(cgroup: Path) -> dict[str, int]:
    """cpu.stat read here, as the kernel writes it."""
    return {k: int(v) for k, v in (line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())}


def _throttled(p, share_pct: float):
    """Hold ``p``'s thread under cfs-quota at ``share_pct`` for HOLD_S; the evidence's throttling, the raw cpu.stat
    of its cgroup at the end of the hold, and the share achieved."""
    with contended(LocalHost(), [p.pid], Contention(PERIOD_MS * share_pct / 100, share_pct, "cfs-quota",
                                                    CfsParams(PERIOD_MS))) as s:
        cgroup = s.stat_cgroup
        time.sleep(HOLD_S)
        raw = _raw_stat(cgroup)
    evidence = s.record().evidence
    return evidence.throttling, raw, evidence.achieved.achieved_share_pct


def test_a_busy_thread_under_a_quarter_quota_is_throttled_in_most_periods(busy):
    """2 s at 25 % of a 100 ms period: about 20 periods, the thread runs 25 ms of each and waits 75 ms, so it
    is throttled in each and waits about 1.5 s. Measured here: PLACEHOLDER."""
    t, raw, share = _throttled(busy, 25)
    print(f"\ncfs-quota 25 % of {PERIOD_MS} ms, {HOLD_S} s on {cgroups.detect().name}: {t}; achieved {share} %")
    key = "throttled_time" if "throttled_time" in raw else "throttled_usec"
    unit_ms = 1e6 if key == "throttled_time" else 1e3
    # the evidence's end reading comes a moment after this one: the counts only grow
    assert t.nr_periods >= raw["nr_periods"] and t.nr_throttled >= raw["nr_throttled"]
    assert t.throttled_ms >= raw[key] / unit_ms
    assert 17 <= t.nr_periods <= 24 and t.nr_throttled >= 0.8 * t.nr_periods
    assert 1000 <= t.throttled_ms <= 1800
    assert t.cgroup.rsplit("/", 1)[-1].startswith(cgroups.PREFIX)


def test_a_thread_within_its_quota_and_one_without_a_quota_are_never_throttled(busy):
    """A loop that wakes every 50 ms for a moment uses far less than 25 % of a CPU: its periods are counted, none
    throttled. At 100 % no quota is applied: the evidence reads the thread's own cgroup, where nothing throttles."""
    light = _loop("while :; do sleep 0.05; done")
    try:
        t, _, share = _throttled(light, 25)
    finally:
        light.kill()
        light.wait()
    print(f"\ncfs-quota 25 %, a light loop: {t}; achieved {share} %")
    assert t.nr_periods >= 5 and t.nr_throttled == 0 and t.throttled_ms == 0
    t, raw, share = _throttled(busy, 100)
    print(f"cfs-quota 100 % (no quota), a busy loop: {t}; achieved {share} %")
    assert t.cgroup == str(cgroups.detect().thread_cgroup(busy.pid))
    assert t.nr_throttled == 0 and t.throttled_ms == 0 and raw["nr_throttled"] >= 0
