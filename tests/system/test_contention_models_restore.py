"""Every model but deadline restores a real QEMU vCPU thread when its process is signalled, and what a SIGKILLed
process left is cleared by recovery's functions (deadline's versions: test_contention.py, test_contention_restore.py).

Each test starts a vCPU thread (a tiny QEMU's, TCG, no disk; or, ``busy-thread``, a busy thread of a
multi-threaded Python process, which runs without QEMU and so without the testbed lock) and a bbrlab process of
its own that holds the contention on it, then signals that process: SIGTERM must leave nothing (the thread back in its cgroup with its CPU mask,
bbrlab's cgroup removed, the busy loops gone); after SIGKILL the cgroup or the loops are left, and
:func:`bbrlab.contention.cgroups.clear_leftovers` / :func:`bbrlab.contention.load.clear_leftovers` (what
:func:`bbrlab.run.recovery.recover` calls before a campaign's next run) clear them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bbrlab.contention import cgroups, load
from tests.system.test_contention import TinyQemu

pytestmark = pytest.mark.system

HOLDER = """
import json, signal, sys
from bbrlab.contention.models import contended
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.scenario import Contention
with contended(LocalHost(), [int(sys.argv[1])], Contention.from_dict(json.loads(sys.argv[2])), watch_interval_s=0.2) as s:
    own = getattr(s, "own", None)
    print(json.dumps({"cgroup": str(own.path) if own else None, "loops": [p.pid for p in getattr(s, "loops", [])]}),
          flush=True)
    while True:
        signal.pause()
"""

MODELS = {
    "cfs-quota": {"timeslice_ms": 25, "cpu_share_pct": 25, "model": "cfs-quota"},
    "cfs-burst": {"timeslice_ms": 25, "cpu_share_pct": 25, "model": "cfs-burst", "burst_ms": 10},
    "credit": {"timeslice_ms": 25, "cpu_share_pct": 25, "model": "credit", "credit_s": 1},
    "competing-load": {"timeslice_ms": 1, "cpu_share_pct": 50, "model": "competing-load"},
}


BUSY_THREAD = """
import threading, time
def spin():
    while True:
        pass
t = threading.Thread(target=spin, daemon=True)
t.start()
print(t.native_id, flush=True)
time.sleep(3600)
"""


class BusyThread:
    """A busy thread of a process of its own (its main thread sleeps), standing in for a vCPU thread."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_THREAD], stdout=subprocess.PIPE, text=True)
        self.threads = [int(self.proc.stdout.readline())]

    def stop(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(params=["qemu", "busy-thread"])
def qemu(request, tmp_path):
    vm = TinyQemu(tmp_path) if request.param == "qemu" else BusyThread()
    yield vm
    vm.stop()


def _gone(pid: int) -> bool:
    """No process ``pid`` any more (or only its zombie, waiting for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _hold(tid: int, model: str) -> tuple[subprocess.Popen, dict]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tid), json.dumps(MODELS[model])],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    line = holder.stdout.readline()
    assert line, f"the holder exited ({holder.wait()}) before applying {model}"
    return holder, json.loads(line)


def _assert_held(tid: int, model: str, held: dict, h: cgroups.Hierarchy) -> None:
    if model == "competing-load":
        assert len(held["loops"]) == 1 and len(os.sched_getaffinity(tid)) == 1
        assert os.sched_getaffinity(held["loops"][0]) == os.sched_getaffinity(tid)
    else:
        assert h.thread_cgroup(tid) == Path(held["cgroup"])


@pytest.mark.parametrize("model", list(MODELS))
def test_sigterm_restores_everything(qemu, model):
    h, (tid,) = cgroups.detect(), qemu.threads
    cgroup, mask = h.thread_cgroup(tid), os.sched_getaffinity(tid)
    holder, held = _hold(tid, model)
    try:
        _assert_held(tid, model, held, h)
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if holder.poll() is None:
            holder.kill()
    assert h.thread_cgroup(tid) == cgroup and os.sched_getaffinity(tid) == mask
    assert held["cgroup"] is None or not Path(held["cgroup"]).exists()
    assert all(_gone(p) for p in held["loops"])


@pytest.mark.parametrize("model", list(MODELS))
def test_after_sigkill_recovery_clears_what_was_left(qemu, model):
    h, (tid,) = cgroups.detect(), qemu.threads
    cgroup, mask = h.thread_cgroup(tid), os.sched_getaffinity(tid)
    holder, held = _hold(tid, model)
    holder.send_signal(signal.SIGKILL)
    assert holder.wait(timeout=30) == -signal.SIGKILL
    _assert_held(tid, model, held, h)  # a killed process restores nothing: it is all still there
    assert not any(_gone(p) for p in held["loops"])
    removed, killed = cgroups.clear_leftovers(), load.clear_leftovers()  # (others' leftovers too, on a shared host)
    assert held["cgroup"] is None or held["cgroup"] in removed
    assert set(held["loops"]) <= set(killed)
    assert h.thread_cgroup(tid) == cgroup and os.sched_getaffinity(tid) == mask
    assert held["cgroup"] is None or not Path(held["cgroup"]).exists()
    assert all(_gone(p) for p in held["loops"])
    assert held["cgroup"] not in cgroups.clear_leftovers() and not set(held["loops"]) & set(load.clear_leftovers())
