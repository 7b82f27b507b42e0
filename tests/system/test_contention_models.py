"""cfs-quota and competing-load on this machine's real kernel, with busy loops of the test's own standing in for
vCPU threads (no QEMU): the share each gives, measured from /proc/<tid>/schedstat; no cgroup or loop is left,
also after an exception; recovery removes a cgroup a SIGKILLed process left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbrlab.contention import cgroups
from bbrlab.contention.models import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.core.scenario import Contention

pytestmark = pytest.mark.system


@pytest.fixture
def busy():
    """One busy loop (one thread) on one CPU, killed at the end; any bbrlab cgroup of this process removed."""
    p = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    os.sched_setaffinity(p.pid, {max(os.sched_getaffinity(0))})
    yield p
    p.kill()
    p.wait()
    for own in cgroups.leftovers(include_live_owners=True):
        if cgroups.owner_pid(own.path) == os.getpid():
            cgroups.remove(own)


def _measure(session_block_s: float, busy, contention: Contention):
    with contended(LocalHost(), [busy.pid], contention) as s:
        time.sleep(session_block_s)
    return s


def test_cfs_quota_gives_the_asked_share_and_leaves_nothing(busy):
    h = cgroups.detect()
    before = h.thread_cgroup(busy.pid)
    s = _measure(3, busy, Contention(25, 25, "cfs-quota", 100))
    achieved = s.record().evidence.achieved
    print(f"cfs-quota 25 % of 100 ms on {h.name}: achieved {achieved.achieved_share_pct} %")
    assert abs(achieved.achieved_share_pct - 25) <= 2
    assert s.record().applied_model["quota_us"] == 25000 and s.record().applied_model["period_us"] == 100000
    assert h.thread_cgroup(busy.pid) == before and not Path(s.record().applied_model["path"]).exists()


def test_cfs_quota_is_undone_after_an_exception(busy):
    h = cgroups.detect()
    before = h.thread_cgroup(busy.pid)
    with pytest.raises(RuntimeError), contended(LocalHost(), [busy.pid], Contention(10, 10, "cfs-quota")) as s:
        assert h.thread_cgroup(busy.pid) == s.own.path
        raise RuntimeError("the run failed")
    assert h.thread_cgroup(busy.pid) == before and s.own is None
    assert not [o for o in cgroups.leftovers(include_live_owners=True) if cgroups.owner_pid(o.path) == os.getpid()]


KILLED = """
import os, signal, sys
from bbrlab.contention.cfs import CfsSession
from bbrlab.core.hosts import LocalHost
from bbrlab.core.scenario import Contention
s = CfsSession(LocalHost(), [int(sys.argv[1])], Contention(50, 50, "cfs-quota"))
s.apply()
print(s.own.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_recovery_removes_the_cgroup_a_killed_process_left(busy):
    h = cgroups.detect()
    before = h.thread_cgroup(busy.pid)
    out = subprocess.run([sys.executable, "-c", KILLED, str(busy.pid)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    left = Path(out.stdout.strip())
    assert out.returncode == -9 and left.is_dir() and h.thread_cgroup(busy.pid) == left
    assert str(left) in cgroups.clear_leftovers()
    assert not left.exists() and h.thread_cgroup(busy.pid) == before


def test_competing_load_gives_about_the_asked_share(busy):
    mask = os.sched_getaffinity(busy.pid)
    s = _measure(3, busy, Contention(1, 50, "competing-load"))
    got = s.record().evidence.achieved.achieved_share_pct
    print(f"competing-load 50 % (1 loop): achieved {got} %")
    assert abs(got - 50) <= 5 and not s.loops and os.sched_getaffinity(busy.pid) == mask


def test_deadline_records_the_achieved_share_too(busy):
    os.sched_setaffinity(busy.pid, os.sched_getaffinity(0))  # SCHED_DEADLINE refuses a pinned thread
    got = _measure(2, busy, Contention(10, 25)).record().evidence.achieved
    print(f"deadline 10 ms at 25 %: achieved {got.achieved_share_pct} %")
    assert abs(got.achieved_share_pct - 25) <= 2 and got.steal == "not read from the guest"
