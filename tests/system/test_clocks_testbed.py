"""The sender's and the emulator's clocks against this machine's, measured on the local testbed (TCG guests):
the offset is known to a few milliseconds (under 1 ms on a quiet host), and measured twice its drift is small."""

from __future__ import annotations

import pytest

from bbrlab.run import clocks

pytestmark = [pytest.mark.system, pytest.mark.testbed]


#: The bound on one clock measurement's uncertainty [s]. Measured: 40 measurements (20 ClockWatch starts and ends
#: per guest) at a load average of 4-5 (other test sessions on this 2-core machine) gave 0.48-0.65 ms; a fresh,
#: slower machine of this kind gave 1.106 ms in a full suite, and 1.03 and 1.19 ms in 2 of 12 recorded runs. The
#: 1 ms goal of a run's measurement is what it aims at, in batches, not what a busy host can promise.
UNCERTAINTY_BOUND_S = 2.5e-3


def test_guest_clock_offsets_are_known_to_a_few_milliseconds(testbed):
    hosts = {"sender": testbed.sender.host, "emulator": testbed.emulator.host}
    with clocks.ClockWatch(hosts) as watch:
        pass
    rec = watch.record().measured()
    print(rec)
    assert set(rec) == set(hosts)
    for name, drift in rec.items():
        for when, offset in (("start", drift.start), ("end", drift.end)):
            assert 0 < offset.uncertainty_s < UNCERTAINTY_BOUND_S, (name, when, drift)
        assert drift.drift_ppm is not None
