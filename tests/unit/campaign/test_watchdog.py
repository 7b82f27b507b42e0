"""The attempt bound and the worker's stack dump of bbrlab.campaign.watchdog (issue 35's hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from bbrlab.campaign import watchdog
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario
from tests.campaign_runs import run_metadata


def _scenario(duration_s: float = 20, kernel: str | None = None) -> Scenario:
    return Scenario(Link(rate_mbit=50, rtt_ms=20), Contention(timeslice_ms=10, cpu_share_pct=100),
                    Flow(cca="cubic", params=IperfParams(duration_s=duration_s)), kernel=kernel)


def test_the_bound_grows_with_the_transfer_and_a_sender_kernel():
    from bbrlab.run import iperf

    plain = watchdog.attempt_bound_s(_scenario(20))
    assert plain == watchdog.SETUP_ALLOWANCE_S + watchdog.DURATION_FACTOR * (20 + iperf.CLIENT_MARGIN_S)
    assert watchdog.attempt_bound_s(_scenario(40)) - plain == watchdog.DURATION_FACTOR * 20
    assert watchdog.attempt_bound_s(_scenario(20, "debian-6.1")) - plain == watchdog.REBOOT_ALLOWANCE_S


def test_the_dump_file_is_not_made_through_a_symbolic_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / watchdog.DUMP_FILE).symlink_to(target)
    with pytest.raises(OSError):
        watchdog.arm_stack_dump(tmp_path)
    assert target.read_text() == "keep"


def test_a_process_holding_the_gil_for_good_still_dumps_every_stack(tmp_path):
    """The process calls libc's sleep without releasing the GIL (as a deadlocked interpreter runs no Python):
    the dump comes from faulthandler's C handler all the same."""
    code = ("import ctypes, sys\n"
            "from bbrlab.campaign import watchdog\n"
            "watchdog.arm_stack_dump(sys.argv[1])\n"
            "print('armed', flush=True)\n"
            "def stuck_here():\n"
            "    ctypes.PyDLL(None).sleep(60)\n"
            "stuck_here()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "armed\n"
        path = tmp_path / watchdog.DUMP_FILE
        deadline = time.monotonic() + 30
        while "stuck_here" not in path.read_text():  # the signal may come before the sleep starts: resend
            assert time.monotonic() < deadline, path.read_text()
            os.kill(proc.pid, watchdog.DUMP_SIGNAL)
            time.sleep(0.2)
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_an_attempt_hung_in_the_main_thread_ends_at_its_bound_restored_and_failed(tmp_path):
    """A single-testbed campaign's attempt blocked for good on a lock (as ``Thread.start()`` was in the hang of
    issue 35) ends at its bound: its ``finally`` (a run's restore) runs, every thread's stack is kept, the
    attempt is failed, and the next attempt of the run is made as usual."""
    import threading

    from bbrlab.campaign.loop import Attempt, InProcess

    restored = []

    def run(scenario, staging, *, run_id, attempt):
        try:
            if attempt == 1:
                threading.Event().wait()  # never set: a lock wait in the main thread
            return run_metadata(scenario)
        finally:
            restored.append(attempt)

    executor = InProcess(run, tmp_path, bound_s=lambda scenario: 1.0)
    t0 = time.monotonic()
    hung = executor.run(Attempt("r1", 1, _scenario(), 0))
    took_s = time.monotonic() - t0
    assert hung.status == "failed" and hung.reason.startswith("hung:") and restored == [1]
    assert hung.metadata["hang"] == {"bound_s": 1.0}
    assert "in run" in (hung.staging / watchdog.STACKS_FILE).read_text()
    assert took_s < 10  # ended at its 1 s bound, not never
    ok = executor.run(Attempt("r1", 2, _scenario(), 0))
    assert ok.status == "ok" and restored == [1, 2] and not (ok.staging / watchdog.STACKS_FILE).exists()
    assert signal.getsignal(watchdog.HUNG_SIGNAL) == signal.SIG_DFL  # put back
