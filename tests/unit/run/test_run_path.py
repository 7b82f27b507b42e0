"""The run path's pure parts: signals become one exception, the campaign is the one failure boundary,
and netem's drops are judged against the configured loss."""

from __future__ import annotations

import os
import signal
import time

import pytest

from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.core.errors import RunFailed, ValidationError
from bbrlab.core.signals import Interrupted, interruptible
from bbrlab.link import counters as link
from bbrlab.run import checks, record, runmeta
from bbrlab.run.sender import SenderSysctls
from bbrlab.scenario.scenario import Flow, IperfParams, Link
from tests.unit.campaign.test_campaign_spec import spec


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_each_signal_becomes_interrupted_once_and_handlers_come_back(sig):
    before = signal.getsignal(sig)
    unwound = []
    with pytest.raises(Interrupted) as e:
        with interruptible():
            try:
                os.kill(os.getpid(), sig)
                signal.sigtimedwait([], 0)  # a point where the handler runs
            finally:
                os.kill(os.getpid(), sig)  # a second signal while restoring must not cut the restoring short
                signal.sigtimedwait([], 0)
                unwound.append("restored")
    assert unwound == ["restored"]
    assert e.value.signum == sig and e.value.exit_code == 128 + sig
    assert signal.getsignal(sig) is before


def test_interrupted_is_not_an_exception_a_run_could_swallow():
    assert not issubclass(Interrupted, Exception)


def _one_run(**over):
    """A spec of one planned run (one grid point, one repetition)."""
    return spec(ccas=["cubic"], timeslices_ms=[1], cpu_shares_pct=[100], repetitions=1, **over)


def test_an_interrupted_run_is_neither_recorded_nor_counted(tmp_path):
    s = _one_run()
    target = s.plan()[0]

    def run(scenario, staging, *, run_id, attempt):
        (staging / "iperf.json").write_text("{}")
        raise Interrupted(signal.SIGTERM)

    with pytest.raises(Interrupted):
        campaign.run_campaign(s, tmp_path, run, options=CampaignOptions(progress=False))
    assert not record.is_complete(tmp_path, target.run_id)
    assert record.failed_attempts(tmp_path, target.run_id) == []
    assert list((tmp_path / record.TMP).iterdir()) == []  # nothing of the attempt stays behind


def test_a_failed_run_is_recorded_once_with_where_it_failed_and_what_it_measured(tmp_path):
    s = _one_run(max_attempts=1)
    target = s.plan()[0]

    def run(scenario, staging, *, run_id, attempt):
        meta = runmeta.RunMetadata()
        with meta.carried_by_errors():
            meta.sysctls = SenderSysctls({"net.ipv4.tcp_no_metrics_save": "1"})
            raise EOFError  # what paramiko raises when an SSH channel closes: no message of its own

    made = []
    st = campaign.run_campaign(s, tmp_path, run, options=CampaignOptions(progress=False), on_run=made.append)
    assert st.failed == 1 and len(made) == 1
    rec = made[0]
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("EOFError:  (at test_run_path.py:")
    assert rec["reason"].endswith("in run)")
    assert rec["metadata"]["sysctls"] == {"sender": {"net.ipv4.tcp_no_metrics_save": "1"}}
    assert rec["metadata"]["timing"]["run_wall_s"] >= 0
    stored = record.load_record(tmp_path / "failed" / f"{target.run_id}.a1")
    assert stored == rec


def test_fractional_durations_are_refused_because_iperf3_counts_whole_seconds():
    with pytest.raises(ValidationError, match="whole number of seconds") as e:
        Flow("cubic", IperfParams(duration_s=2.5))
    assert e.value.field == "flow.duration_s"
    assert Flow("cubic", IperfParams(duration_s=3.0)).params.duration_s == 3.0


def _readback(netem_packets, netem_drops, tbf_drops, ack_drops=0):
    """A read-back shaped as `tc -s -j qdisc show` gives it (the keys bbrlab uses)."""
    return {
        "eth1": [{"kind": "netem", "handle": "bb:", "root": True, "packets": 10, "bytes": 660, "drops": ack_drops}],
        "eth2": [{"kind": "netem", "handle": "bb:", "root": True, "packets": netem_packets, "bytes": 1,
                  "drops": netem_drops},
                 {"kind": "tbf", "handle": "bb1:", "parent": "bb:1", "packets": netem_packets, "bytes": 1,
                  "drops": tbf_drops}],
    }


def test_netem_loss_is_separated_from_the_bottleneck_drops():
    ports = ("eth1", "eth2")
    before = link.counters(_readback(1000, 5, 3), ports)
    after = link.counters(_readback(11_000, 5 + 150 + 40, 3 + 40), ports)
    delta = after.minus(before)
    seen = link.loss_observed(delta)
    assert seen.netem_dropped == 150 and seen.entered == 10_000 + 190
    lossy = Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1.5)
    assert checks.drops_as_configured(lossy, delta).configured_fraction == pytest.approx(0.015)


@pytest.mark.parametrize("loss_pct,netem_drops,tbf_drops,ack_drops,match", [
    (0, 12, 0, 0, "no loss configured"),
    (1, 400, 0, 0, "standard deviations"),     # 4 % seen for 1 % asked over 10,000 packets
    (10, 100, 0, 0, "standard deviations"),    # 1 % seen for 10 %: the loss did not apply
    (0, 0, 0, 3, "ACK port"),
])
def test_drops_that_the_configured_loss_cannot_explain_fail_the_run(loss_pct, netem_drops, tbf_drops, ack_drops,
                                                                    match):
    ports = ("eth1", "eth2")
    delta = link.counters(_readback(10_000, netem_drops + tbf_drops, tbf_drops, ack_drops), ports).minus(
        link.counters(_readback(0, 0, 0), ports))
    link_ = Link(rtt_ms=20, rate_mbit=50, loss_model="uniform" if loss_pct else "none", loss_pct=loss_pct)
    with pytest.raises(RunFailed, match=match):
        checks.drops_as_configured(link_, delta)


def test_bottleneck_drops_alone_are_fine():
    ports = ("eth1", "eth2")
    delta = link.counters(_readback(5000, 70, 70), ports).minus(link.counters(_readback(0, 0, 0), ports))
    assert checks.drops_as_configured(Link(rtt_ms=20, rate_mbit=50), delta).netem_dropped == 0


def test_a_forked_child_ends_on_sigterm_instead_of_running_our_code():
    """pyroute2 forks a helper to open a socket in a network namespace and ends it with SIGTERM: the child
    must die, not raise Interrupted and carry on with the parent's work inside the namespace."""
    with interruptible():
        pid = os.fork()
        if pid == 0:  # the child: wait for the signal; reaching the end of this block would be the bug
            try:
                signal.pause()
            except BaseException:  # noqa: BLE001
                os._exit(3)
            os._exit(4)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
