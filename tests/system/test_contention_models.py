"""cfs-quota, cfs-burst, credit and competing-load on this machine's real kernel, with busy loops of the test's own
standing in for vCPU threads (no QEMU): the share each gives, measured from /proc/<tid>/schedstat; the credit
controller's switches; the state watch's deviations; no cgroup or loop is left, also after an exception;
recovery removes a cgroup a SIGKILLed process left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbrlab.contention import cgroups
from bbrlab.contention.models import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.cpumodels import BurstParams, CfsParams, CreditParams
from bbrlab.scenario.scenario import Contention
from tests import cpuloops

pytestmark = pytest.mark.system


@pytest.fixture
def busy():
    """One busy loop (one thread) on one CPU, killed at the end; any bbrlab cgroup of this process removed."""
    with cpuloops.busy_loop() as p:
        yield p


def _measure(session_block_s: float, busy, contention: Contention):
    with contended(LocalHost(), [busy.pid], contention) as s:
        time.sleep(session_block_s)
    return s


def test_cfs_quota_gives_the_asked_share_and_leaves_nothing(busy):
    h = cgroups.detect()
    before = h.thread_cgroup(busy.pid)
    s = _measure(3, busy, Contention(25, 25, "cfs-quota", CfsParams(100)))
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
    assert not [o for o in cgroups.leftovers(include_live_owners=True) if o.entry.owner.pid == os.getpid()]


KILLED = """
import os, signal, sys
from bbrlab.contention.cfs import CfsSession
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.scenario import Contention
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


def _run_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def test_competing_load_gives_about_the_asked_share(busy):
    """One loop beside the thread: the fair scheduler splits their CPU evenly, whatever else runs there.

    The share of wall time the thread gets depends on the host's other work: a full suite on a busy 2-core
    machine gave it 44.98 %, outside the +-5 points this test once asserted, and 12 runs at a load average of
    4.1-5.1 (other test sessions) gave 29.7-46.8 % of wall time while the pair's split stayed at 49.3-50.1 %
    and the record's share matched the thread's schedstat within 0.15 points. So the split is asserted (+-4
    points), and the record against schedstat (2 points: its window is a little wider than the test's)."""
    mask = os.sched_getaffinity(busy.pid)
    with contended(LocalHost(), [busy.pid], Contention(1, 50, "competing-load")) as s:
        (loop,) = s.loops
        start = time.monotonic(), _run_ns(busy.pid), _run_ns(loop.pid)
        time.sleep(3)
        end = time.monotonic(), _run_ns(busy.pid), _run_ns(loop.pid)
    thread_s, loop_s = (end[1] - start[1]) / 1e9, (end[2] - start[2]) / 1e9
    split_pct = 100 * thread_s / (thread_s + loop_s)
    got = s.record().evidence.achieved.achieved_share_pct
    print(f"competing-load 50 % (1 loop): achieved {got} % of wall time, {split_pct:.1f} % of the pair's CPU")
    assert abs(split_pct - 50) <= 4
    assert abs(got - 100 * thread_s / (end[0] - start[0])) <= 2
    assert not s.loops and os.sched_getaffinity(busy.pid) == mask


def test_deadline_records_the_achieved_share_too(busy):
    os.sched_setaffinity(busy.pid, os.sched_getaffinity(0))  # SCHED_DEADLINE refuses a pinned thread
    got = _measure(2, busy, Contention(10, 25)).record().evidence.achieved
    print(f"deadline 10 ms at 25 %: achieved {got.achieved_share_pct} %")
    assert abs(got.achieved_share_pct - 25) <= 2 and got.steal == "not read from the guest"


def _cpu_stat(cgroup: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())}


def test_cfs_burst_is_set_read_back_and_lets_saved_quota_be_spent(busy):
    """A stopped thread leaves its quota unused; once it runs again the kernel lets it spend the saved part
    (cpu.stat's nr_bursts counts it). The burst is read back from the kernel and the cgroup removed after."""
    h = cgroups.detect()
    before = h.thread_cgroup(busy.pid)
    with contended(LocalHost(), [busy.pid], Contention(25, 25, "cfs-burst", BurstParams(period_ms=100, burst_ms=25))) as s:
        assert h.burst(s.own.path) == 25000 and h.limit(s.own.path) == (25000, 100000)
        os.kill(busy.pid, signal.SIGSTOP)
        time.sleep(0.5)
        os.kill(busy.pid, signal.SIGCONT)
        time.sleep(1.5)
        stat = _cpu_stat(s.own.path)
    record = s.record()
    print(f"cfs-burst 25 % + 25 ms burst: {stat.get('nr_bursts')} bursts, {stat.get('burst_time', stat.get('burst_usec'))} "
          f"of burst; achieved {record.evidence.achieved.achieved_share_pct} % (0.5 s of it stopped)")
    assert stat["nr_bursts"] >= 1
    assert record.applied_model["burst_us"] == 25000 and record.evidence.policy_held
    assert h.thread_cgroup(busy.pid) == before and not Path(record.applied_model["path"]).exists()


def test_credit_gives_full_cpu_until_the_balance_is_spent_then_the_baseline(busy):
    """0.5 CPU-second of credit at a 25 % baseline: a busy thread spends 0.75 s of credit a second at full CPU
    (less when the machine is busy: it runs out later), then gets 25 % under the baseline quota."""
    h = cgroups.detect()
    with contended(LocalHost(), [busy.pid], Contention(25, 25, "credit", CreditParams(credit_s=0.5))) as s:
        assert h.limit(s.own.path) == (None, 100000)
        time.sleep(3.5)
        assert h.limit(s.own.path) == (25000, 100000)
    record = s.record()
    credit = record.evidence.credit
    burst, baseline = credit.phases[0], credit.phases[1]
    print(f"credit 0.5 s at 25 %: ran out after {credit.ran_out_after_s} s; burst {burst.achieved_share_pct} %, "
          f"baseline {baseline.achieved_share_pct} % over {baseline.to_s - baseline.from_s:.1f} s; "
          f"{credit.ticks} ticks, balance at the end {credit.balance_end_s} s")
    assert [sw.to for sw in credit.switches] == ["baseline"] and 0.5 <= credit.ran_out_after_s <= 2.5
    assert burst.state == "burst" and baseline.state == "baseline"
    assert abs(baseline.achieved_share_pct - 25) <= 3 and burst.achieved_share_pct >= 40
    assert record.applied_model["credit_s"] == 0.5 and record.applied_model["earn_cpu_s_per_s"] == 0.25
    assert record.evidence.policy_held and record.evidence.watch.checks >= 3
    assert not Path(record.applied_model["path"]).exists()


def test_credit_earned_back_while_idle_gives_full_cpu_again(busy):
    """Stopped (no CPU used), the thread earns 25 % of a CPU-second a second; at 10 % of its 0.4 s balance the
    controller lifts the quota again."""
    h = cgroups.detect()
    with contended(LocalHost(), [busy.pid], Contention(25, 25, "credit", CreditParams(credit_s=0.4))) as s:
        wait_until = time.monotonic() + 5
        while h.limit(s.own.path)[0] is None and time.monotonic() < wait_until:
            time.sleep(0.05)
        os.kill(busy.pid, signal.SIGSTOP)
        time.sleep(0.6)
        os.kill(busy.pid, signal.SIGCONT)
        time.sleep(0.3)
    switches = [sw.to for sw in s.record().evidence.credit.switches]
    print(f"credit 0.4 s, stopped for 0.6 s: switches {s.record().evidence.credit.to_dict()['switches']}")
    assert switches[:2] == ["baseline", "burst"]


def test_the_watch_notes_a_quota_changed_or_a_loop_killed_during_the_run(busy):
    h = cgroups.detect()
    before = h.thread_cgroup(busy.pid)
    with contended(LocalHost(), [busy.pid], Contention(50, 50, "cfs-quota"), watch_interval_s=0.2) as s:
        h.set_limit(s.own.path, 80000, 100000)
        time.sleep(0.5)
        h.move(busy.pid, before)
        time.sleep(0.5)
    watch = s.record().evidence.watch
    seen = " | ".join(d.seen for d in watch.deviations)
    assert "quota 80000 us / period 100000 us, asked 50000 / 100000" in seen and "not in" in seen
    assert not s.record().evidence.policy_held and watch.checks >= 4
    with contended(LocalHost(), [busy.pid], Contention(1, 50, "competing-load"), watch_interval_s=0.2) as s:
        killed = s.loops[0].pid
        s.loops[0].kill()
        time.sleep(0.5)
    seen = " | ".join(d.seen for d in s.record().evidence.watch.deviations)
    assert f"busy loop {killed} ended" in seen and not s.record().evidence.policy_held
