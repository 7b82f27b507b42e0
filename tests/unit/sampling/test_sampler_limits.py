"""Sampler limits are validated (issue 24, item 10): a sampled flow with more streams than the netlink and
BPF samplers watch, or with more samples x streams than a run's log is bounded to, is refused before
anything runs, naming streams / sample_ms / duration_s and the allowed range."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling.sockdiag import check_ports
from bbrlab.scenario.scenario import (
    MAX_SAMPLE_RECORDS,
    SAMPLE_RECORD_BYTES,
    SAMPLER_MAX_PORTS,
    Flow,
    IperfParams,
    RsyncParams,
)

NATIVE = Path(sampling.__file__).parent / "native"


def test_the_port_cap_is_the_c_programs_own():
    header = (NATIVE / "sampler_common.h").read_text()
    assert int(re.search(r"#define MAX_PORTS (\d+)", header).group(1)) == SAMPLER_MAX_PORTS == 64
    check_ports(list(range(20_000, 20_064)))
    with pytest.raises(ValidationError):
        check_ports(list(range(20_000, 20_065)))


@pytest.mark.parametrize("sampler", ["bpf", "netlink"])
def test_more_streams_than_the_sampler_watches_are_refused_in_the_flow(sampler):
    assert Flow("bbr", IperfParams(duration_s=10, streams=64), sample_ms=100, sampler=sampler).params.streams == 64
    with pytest.raises(ValidationError) as e:
        Flow("bbr", IperfParams(duration_s=10, streams=65), sample_ms=100, sampler=sampler)
    assert e.value.field == "flow.streams" and e.value.allowed.startswith(f"1 <= streams <= 64 with sampler {sampler}")
    assert Flow("bbr", IperfParams(duration_s=10, streams=65)).params.streams == 65  # unsampled: no sampler to outgrow


def test_the_ss_loop_has_no_port_cap_but_the_same_bound_on_samples():
    assert Flow("bbr", IperfParams(duration_s=10, streams=128), sample_ms=100, sampler="ss").params.streams == 128
    with pytest.raises(ValidationError, match="samples x streams <= 500000"):
        Flow("bbr", IperfParams(duration_s=3600, streams=128), sample_ms=100, sampler="ss")


def test_samples_times_streams_times_duration_beyond_the_bound_is_refused_with_the_way_back():
    Flow("bbr", IperfParams(duration_s=500, streams=1), sample_ms=1)  # 500000: the bound itself
    with pytest.raises(ValidationError) as e:
        Flow("bbr", IperfParams(duration_s=501, streams=1), sample_ms=1)
    assert e.value.field == "flow.sample_ms with flow.streams and flow.duration_s"
    assert "is 501000" in e.value.allowed and "sample_ms >= 2 ms" in e.value.allowed
    assert "duration_s <= 500 s" in e.value.allowed and ", or streams <=" not in e.value.allowed  # even 1 is too many
    with pytest.raises(ValidationError) as e:  # 64 streams at 10 ms: 78 s at most
        Flow("bbr", IperfParams(duration_s=100, streams=64), sample_ms=10)
    assert "sample_ms >= 13 ms" in e.value.allowed and "duration_s <= 78 s" in e.value.allowed
    assert "streams <= 50" in e.value.allowed


def test_an_rsync_flow_is_bounded_over_its_timeout():
    with pytest.raises(ValidationError) as e:
        Flow("bbr", RsyncParams(), sample_ms=1)  # 1200 s timeout at 1 ms
    assert e.value.field == "flow.sample_ms with flow.streams and flow.transfer_timeout_s"
    assert Flow("bbr", RsyncParams(), sample_ms=10).sample_ms == 10


def _spec(**over) -> dict:
    base = {"name": "s", "ccas": ["bbr"], "timeslices_ms": [10], "cpu_shares_pct": [100], "rtts_ms": [20],
            "rates_mbit": [100], "repetitions": 1, "duration_s": 20, "sample_ms": 10, "streams": [1, 8]}
    return {**base, **over}


def test_a_spec_names_streams_and_the_allowed_range():
    assert CampaignSpec.from_dict(_spec()).runs == 2
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict(_spec(streams=[1, 100], sampler="netlink"))
    assert e.value.field == "streams[1]" and "1 <= streams <= 64 with sampler netlink" in str(e.value)
    assert CampaignSpec.from_dict(_spec(streams=[1, 100], sample_ms=None)).runs == 2  # unsampled: fine


def test_a_spec_names_sample_ms_streams_and_duration_s_beyond_the_bound():
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict(_spec(duration_s=1000, streams=[1, 8]))
    assert e.value.field == "sample_ms with streams[1] and duration_s"
    assert "sample_ms >= 16 ms" in str(e.value) and "duration_s <= 625 s" in str(e.value)
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict(_spec(sample_ss_ms=1, sample_ms=None, duration_s=600, streams=[1]))
    assert e.value.field == "sample_ms with streams[0] and duration_s"


def test_the_bound_keeps_a_log_below_350_mb():
    assert MAX_SAMPLE_RECORDS * SAMPLE_RECORD_BYTES <= 350e6
