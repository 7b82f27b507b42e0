"""The sender's and the emulator's clocks against this machine's, measured on the local testbed (TCG guests):
the offset is known to better than a millisecond, and measured twice its drift is small."""

from __future__ import annotations

import pytest

from bbrlab.run import clocks

pytestmark = [pytest.mark.system, pytest.mark.testbed]


def test_guest_clock_offsets_are_known_to_better_than_a_millisecond(testbed):
    hosts = {"sender": testbed.sender.host, "emulator": testbed.emulator.host}
    with clocks.ClockWatch(hosts) as watch:
        pass
    rec = watch.record()
    print(rec)
    for name in hosts:
        for when in ("start", "end"):
            assert rec[name][when]["uncertainty_s"] < 1e-3, (name, when, rec[name])
        assert rec[name]["drift_ppm"] is not None
