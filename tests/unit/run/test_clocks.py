"""The clock offset of bbrlab.run.clocks: the NTP-style arithmetic, the drift, the mapping of remote times, and
one real measurement of this machine's own clock through a real bash process (offset 0 within its bound)."""

from __future__ import annotations

import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import LocalHost
from bbrlab.run import clocks


def test_the_exchange_with_the_smallest_round_trip_is_kept():
    # remote 2.5 s ahead; the second exchange has the shortest round trip (2 ms)
    exchanges = [(100.0, 102.51, 100.02), (200.0, 202.5015, 200.002), (300.0, 302.49, 300.05)]
    got = clocks.best_exchange(exchanges)
    assert got.round_trip_s == pytest.approx(0.002)
    assert got.uncertainty_s == pytest.approx(0.001)
    assert got.offset_s == pytest.approx(2.5005)
    assert got.measured_at == pytest.approx(200.001)
    assert got.exchanges == 3


def test_an_exchange_received_before_it_was_sent_is_refused():
    with pytest.raises(ValueError, match="before it was sent"):
        clocks.best_exchange([(10.0, 5.0, 9.0)])
    with pytest.raises(ValueError, match="no clock exchange"):
        clocks.best_exchange([])


def test_drift_and_remote_times_mapped_to_local():
    start = clocks.ClockOffset(offset_s=1.0, uncertainty_s=0.0005, round_trip_s=0.001, exchanges=20,
                               measured_at=1000.0)
    end = clocks.ClockOffset(offset_s=1.0001, uncertainty_s=0.0005, round_trip_s=0.001, exchanges=20,
                             measured_at=1010.0)  # 100 us in 10 s: 10 ppm
    drift = clocks.ClockDrift(start, end)
    assert drift.drift_ppm == pytest.approx(10.0)
    assert drift.drift_uncertainty_ppm == pytest.approx(100.0)
    assert drift.offset_at(1005.0) == pytest.approx(1.00005)
    assert drift.to_local(1006.00005) == pytest.approx(1005.0, abs=1e-9)
    d = drift.to_dict()
    assert d["drift_ppm"] == 10.0 and d["start"]["offset_s"] == 1.0
    assert clocks.ClockDrift.from_dict(d) == drift
    assert clocks.to_local(1001.0, d) == pytest.approx(1000.0, abs=1e-9)


def test_this_machines_own_clock_through_a_real_bash_process_has_no_offset():
    got = clocks.measure(LocalHost(), exchanges=10)
    assert got.exchanges == 10
    assert 0 < got.uncertainty_s < 0.05
    assert abs(got.offset_s) <= got.uncertainty_s + 1e-6  # $EPOCHREALTIME has microsecond resolution


def test_a_clock_watch_on_this_machine_records_start_end_and_drift():
    with clocks.ClockWatch({"here": LocalHost()}, exchanges=5) as watch:
        pass
    rec = watch.drifts["here"].to_dict()
    assert set(rec) == {"start", "end", "drift_ppm", "drift_uncertainty_ppm"}
    assert rec["end"]["measured_at"] > rec["start"]["measured_at"]
    with pytest.raises(ValueError, match="not a run's"):  # a run's record names the sender and the emulator
        watch.record()


@pytest.mark.parametrize("bad", [0, 1001, 2.5, True])
def test_exchanges_out_of_range_are_refused_naming_the_field(bad):
    clock = clocks.RemoteClock(LocalHost())
    try:
        with pytest.raises(ValidationError, match="exchanges"):
            clock.measure(bad)
    finally:
        clock.close()


def test_a_run_fails_when_a_clock_is_known_worse_than_one_sample_interval():
    from bbrlab.core.errors import BbrlabError
    from bbrlab.run import checks

    good = clocks.ClockOffset(offset_s=0.1, uncertainty_s=0.0004, round_trip_s=0.0008, exchanges=20, measured_at=1.0)
    bad = clocks.ClockOffset(offset_s=0.1, uncertainty_s=0.006, round_trip_s=0.012, exchanges=20, measured_at=2.0)
    checks.clocks_known(clocks.RunClocks(sender=clocks.ClockDrift(good, good)), 5)
    with pytest.raises(BbrlabError, match=r"emulator's clock offset at the run's end is uncertain by 6\.000 ms"):
        checks.clocks_known(clocks.RunClocks(clocks.ClockDrift(good, good), clocks.ClockDrift(good, bad)), 5)


def test_a_measurement_goes_on_in_batches_while_its_best_uncertainty_is_above_the_target():
    # a real bash on this machine answers in microseconds: a 1 ms target is met by the first batch, a target
    # no exchange can meet (1 ns) makes the measurement go on, a batch at a time, up to its cap
    clock = clocks.RemoteClock(LocalHost())
    try:
        assert clock.measure(5, target_uncertainty_s=0.001).exchanges == 5
        assert clock.measure(5, target_uncertainty_s=1e-9, max_exchanges=23).exchanges == 23
        assert clock.measure(5).exchanges == 5  # no target: one batch
    finally:
        clock.close()
