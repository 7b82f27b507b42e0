"""A ``bbrlab campaign run`` started as a subprocess and SIGKILLed at a chosen moment, for the resume tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BBRLAB = str(Path(sys.executable).with_name("bbrlab"))


def complete(out: Path) -> int:
    """How many runs of the campaign directory ``out`` are committed."""
    return len(list((out / "runs").glob("*/record.json")))


def in_flight(out: Path) -> bool:
    """Whether a run of ``out`` is in progress (its files under ``.tmp``)."""
    tmp = out / ".tmp"
    return tmp.is_dir() and any(tmp.iterdir())


def run_argv(spec_path: Path, out: Path) -> list[str]:
    """``bbrlab campaign run SPEC --out OUT --no-progress``."""
    return [BBRLAB, "campaign", "run", str(spec_path), "--out", str(out), "--no-progress"]


def kill_when(argv: list[str], ready: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
    """Start ``argv``, SIGKILL it once ``ready()`` holds (polled), and check that the kill is what ended it;
    fails naming ``what`` when the campaign ends first or ``ready`` does not hold within ``timeout_s``."""
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            assert first.poll() is None, f"campaign ended early: {first.communicate()}"
            assert time.monotonic() < deadline, f"not {what} within {timeout_s:g} s"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL


def resume(argv: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run ``argv`` again to its end; fails with the end of its stderr unless it succeeds."""
    again = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert again.returncode == 0, again.stderr[-3000:]
    return again
