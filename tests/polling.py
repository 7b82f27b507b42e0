"""Waiting in tests on a condition that becomes true by itself (a process starts, a file appears)."""

from __future__ import annotations

import time

import pytest


def wait_for(condition, what: str, deadline_s: float, poll_s: float = 0.05):
    """Poll ``condition`` every ``poll_s`` until it returns something truthy, and return that; fail the test
    naming ``what`` after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    pytest.fail(f"timed out after {deadline_s} s waiting for {what}")
