"""A signal ends a command on an SSH host at once (bbrlab.core.commands.interruptible_remote), for real on the suite's
sender guest: before, invoke waited for the remote command's output to end, so a signalled campaign waited for a
copy in flight (38 s of rsync, 2026-12-02). The remote command is not waited for; the connection stays usable."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from bbrlab.core.signals import Interrupted, interruptible

pytestmark = [pytest.mark.system, pytest.mark.testbed]

#: The remote command's own length [s]: a stop that waited for it would take at least this long.
COMMAND_S = 30


def test_sigterm_ends_a_remote_command_without_waiting_for_it(testbed):
    host = testbed.sender.host
    seconds = f"{COMMAND_S}.{os.getpid()}"  # an argument no other sleep has, to find it afterwards
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    start = time.monotonic()
    with pytest.raises(Interrupted):
        with interruptible():
            timer.start()
            host.run(["sleep", seconds], timeout=COMMAND_S + 30)
    waited_s = time.monotonic() - start
    timer.cancel()
    assert waited_s < COMMAND_S / 2, f"the signal's exception left after {waited_s:.1f} s"
    assert host.output(["echo", "still usable"], timeout=30) == "still usable"
    host.run(["pkill", "-f", f"sleep {seconds}"], check=False, timeout=30)
