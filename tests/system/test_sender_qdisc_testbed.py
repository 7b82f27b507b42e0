"""The sender's qdisc as a dimension (issue #29): fq is set on the sender guest's experiment interface for
the run, read back, recorded, and the kernel's default is back afterwards, also when the run's body fails.

Runs on the suite's local testbed (Debian 6.1 sender guest under TCG); about 15 s of testbed time.
"""

from __future__ import annotations

import json

import pytest

from bbrlab.run import senderqdisc
from bbrlab.run.runner import run_once
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

pytestmark = [pytest.mark.system, pytest.mark.testbed]


def _root(testbed, interface: str) -> str | None:
    qdiscs = json.loads(testbed.sender.host.output(["tc", "-j", "qdisc", "show", "dev", interface], timeout=30))
    return next(q["kind"] for q in qdiscs if q.get("root"))


def test_a_cubic_run_with_fq_reads_fq_back_records_it_and_leaves_the_default(testbed, tmp_path):
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=20), Contention(10, 100), Flow("cubic", IperfParams(duration_s=4)),
                        sender_qdisc="fq")
    record = run_once(testbed, scenario, tmp_path)
    assert record["status"] == "ok", record["reason"]
    held = record["metadata"]["sender_qdisc"]
    assert held["asked"] == "fq" and held["root"] == "fq", held
    assert any(q["kind"] == "fq" and q.get("root") for q in held["qdiscs"])
    assert record["scenario"]["sender_qdisc"] == "fq" and "-fq-" in record["run_id"]
    assert record["metadata"]["cca"]["iperf_sender"] == "cubic"
    assert _root(testbed, held["interface"]) != "fq"  # the kernel's default is back
    assert held["default_qdisc"] != "fq"  # so the read-back fq was bbrlab's


def test_a_failing_body_still_restores_the_default(testbed):
    host, receiver = testbed.sender.host, testbed.receiver.experiment_ip
    with pytest.raises(RuntimeError, match="the run broke"):
        with senderqdisc.held(host, receiver, "fq") as state:
            assert _root(testbed, state.interface) == "fq"
            raise RuntimeError("the run broke")
    assert _root(testbed, state.interface) != "fq"
