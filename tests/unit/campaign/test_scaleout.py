"""Campaigns over several testbeds, the parts that need none: the command line (``campaign run --testbed A
--testbed B``, ``--scheduler``, ``bbrlab worker``) and its refusals before anything changes, the calibration
of each testbed, and stopping a worker's run in flight (real threads, the mechanism a Dask worker uses).

The real thing, two local testbeds through the command: tests/system/test_campaign_two_testbeds.py.
"""

from __future__ import annotations

import pickle
import socket
import threading
import time

import pytest
import yaml

from bbrlab.campaign import preflight, scaleout
from bbrlab.campaign.worker import CampaignContext, StopRequested, TestbedPlugin
from bbrlab.cli.main import build_parser, main
from bbrlab.core.errors import ValidationError

SPEC = {"name": "two", "ccas": ["cubic", "bbr"], "timeslices_ms": [10], "cpu_shares_pct": [70, 100],
        "rtts_ms": [20], "rates_mbit": [50], "repetitions": 3, "duration_s": 2}


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


@pytest.fixture
def no_testbeds(tmp_path, monkeypatch):
    """A state directory with no testbed in it, and no lock of anyone else's."""
    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("BBRLAB_TESTBED", raising=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- parsing ----------------------------------------------------------------------------------------------

def test_testbed_and_calibration_repeat_and_default_to_nothing():
    parser = build_parser()
    args = parser.parse_args(["campaign", "run", "s.yaml", "--out", "d", "--testbed", "a", "--testbed", "lab.yaml",
                              "--calibration", "ca", "--calibration", "cb"])
    assert args.testbed == ["a", "lab.yaml"] and [str(c) for c in args.calibration] == ["ca", "cb"]
    args = parser.parse_args(["campaign", "run", "s.yaml", "--out", "d"])
    assert args.testbed is None and args.calibration is None and args.scheduler is None and not args.dashboard


def test_worker_needs_a_testbed_and_a_scheduler(capsys):
    parser = build_parser()
    args = parser.parse_args(["worker", "--testbed", "lab.yaml", "--scheduler", "tcp://h:8786"])
    assert (args.testbed, args.scheduler, args.name) == ("lab.yaml", "tcp://h:8786", None)
    for argv in (["worker", "--testbed", "x"], ["worker", "--scheduler", "tcp://h:1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    assert "required" in capsys.readouterr().err


@pytest.mark.parametrize("text, expected", [("tcp://10.0.0.5:8786", "tcp://10.0.0.5:8786"),
                                            ("sched.lab:8786", "tls://sched.lab:8786"),
                                            ("tls://[fe80::1]:9000", "tls://[fe80::1]:9000")])
def test_scheduler_addresses_are_normalised(text, expected):
    assert scaleout.scheduler_address(text) == expected


@pytest.mark.parametrize("text", ["", "tcp://host", "http://h:8786", "tcp://h:0", "tcp://h:70000", "tcp://a b:1",
                                  "tcp://h:1/x"])
def test_a_bad_scheduler_address_names_the_option(text):
    with pytest.raises(ValidationError) as e:
        scaleout.scheduler_address(text)
    assert e.value.field == "--scheduler" and "tls://HOST:PORT" in str(e.value)


# -- refusals before anything changes ----------------------------------------------------------------------

@pytest.mark.parametrize("options, field", [
    (["--scheduler", "tcp://h:8786", "--testbed", "a"], "--testbed"),
    (["--dashboard"], "--dashboard"),
    (["--testbed", "a", "--dashboard"], "--dashboard"),
    (["--calibration", "x", "--calibration", "y"], "--calibration"),
    (["--testbed", "a", "--calibration", "x", "--calibration", "y"], "--calibration"),
    (["--testbed", "a", "--testbed", "a"], "--testbed"),
    (["--scheduler", "tcp://nowhere"], "--scheduler"),
])
def test_options_that_do_not_go_together_are_refused_naming_one(options, field, spec_file, tmp_path, capsys,
                                                                 no_testbeds):
    out = tmp_path / "out"
    assert main(["campaign", "run", str(spec_file), "--out", str(out), *options]) == 1
    err = capsys.readouterr().err
    assert f"{field} = " in err, err
    assert not out.exists()


def test_a_bad_spec_is_refused_before_any_testbed_is_looked_at(tmp_path, capsys, no_testbeds):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SPEC, "cpu_shares_pct": [70, 0]}))
    assert main(["campaign", "run", str(bad), "--out", str(tmp_path / "o"), "--testbed", "nope1",
                 "--testbed", "nope2"]) == 1
    assert "cpu_shares_pct[1]" in capsys.readouterr().err


def test_a_testbed_that_is_not_up_is_refused_naming_it(spec_file, tmp_path, capsys, no_testbeds):
    out = tmp_path / "out"
    assert main(["campaign", "run", str(spec_file), "--out", str(out), "--testbed", "tbx", "--testbed", "tby"]) == 1
    err = capsys.readouterr().err
    assert "--testbed = 'tbx'" in err and "not up" in err and "bbrlab testbed up --name tbx" in err
    assert not out.exists()


def test_one_testbed_file_under_two_spellings_is_one_testbed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labs").mkdir()
    (tmp_path / "labs" / "a.yaml").write_text("name: a\n")
    with pytest.raises(ValidationError, match="also given as 'labs/a.yaml'") as e:
        scaleout.distinct_refs(["labs/a.yaml", "local", f"{tmp_path}/labs/../labs/a.yaml"])
    assert e.value.field == "--testbed"
    assert scaleout.distinct_refs(["a", "b", "labs/a.yaml"]) == ["a", "b", "labs/a.yaml"]


def test_a_scheduler_nobody_listens_on_is_refused(spec_file, tmp_path, capsys, no_testbeds):
    address = f"tcp://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    assert main(["campaign", "run", str(spec_file), "--out", str(tmp_path / "o"), "--scheduler", address,
                 "--insecure"]) == 1
    err = capsys.readouterr().err
    assert f"--scheduler = '{address}'" in err and "nothing answered" in err
    assert time.monotonic() - t0 < scaleout.CONNECT_TIMEOUT_S + 10
    assert not (tmp_path / "o").exists()


def test_worker_refuses_a_testbed_that_is_not_up_and_a_bad_scheduler(capsys, no_testbeds):
    assert main(["worker", "--testbed", "tbx", "--scheduler", "tcp://127.0.0.1:8786", "--insecure"]) == 1
    assert "--testbed = 'tbx'" in capsys.readouterr().err
    assert main(["worker", "--testbed", "tbx", "--scheduler", "127.0.0.1"]) == 1
    assert "--scheduler = '127.0.0.1'" in capsys.readouterr().err


def test_more_local_testbeds_than_cpus_are_refused_naming_the_option():
    from types import SimpleNamespace

    from bbrlab.testbed import isolation

    if isolation.flavour() is None:
        pytest.skip("no cpuset cgroup here: every plan is refused (test_testbed_state covers that message)")
    n = len(isolation.online_cpus()) + 1
    testbeds = {f"t{i}": SimpleNamespace(name=f"t{i}", kind="local") for i in range(n)}  # names only
    with pytest.raises(ValidationError, match="CPUs of their own") as e:
        scaleout.partitions_for(testbeds)
    assert e.value.field == "--testbed" and "root domain" in str(e.value)
    one_local = {"a": SimpleNamespace(name="a", kind="local"), "lab.yaml": SimpleNamespace(name="lab", kind="lab")}
    assert scaleout.partitions_for(one_local) == {}  # one local testbed has nothing to compete with


# -- the calibration of each testbed ----------------------------------------------------------------------

IDENTITY = {"kind": "local", "accelerator": "tcg", "sender_kernel": "6.1.0-56-amd64", "sender_vcpus": 1,
            "hypervisor": "QEMU 7.2"}


def _check(name: str, cpus=None) -> preflight.TestbedCheck:
    return preflight.TestbedCheck(name, "local", "h", {"name": name, **IDENTITY}, cpus)


def _calibration(path, name: str, *, drop: int = 0):
    """A calibration of testbed ``name`` with a ceiling for every point of SPEC (less ``drop`` of them)."""
    from bbrlab.campaign.spec import CampaignSpec
    from bbrlab.run.ceiling import Calibration, CeilingPoint, PointKey

    keys = sorted({PointKey.of_scenario(s) for s in CampaignSpec.from_dict(SPEC).plan()}, key=lambda k: k.text)
    points = [CeilingPoint(key=k.text, timeslice_ms=k.timeslice_ms, cpu_share_pct=k.cpu_share_pct, rtt_ms=k.rtt_ms,
                           ceiling_mbit=90.0, streams=1, limit="sender-cpu") for k in keys[drop:]]
    cal = Calibration(created_at="2026-11-22T06:00:00Z", testbed={"name": name, **IDENTITY}, configuration={},
                      points=points)
    cal.save(path)
    return path


def _plan():
    from bbrlab.campaign.spec import CampaignSpec

    return CampaignSpec.from_dict(SPEC).plan()


def test_one_calibration_per_testbed_is_matched_by_the_testbed_it_was_made_on(tmp_path):
    out = tmp_path / "camp"
    paths = [_calibration(tmp_path / "cb" / "calibration.json", "b"), _calibration(tmp_path / "ca.json", "a")]
    got = preflight.calibrations_for([_check("a"), _check("b")], out, _plan(), paths)
    assert sorted(got) == ["a", "b"]
    assert got["a"][0].path == tmp_path / "ca.json" and got["a"][1] == "../ca.json"
    assert got["b"][1] == "../cb/calibration.json"


def test_no_calibration_means_none_for_every_testbed(tmp_path):
    assert preflight.calibrations_for([_check("a"), _check("b")], tmp_path / "camp", _plan(), None) == {}


@pytest.mark.parametrize("case, message", [
    ("half", "one calibration per testbed, or none; b has none"),
    ("unknown", "it was made on 'c'"),
    ("twice", "'a' already has"),
    ("stale", "a calibration of the testbed as it is now"),
    ("missing_point", "a ceiling for every point of the plan"),
    ("partitioned", "runs in a partition of 1 CPU"),
])
def test_a_calibration_that_does_not_fit_is_refused_naming_the_option(case, message, tmp_path):
    checks = [_check("a", (0,) if case == "partitioned" else None), _check("b")]
    a = _calibration(tmp_path / "a.json", "a", drop=1 if case == "missing_point" else 0)
    b = _calibration(tmp_path / "b.json", "b")
    paths = {"half": [a], "unknown": [a, b, _calibration(tmp_path / "c.json", "c")], "twice": [a, a, b],
             "stale": [a, b], "missing_point": [a, b], "partitioned": [a, b]}[case]
    if case == "stale":
        checks[0] = preflight.TestbedCheck("a", "local", "h", {"name": "a", **IDENTITY, "sender_kernel": "6.12"})
    with pytest.raises(ValidationError, match=message) as e:
        preflight.calibrations_for(checks, tmp_path / "camp", _plan(), paths)
    assert e.value.field == "--calibration"


def test_the_campaign_directorys_calibration_is_the_default_and_must_fit_every_testbed(tmp_path):
    out = tmp_path / "camp"
    _calibration(out / "calibration.json", "a")
    with pytest.raises(ValidationError, match="b has none"):
        preflight.calibrations_for([_check("a"), _check("b")], out, _plan(), None)
    assert preflight.calibrations_for([_check("a")], out, _plan(), None)["a"][1] == "calibration.json"


# -- stopping a run in flight ------------------------------------------------------------------------------

def _plugin() -> TestbedPlugin:
    plugin = pickle.loads(pickle.dumps(TestbedPlugin("unused", run_function=print)))  # as a worker receives it
    plugin.setup(worker=None)
    return plugin


def _run_in_thread(plugin, context, log: list):
    """A run in a thread of its own, as a Dask worker's task thread runs it: busy in Python code until stopped."""
    started = threading.Event()

    def body():
        try:
            with plugin.running(context):
                try:
                    started.set()
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        time.sleep(0.01)
                    log.append("ran to the end")
                finally:
                    log.append("restored")
        except StopRequested:
            log.append("stopped")

    thread = threading.Thread(target=body)
    thread.start()
    assert started.wait(10)
    return thread


def test_a_run_in_flight_is_stopped_restores_and_its_campaign_takes_no_more_runs():
    plugin, log = _plugin(), []
    ours, theirs = CampaignContext("t1", "c", "/o", 12), CampaignContext("t2", "c2", "/o2", 12)
    thread = _run_in_thread(plugin, ours, log)
    t0 = time.monotonic()
    assert plugin.stop("t2") is False and thread.is_alive()  # another campaign's stop leaves this run alone
    assert plugin.stop("t1") is True
    assert time.monotonic() - t0 < 5
    thread.join(5)
    assert log == ["restored", "stopped"]
    with pytest.raises(StopRequested):  # a queued run of the stopped campaign is refused at once
        with plugin.running(ours):
            pass
    with plugin.running(CampaignContext("t3", "c3", "/o3", 12)):  # other campaigns still run here
        pass
    with pytest.raises(StopRequested):  # t2 was stopped too (its queued runs), though nothing of it ran
        with plugin.running(theirs):
            pass
    assert plugin.stop(None) is False  # nothing in flight: nothing to stop


def test_finish_reports_what_it_did_and_nothing_lands_after_a_run_ended():
    plugin, log = _plugin(), []
    context = CampaignContext("t1", "c", "/o", 12)
    with plugin.running(context):
        pass
    time.sleep(0.05)  # a stop sent now must not reach this thread's later code
    assert plugin.finish("t1") == {"testbed": "unused", "interrupted": False, "recovered": None,
                                   "link_cleared": False}
    thread = _run_in_thread(plugin, CampaignContext("t3", "c", "/o", 1), log)
    assert plugin.finish("t3")["interrupted"] is True
    thread.join(5)
    assert log == ["restored", "stopped"]


def test_validation_errors_cross_process_boundaries_intact():
    e = ValidationError("cpu_shares_pct[1] with timeslices_ms[0]", (70, 10), "at most 95 %", "testbed a")
    again = pickle.loads(pickle.dumps(e))
    assert (again.field, again.value, again.allowed, again.hint, str(again)) == (e.field, e.value, e.allowed,
                                                                                  e.hint, str(e))
