"""The host's CPU outside the testbed (bbrlab.contention.outside), on this machine's real /proc: processes are
started for real and their ticks compared with what the kernel says of them by another path (``wait4``'s
rusage of a reaped child). No testbed: "ours" is this process's tree and a network namespace made here.

Bounds: the per-process counters and /proc/stat are both in clock ticks (USER_HZ, 100 per s); a process's
rusage is in microseconds and its /proc ticks are that value cut to whole ticks, so the two agree to within a
tick per counter (utime, stime); the tests allow 3. The busy loops run until they have used a given CPU time
(read from their own /proc/<pid>/stat), not for a given wall time, so the other developers' load on the
shared 2-core machine only slows them down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from bbrlab.contention import outside
from bbrlab.core import owners
from bbrlab.core.ownedpids import signal_if_same

pytestmark = pytest.mark.system

HZ = os.sysconf("SC_CLK_TCK")
#: A child that burns CPU until its own CPU time reaches argv[1] seconds, then exits.
BURN = "import sys, time\nwhile time.process_time() < float(sys.argv[1]): pass\n"


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return outside.parse_pid_stat(pid, f.read()).own_ticks


def _until_ticks(pid: int, ticks: int, timeout_s: float = 60.0) -> None:
    """Wait until process ``pid`` has used ``ticks`` of CPU (its own counter), polling it."""
    end = time.monotonic() + timeout_s
    while _ticks(pid) < ticks:
        assert time.monotonic() < end, f"pid {pid} did not reach {ticks} ticks"
        time.sleep(0.02)


@pytest.fixture
def detached_loop():
    """A busy loop whose parent exits at once: no descendant of this process. Its pid."""
    script = "setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $!"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, timeout=10).stdout
    pid = int(out)
    ticks = owners.start_ticks(pid)
    yield pid
    signal_if_same(pid, ticks, signal.SIGKILL)


def test_a_name_with_spaces_and_parentheses_is_read_from_the_real_stat_file():
    child = subprocess.Popen([sys.executable, "-c", "open('/proc/self/comm', 'w').write('a) b (c'); input()"],
                             stdin=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 30
        while owners.start_ticks(child.pid) is None or "a) b" not in open(f"/proc/{child.pid}/comm").read():
            assert time.monotonic() < end
            time.sleep(0.01)
        p = outside.parse_pid_stat(child.pid, open(f"/proc/{child.pid}/stat").read())
        assert (p.comm, p.ppid, p.start_ticks) == ("a) b (c", os.getpid(), owners.start_ticks(child.pid))
    finally:
        child.communicate("\n", timeout=30)


def test_a_child_that_ended_in_the_window_counts_only_its_ticks_within_it():
    """The child is ours (a descendant); it ends inside the window and this process reaps it, so its whole
    life lands in our cutime: only the part after the first snapshot may count."""
    ours = outside.Ours()
    child = subprocess.Popen([sys.executable, "-c", BURN, "0.8"])
    _until_ticks(child.pid, int(0.3 * HZ))
    first = outside.snapshot()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = 0  # reaped here: Popen must not wait for it again
    last = outside.snapshot()
    assert status == 0
    found = outside.between(first, last, ours)
    life_ticks = (usage.ru_utime + usage.ru_stime) * HZ
    before_ticks = first.procs[child.pid].ticks
    me = os.getpid()
    mine = last.procs[me].own_ticks - first.procs[me].own_ticks
    expected = life_ticks - before_ticks + mine
    assert abs(found["testbed_ticks"] - expected) <= 3, (found, life_ticks, before_ticks, mine)
    assert found["testbed_ticks"] < life_ticks - 0.2 * HZ  # not its whole life


def test_a_detached_busy_loop_is_other_work_and_named(detached_loop):
    ours = outside.Ours()
    _until_ticks(detached_loop, 2)
    first = outside.snapshot()
    start = _ticks(detached_loop)
    _until_ticks(detached_loop, start + int(0.5 * HZ))
    last = outside.snapshot()
    loop_ticks = last.procs[detached_loop].ticks - first.procs[detached_loop].ticks
    found = outside.between(first, last, ours)
    assert detached_loop not in ours.pids(last)
    assert found["other_ticks"] >= loop_ticks - 3
    assert detached_loop in [p["pid"] for p in found["top"]]
    assert found["other_busy_pct"] >= 100.0 * (loop_ticks - 3) / found["ticks"]


def test_a_process_in_a_testbed_namespace_is_ours(detached_loop):
    name = f"bbrlab-guardtest-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    inside = None
    try:
        out = subprocess.run(["ip", "netns", "exec", name, "sh", "-c",
                              "setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        inside = (int(out), owners.start_ticks(int(out)))
        ours = outside.Ours(netns_inodes=outside.netns_inodes([name]))
        first = outside.snapshot()
        _until_ticks(inside[0], _ticks(inside[0]) + int(0.3 * HZ))
        last = outside.snapshot()
        assert inside[0] in ours.pids(last)
        assert detached_loop not in ours.pids(last)  # in the host's namespace: not the testbed's
        found = outside.between(first, last, ours)
        in_ticks = last.procs[inside[0]].ticks - first.procs[inside[0]].ticks
        assert found["testbed_ticks"] >= in_ticks
        assert inside[0] not in [p["pid"] for p in found["top"]]
    finally:
        if inside:
            signal_if_same(*inside, signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", name], check=False, timeout=30)


def test_doctor_says_the_host_is_busy_while_a_loop_runs(detached_loop):
    """One busy loop alone reads 32-46 % of this 2-core machine's CPUs (docs/run-record.md), above the
    default limit of 25 %; other developers' work only adds to it."""
    from bbrlab.campaign.hostguard import host_load_check

    _until_ticks(detached_loop, 2)
    check = host_load_check()
    assert check.status == "warn" and check.detail.startswith("the host is busy now: "), check
    assert "(limit 25 %)" in check.detail and check.fix
