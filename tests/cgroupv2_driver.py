"""Runs in the sender guest (as root), beside copies of bbrlab's cgroup modules, for
``tests/system/test_cgroup_v2_guest.py``: bbrlab's cgroup v2 paths on a real v2 hierarchy with a real busy thread.

    python3 cgroupv2_driver.py exercise <mount> <tid> <token>   # everything below; one JSON line on stdout
    python3 cgroupv2_driver.py hold <mount> <tid> <token>       # make a cgroup, move <tid> in, print its path, wait

``exercise`` records what it saw at each step (it asserts nothing: the test does) and, when a step raises, the
traceback under ``error``; it always prints its JSON. ``<token>`` only marks this process's command line (and
the holder's) so that the test's clean-up finds them. Standard library and the copied modules only: the guest
has nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from bbrlab.contention import cgroups, cpustat, creditbalance, ledger
from bbrlab.scenario.contention_models import CREDIT_TICK_S

#: How long the share is measured with the quota on, and before it, without [s].
LIMITED_S = 2.0
FREE_S = 0.5
QUOTA_US, PERIOD_US, BURST_US = 25_000, 100_000, 10_000
#: The credit model's run: a balance of CREDIT_S CPU-seconds at a 25 % baseline (QUOTA_US per PERIOD_US), watched
#: for CREDIT_RUN_S: a busy thread spends it in about 1.4 s, then stays at the baseline [s].
CREDIT_S, CREDIT_RUN_S = 1.0, 3.5


def _run_ns(tid: int) -> int:
    """Time thread ``tid`` has run on a CPU [ns] (schedstat's first field)."""
    return int(Path(f"/proc/{tid}/schedstat").read_text().split()[0])


def share_pct(tid: int, over_s: float) -> float:
    """The CPU share thread ``tid`` got over the next ``over_s`` seconds [%]."""
    ran0, t0 = _run_ns(tid), time.monotonic_ns()
    time.sleep(over_s)
    ran1, t1 = _run_ns(tid), time.monotonic_ns()
    return round(100 * (ran1 - ran0) / (t1 - t0), 2)


def cpu_on(cgroup: Path) -> bool:
    return "cpu" in (cgroup / "cgroup.subtree_control").read_text().split()


def cgroup_type(cgroup: Path) -> str:
    return (cgroup / "cgroup.type").read_text().strip()


def entries() -> int:
    return len(ledger.left("cgroup", include_live_owners=True).entries)


def exercise(mount: Path, tid: int, token: str, seen: dict) -> None:
    h = cgroups.detect()
    seen["detected"] = {"version": h.version, "root": str(h.root)}
    outer = h.thread_cgroup(tid)
    seen["outer"] = str(outer)
    seen["cpu_on_before"] = cpu_on(outer)
    seen["free_share_pct"] = share_pct(tid, FREE_S)

    own = cgroups.create(h, outer)
    seen["create"] = {"path": str(own.path), "type": cgroup_type(own.path), "parent_type": cgroup_type(own.parent),
                      "enabled_cpu": own.enabled_cpu, "cpu_on_outer": cpu_on(outer),
                      "cpu_on_parent": cpu_on(own.parent), "entries": entries()}
    h.set_limit(own.path, QUOTA_US, PERIOD_US)
    seen["limit"] = list(h.limit(own.path))
    h.move(tid, own.path)
    seen["moved"] = {"members": h.members(own.path), "thread_cgroup": str(h.thread_cgroup(tid)),
                     "foreign_limits": cgroups.foreign_limits([tid], own.path, h)}
    stat_start = h.cpu_stat(own.path)
    seen["limited_share_pct"] = share_pct(tid, LIMITED_S)
    throttling = cpustat.between(stat_start, h.cpu_stat(own.path), str(own.path))
    seen["throttling"] = asdict(throttling) if throttling else None
    h.set_burst(own.path, BURST_US)
    seen["burst"] = h.burst(own.path)

    problems = cgroups.remove(own)
    seen["remove"] = {"problems": problems, "thread_cgroup": str(h.thread_cgroup(tid)),
                      "path_exists": own.path.exists(), "parent_exists": own.parent.exists(),
                      "cpu_on_outer": cpu_on(outer), "entries": entries(),
                      "foreign_limits": cgroups.foreign_limits([tid], None, h)}

    credit(h, outer, tid, seen)

    # Another user's cgroup named as bbrlab names its own, in a subtree of its own (no ledger entry names it).
    foreign = mount / "foreign" / cgroups.PARENT / f"{cgroups.PREFIX}1-1"
    foreign.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, __file__, "hold", str(mount), str(tid), token],
                              stdout=subprocess.PIPE, text=True)
    try:
        left = Path(holder.stdout.readline().strip())
    finally:
        holder.send_signal(signal.SIGKILL)  # also when the line never came: no holder outlives the driver
        holder.wait(timeout=30)
    seen["leftover"] = {"path": str(left), "holder_rc": holder.returncode, "thread_cgroup": str(h.thread_cgroup(tid)),
                        "limit": list(h.limit(left)), "cpu_on_outer": cpu_on(outer),
                        "leftovers": [str(o.path) for o in cgroups.leftovers(h)],
                        "foreign_limits": cgroups.foreign_limits([tid], None, h)}
    cleared = cgroups.clear_leftovers(h)
    seen["cleared"] = {"paths": cleared, "thread_cgroup": str(h.thread_cgroup(tid)), "path_exists": left.exists(),
                       "parent_exists": left.parent.exists(), "cpu_on_outer": cpu_on(outer),
                       "entries": entries(), "foreign_exists": foreign.is_dir(),
                       "foreign_limits": cgroups.foreign_limits([tid], None, h)}
    for c in (foreign, foreign.parent, foreign.parent.parent):
        c.rmdir()


def credit(h: cgroups.Hierarchy, outer: Path, tid: int, seen: dict) -> None:
    """The credit model as :class:`~bbrlab.contention.credit.CreditSession` runs it, on v2: the thread in a cgroup
    of its own with no quota, the real controller writing ``cpu.max`` when the balance runs out."""
    own = cgroups.create(h, outer)
    h.move(tid, own.path)
    written = []

    def write_quota(quota_us: int | None) -> None:
        h.set_limit(own.path, quota_us, PERIOD_US)
        written.append([quota_us, list(h.limit(own.path))])

    controller = creditbalance.CreditController([tid], credit_s=CREDIT_S, baseline_pct=100 * QUOTA_US / PERIOD_US,
                                                tick_s=CREDIT_TICK_S, write_quota=write_quota,
                                                baseline_quota_us=QUOTA_US)
    limit_start = list(h.limit(own.path))
    controller.start()
    time.sleep(CREDIT_RUN_S)
    report = controller.stop()
    seen["credit"] = {"limit_start": limit_start, "written": written, "limit_end": list(h.limit(own.path)),
                      "thread_cgroup": str(h.thread_cgroup(tid)), "report": report.to_dict(),
                      "remove_problems": cgroups.remove(own), "thread_cgroup_after": str(h.thread_cgroup(tid)),
                      "path_exists": own.path.exists(), "entries": entries()}


def hold(tid: int) -> None:
    """What a session holding a cfs-quota cgroup does up to its body, then wait to be killed."""
    h = cgroups.detect()
    own = cgroups.create(h, h.thread_cgroup(tid))
    h.set_limit(own.path, QUOTA_US, PERIOD_US)
    h.move(tid, own.path)
    print(own.path, flush=True)
    while True:
        signal.pause()


def main() -> int:
    mode, mount, tid, token = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if mode == "hold":
        hold(tid)
        return 0
    seen: dict = {"kernel": os.uname().release}
    try:
        exercise(mount, tid, token, seen)
    except BaseException:
        seen["error"] = traceback.format_exc()
    print(json.dumps(seen), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
