import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.core.units import parse_buffer, parse_percent, parse_rate_mbit, parse_size_bytes, parse_time_ms
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario, check_cca


@pytest.mark.parametrize("text,ms", [("20ms", 20), ("0.5s", 500), ("500us", 0.5), (7, 7), ("1e1ms", 10)])
def test_parse_time(text, ms):
    assert parse_time_ms(text) == pytest.approx(ms)


@pytest.mark.parametrize("text,mbit", [("50mbit", 50), ("1gbit", 1000), ("500kbit", 0.5), ("100", 100)])
def test_parse_rate(text, mbit):
    assert parse_rate_mbit(text) == pytest.approx(mbit)


def test_parse_size_and_buffer_and_percent():
    assert parse_size_bytes("64k") == 65536
    assert parse_size_bytes("64kb") == 64000
    assert parse_buffer("1bdp") == (1.0, None)
    assert parse_buffer("256k") == (None, 262144)
    assert parse_percent("25%") == 25.0


@pytest.mark.parametrize("bad", ["fast", "20 parsecs", "nanms", "", "inf"])
def test_parse_time_rejects_with_field(bad):
    with pytest.raises(ValidationError) as e:
        parse_time_ms(bad, field="link.rtt")
    assert "link.rtt" in str(e.value)


def test_link_derived_values():
    link = Link(rtt_ms=20, rate_mbit=50, buffer_bdp=1)
    assert link.bdp_bytes == 125_000
    assert link.queue_limit_bytes == 125_000
    assert link.one_way_delays_ms() == (10, 10)
    assert Link(rtt_ms=20, rate_mbit=50, delay_split="forward").one_way_delays_ms() == (20, 0)
    assert Link(rtt_ms=20, rate_mbit=50, buffer_bdp=0.5).queue_bdp == 0.5
    small = Link(rtt_ms=0, rate_mbit=1, buffer_bdp=None, buffer_bytes=3028)
    assert small.queue_limit_bytes == small.min_queue_bytes == 3028  # two frames of 1514 bytes, as asked


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(rtt_ms=-1, rate_mbit=10), "link.rtt_ms"),
        (dict(rtt_ms=10, rate_mbit=0), "link.rate_mbit"),
        (dict(rtt_ms=10, rate_mbit=10, loss_model="uniform", loss_pct=150), "link.loss_pct"),
        (dict(rtt_ms=10, rate_mbit=10, loss_model="bursty"), "link.loss_model"),
        (dict(rtt_ms=10, rate_mbit=10, buffer_bdp=None), "link.buffer"),
        (dict(rtt_ms=10, rate_mbit=10, buffer_bdp=1, buffer_bytes=5000), "link.buffer"),
        (dict(rtt_ms=10, rate_mbit=10, jitter_ms=50), "link.jitter_ms"),
    ],
)
def test_link_rejects(kwargs, field):
    with pytest.raises(ValidationError) as e:
        Link(**kwargs)
    assert e.value.field == field
    assert field in str(e.value)


def test_contention_period_and_limits():
    c = Contention(timeslice_ms=1, cpu_share_pct=25)
    assert (c.runtime_ns, c.deadline_ns, c.period_ns) == (1_000_000, 1_000_000, 4_000_000)
    assert c.bandwidth == pytest.approx(0.25)
    assert Contention(timeslice_ms=10, cpu_share_pct=100).unlimited
    for kwargs, field in [
        (dict(timeslice_ms=0, cpu_share_pct=50), "contention.timeslice_ms"),
        (dict(timeslice_ms=1, cpu_share_pct=0), "contention.cpu_share_pct"),
        (dict(timeslice_ms=1, cpu_share_pct=101), "contention.cpu_share_pct"),
        (dict(timeslice_ms=500, cpu_share_pct=1), "contention.cpu_share_pct"),  # period 50 s > kernel max
        (dict(timeslice_ms=0.0001, cpu_share_pct=50), "contention.timeslice_ms"),  # runtime < 1024 ns
    ]:
        with pytest.raises(ValidationError) as e:
            Contention.from_dict(kwargs)
        assert e.value.field == field


@pytest.mark.parametrize("hostile", ["bbr; touch /tmp/x", "$(id)", "bbr\nreboot", "BBR", "a" * 16, 3])
def test_cca_names_refuse_hostile_values(hostile):
    with pytest.raises(ValidationError):
        check_cca(hostile)
    with pytest.raises(ValidationError):
        Flow(cca=hostile)


def test_scenario_round_trip_and_stable_id():
    s = Scenario(Link(20, 50), Contention(10, 50), Flow("bbr", IperfParams(5)), repetition=3)
    again = Scenario.from_dict(s.to_dict())
    assert again == s and again.run_id == s.run_id
    assert s.run_id.startswith("bbr-ts10ms-sh50-rtt20ms-50mbit-r03-")
    other = Scenario(Link(20, 50), Contention(10, 50), Flow("bbr", IperfParams(5)), repetition=4)
    assert other.run_id != s.run_id
