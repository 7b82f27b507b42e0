"""The check that fails a run whose uncontended flow stopped on a loss-free link (issue 35, item 9): the stall
seen in the two-testbed test carried 33.8 Mbit/s for 2 s and then nothing for 15 s at 100 % share."""

from __future__ import annotations

import pytest

from bbrlab.core.errors import RunFailed
from bbrlab.link.counters import LinkCounters, QdiscCounters
from bbrlab.run import checks
from bbrlab.run.iperf import Interval
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario


def _intervals(mbit: list[float]) -> list[Interval]:
    return [Interval(float(i), float(i + 1), m, 0) for i, m in enumerate(mbit)]


STALL = [30.1, 33.8] + [0.0] * 15
UNCONTENDED = Scenario(Link(rtt_ms=10, rate_mbit=50), Contention(10, 100), Flow("cubic", IperfParams(duration_s=17)))


def test_an_uncontended_flow_that_stops_for_seconds_fails_with_the_emulators_counters():
    delta = LinkCounters({"netem": QdiscCounters(900, 59400, 0, 0)},
                         {"netem": QdiscCounters(4100, 5900000, 0, 0), "tbf": QdiscCounters(4087, 5880000, 13, 0)})
    with pytest.raises(RunFailed, match=r"stalled: .* nothing for 3 s from 2 s.*\"drops\": 13"):
        checks.not_stalled(_intervals(STALL), UNCONTENDED, delta)


@pytest.mark.parametrize("mbit", [
    [0.0, 0.0, 0.0, 0.0, 40.0, 48.0],  # nothing before the flow began: the connection's start, not a stall
    [45.0, 0.0, 0.0, 47.0, 0.0, 0.0, 46.0],  # two silent seconds at a time: an RTO or two, recovered
    [48.0] * 10,
])
def test_an_uncontended_flow_that_keeps_moving_passes(mbit):
    checks.not_stalled(_intervals(mbit), UNCONTENDED)


@pytest.mark.parametrize("scenario", [
    Scenario(Link(rtt_ms=10, rate_mbit=50), Contention(10, 25), Flow("bbr", IperfParams(duration_s=17))),  # the subject
    Scenario(Link(rtt_ms=10, rate_mbit=50, loss_model="uniform", loss_pct=30), Contention(10, 100),
             Flow("cubic", IperfParams(duration_s=17))),  # RTO backoff under heavy loss is what such a run measures
])
def test_contended_or_lossy_runs_are_not_judged(scenario):
    checks.not_stalled(_intervals(STALL), scenario)
