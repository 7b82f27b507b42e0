"""The host guard's spec key and its place in the campaign loop (bbrlab.campaign.hostguard).

The loop is driven by a stand-in run function (no testbed, real files, as in test_engine.py) that returns the
``metadata.host_other`` a run on a busy or quiet host records; the measurement itself is tested on the real
/proc in tests/system/test_host_outside_host.py and on the testbed in test_host_guard_testbed.py.
"""

from __future__ import annotations

import json

import pytest

from bbrlab.campaign import hostguard
from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from tests.campaign_runs import host_other as outside_load

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

BASE = {"name": "guard", "ccas": ["cubic", "bbr"], "timeslices_ms": [10], "cpu_shares_pct": [100],
        "rtts_ms": [20], "rates_mbit": [100], "repetitions": 1, "duration_s": 2, "max_attempts": 2}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def host_other(pct: float) -> dict:
    return outside_load(pct, [{"pid": 4242, "comm": "cc1", "cpu_pct": 98.0}])


def loads_run(calls: list, busy_pct):
    """A run function whose host was ``busy_pct(run_id, attempt)`` % busy outside the testbed."""

    def run(scenario, staging, *, run_id, attempt):
        calls.append((run_id, attempt))
        (staging / "iperf.json").write_text("{}")
        return {"host_other": host_other(busy_pct(run_id, attempt))}

    return run


@pytest.mark.parametrize("value, field, allowed", [
    ({"max_other_busy_pct": 0}, "host_guard.max_other_busy_pct", "0 < max_other_busy_pct <= 100"),
    ({"max_other_busy_pct": 101}, "host_guard.max_other_busy_pct", "0 < max_other_busy_pct <= 100"),
    ({"max_other_busy_pct": "25"}, "host_guard.max_other_busy_pct", "a number"),
    ({"max_other_busy_pct": True}, "host_guard.max_other_busy_pct", "a number"),
    ({"limit": 25}, "host_guard.limit", "max_other_busy_pct"),
    ("on", "host_guard", "off, or {max_other_busy_pct: N}"),
    (30, "host_guard", "off, or {max_other_busy_pct: N}"),
])
def test_bad_values_name_the_field_and_the_range(value, field, allowed):
    with pytest.raises(ValidationError) as e:
        spec(host_guard=value)
    assert str(e.value).startswith(field + " = ") and allowed in str(e.value)


def test_the_key_round_trips_and_is_left_out_of_spec_yaml_by_default():
    assert "host_guard" not in spec().to_dict() and spec().host_guard is None
    for value in ("off", False, {"max_other_busy_pct": 40}):
        s = spec(host_guard=value)
        assert CampaignSpec.from_dict(s.to_dict()) == s
    assert spec(host_guard=False).to_dict()["host_guard"] == "off"  # YAML reads a bare off as false


def test_the_environment_replaces_only_the_default(monkeypatch):
    monkeypatch.delenv(hostguard.ENV, raising=False)
    assert hostguard.effective(None).max_other_busy_pct == hostguard.DEFAULT_MAX_OTHER_BUSY_PCT
    monkeypatch.setenv(hostguard.ENV, "off")
    assert hostguard.effective(None).max_other_busy_pct is None
    assert hostguard.effective(hostguard.HostGuard(10.0)).max_other_busy_pct == 10.0  # the spec's own wins
    monkeypatch.setenv(hostguard.ENV, "60")
    assert hostguard.effective(None).max_other_busy_pct == 60.0
    for bad in ("busy", "0", "250"):
        monkeypatch.setenv(hostguard.ENV, bad)
        with pytest.raises(ValidationError, match=hostguard.ENV):
            hostguard.effective(None)


def test_a_bad_environment_value_is_refused_before_any_run(tmp_path, monkeypatch):
    monkeypatch.setenv(hostguard.ENV, "lots")
    calls: list = []
    with pytest.raises(ValidationError, match=hostguard.ENV):
        campaign.run_campaign(spec(), tmp_path, loads_run(calls, lambda r, a: 0.0), options=QUIET)
    assert calls == []


def test_a_busy_attempt_fails_and_is_retried_after_the_queued_runs(tmp_path):
    calls: list = []
    st = campaign.run_campaign(spec(host_guard={"max_other_busy_pct": 25}, repetitions=2), tmp_path,
                               loads_run(calls, lambda r, a: 60.0 if (len(calls) == 1) else 4.0),
                               options=QUIET)
    assert (st.done, st.failed_attempts) == (4, 1)
    first = calls[0][0]
    assert calls[-1] == (first, 2) and [a for _, a in calls[1:-1]] == [1, 1, 1]  # the others ran in between
    (failed,) = [json.loads(p.read_text()) for p in (tmp_path / "failed").glob("*/record.json")]
    assert hostguard.is_host_busy(failed["reason"])
    assert all(part in failed["reason"] for part in ("60.0 %", "cc1 (pid 4242)", "25 %"))
    said = {"max_other_busy_pct": 25.0, "other_busy_pct": 60.0, "busy": True}
    assert failed["metadata"]["host_guard"] == said
    ok = json.loads((tmp_path / "runs" / first / "record.json").read_text())
    assert ok["metadata"]["host_guard"]["busy"] is False
    assert ok["metadata"]["host_other"]["other_busy_pct"] == 4.0


def test_a_host_that_stays_busy_ends_the_campaign_with_the_reason(tmp_path):
    calls: list = []
    with pytest.raises(campaign.CampaignAborted, match="host busy: 90.0 %"):
        campaign.run_campaign(spec(host_guard={"max_other_busy_pct": 25}, repetitions=4), tmp_path,
                              loads_run(calls, lambda r, a: 90.0),
                              options=CampaignOptions(progress=False, max_consecutive_failures=3))
    assert len(calls) <= 3 * 2 + 2 * 5  # bounded: max_attempts per run, the streak stops it


def test_off_records_a_busy_run_as_ok(tmp_path, monkeypatch):
    monkeypatch.delenv(hostguard.ENV, raising=False)
    calls: list = []
    st = campaign.run_campaign(spec(host_guard="off"), tmp_path, loads_run(calls, lambda r, a: 95.0),
                               options=QUIET)
    assert (st.done, st.failed_attempts) == (2, 0)
    ok = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/record.json")]
    assert all("host_guard" not in r["metadata"] for r in ok)


def test_the_default_applies_when_the_spec_leaves_the_key_out(tmp_path, monkeypatch):
    monkeypatch.delenv(hostguard.ENV, raising=False)
    calls: list = []
    pct = hostguard.DEFAULT_MAX_OTHER_BUSY_PCT + 1
    st = campaign.run_campaign(spec(max_attempts=1), tmp_path, loads_run(calls, lambda r, a: pct),
                               options=QUIET)
    assert (st.done, st.failed_attempts) == (0, 2)


def test_a_run_with_nothing_measured_is_not_judged(tmp_path):
    """A lab whose sender's QEMU runs on another machine records no host_other: the guard stays out."""
    calls: list = []

    def run(scenario, staging, *, run_id, attempt):
        calls.append(run_id)
        (staging / "iperf.json").write_text("{}")
        return {}

    st = campaign.run_campaign(spec(host_guard={"max_other_busy_pct": 1}), tmp_path, run, options=QUIET)
    assert (st.done, st.failed_attempts) == (2, 0)


def test_busy_now_says_so_only_above_the_limit():
    guard = hostguard.HostGuard(25.0)
    assert hostguard.busy_now_line({"other_busy_pct": 10.0}, guard) is None
    line = hostguard.busy_now_line({"other_busy_pct": 70.0, "cpus": 2, "window_s": 1.5,
                                    "top": [{"pid": 1, "comm": "make", "cpu_pct": 99.0}]}, guard)
    assert line.startswith("the host is busy now: 70.0 %") and "make (pid 1)" in line
