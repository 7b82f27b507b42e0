"""Issue 17: one way to name the testbed, the command list, the KVM probe's expiry, stop_vm's bound."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bbrlab.campaign.options import CampaignOptions
from bbrlab.cli.main import COMMANDS, build_parser
from bbrlab.core import errors
from bbrlab.testbed import target

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

#: Commands that act on a testbed (``testbed up/down`` name the one they create or remove with --name).
ACTS_ON_A_TESTBED = {("testbed", "status"), ("testbed", "shell"), ("link", "set"), ("link", "show"),
                     ("link", "clear"), ("link", "validate"), ("contention", "set"), ("contention", "show"),
                     ("contention", "clear"), ("kernel", "load"), ("kernel", "status"), ("kernel", "set"), ("kernel", "ccas"),
                     ("campaign", "run"), ("calibrate", None)}


def _verbs(parser: argparse.ArgumentParser) -> dict[tuple[str, str | None], argparse.ArgumentParser]:
    """Every (command, verb) parser of the bbrlab command."""
    out = {}
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        verbs = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        if not verbs:
            out[(name, None)] = sub
        for verb, p in (verbs[0].choices.items() if verbs else []):
            out[(name, verb)] = p
    return out


def test_the_command_list_is_explicit_and_complete():
    from pathlib import Path

    import bbrlab.cli as pkg

    modules = {p.stem for p in Path(pkg.__path__[0]).glob("*.py")} - {"__init__", "main", "common"}
    assert set(COMMANDS) == modules
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == list(COMMANDS)


def test_handlers_follow_one_naming_convention():
    for (command, verb), p in _verbs(build_parser()).items():
        func = p.get_default("func")
        assert func.__module__ == f"bbrlab.cli.{command}"
        expected = f"run_{verb.replace('-', '_')}" if verb else "run"
        assert func.__name__ == expected, (command, verb, func.__name__)


def test_every_command_acting_on_a_testbed_takes_testbed_with_the_shared_default():
    verbs = _verbs(build_parser())
    for key in ACTS_ON_A_TESTBED:
        option = next((a for a in verbs[key]._actions if "--testbed" in a.option_strings), None)
        assert option is not None, key
        assert option.default is None, key  # resolved when the command runs (target.default_testbed)
    for verb in ("up", "down"):
        option = next(a for a in verbs[("testbed", verb)]._actions if "--name" in a.option_strings)
        assert "--testbed" in option.option_strings and option.default is None


def test_contention_needs_no_target_option_and_keeps_the_explicit_ones():
    parser = build_parser()
    args = parser.parse_args(["contention", "set", "--timeslice", "1ms", "--share", "25%"])
    assert args.testbed is None and args.pid is None and args.qmp is None and args.threads is None
    assert parser.parse_args(["contention", "show", "--qmp", "/x.qmp"]).qmp == "/x.qmp"
    with pytest.raises(SystemExit):
        parser.parse_args(["contention", "clear", "--pid", "1", "--testbed", "local"])


def test_default_testbed_is_the_environments_then_local(monkeypatch, tmp_path):
    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path))  # no testbed recorded here
    monkeypatch.setenv(target.ENV, "lab.yaml")
    assert target.default_testbed() == "lab.yaml" and target.resolve(None) == "lab.yaml"
    assert target.resolve("other") == "other"
    monkeypatch.delenv(target.ENV)
    assert target.running_local_testbeds() == []
    assert target.default_testbed() == "local"


def test_several_running_testbeds_and_none_called_local_are_refused(monkeypatch):
    monkeypatch.delenv(target.ENV, raising=False)
    monkeypatch.setattr(target, "running_local_testbeds", lambda: ["aa", "bb"])  # stands in for two VMs each
    with pytest.raises(errors.TestbedError, match=r"several local testbeds are up \(aa, bb\)"):
        target.default_testbed()
    monkeypatch.setattr(target, "running_local_testbeds", lambda: ["aa", "local"])
    assert target.default_testbed() == "local"
    monkeypatch.setattr(target, "running_local_testbeds", lambda: ["aa"])
    assert target.default_testbed() == "aa"


def test_a_name_too_long_for_a_path_is_a_name_not_a_crash():
    assert not target.is_testbed_file("x" * 5000)
    assert target.is_testbed_file("labs/lab.yaml") and target.is_testbed_file("lab.yml")


def test_holder_is_described_with_the_run_it_is_on():
    from bbrlab.testbed.holder import describe_holder

    text = describe_holder({"pids": [7], "pid": 7, "argv": ["bbrlab", "campaign", "run", "s.yaml"],
                            "activity": "campaign run", "campaign": "demo", "run_id": "cubic-x", "index": 12,
                            "planned": 48, "attempt": 1, "out": "runs/demo", "since": time.time()})
    assert text.startswith("pid 7 (bbrlab campaign run s.yaml): campaign run demo, run 12/48 cubic-x (attempt 1)")
    assert "into runs/demo" in text


# -- the KVM probe's cached answer expires --------------------------------------------------------------

def test_kvm_probe_results_expire_and_the_cache_keeps_its_fields(tmp_path, monkeypatch):
    from bbrlab.testbed.local import accel

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    failed = accel.AccelProbe(False, "QEMU exited during the KVM boot", "k", "q")
    accel._save(failed)
    path = accel._cache_file()
    # the cache is shared by every checkout on the machine: no field older code does not know
    assert set(json.loads(path.read_text())) == {"usable", "detail", "host_kernel", "qemu_version"}
    assert accel.cached_kvm_probe() == failed
    hours = 3600
    os.utime(path, (time.time() - 25 * hours,) * 2)
    assert accel.cached_kvm_probe() is None  # a failure is probed again after a day
    usable = accel.AccelProbe(True, "guest init ready", "k", "q")
    accel._save(usable)
    os.utime(path, (time.time() - 25 * hours,) * 2)
    assert accel.cached_kvm_probe() == usable
    os.utime(path, (time.time() - 8 * 24 * hours,) * 2)
    assert accel.cached_kvm_probe() is None
    path.write_text("{")
    assert accel.cached_kvm_probe() is None


def test_the_kvm_probe_ends_early_only_while_the_console_is_silent(tmp_path, monkeypatch):
    """A console still empty after SILENT_DEADLINE_S ends the probe (the guest's kernel never started); a console
    with any line on it is given the whole deadline to reach the init's ready line. (The QEMU is a stand-in here:
    ``bbrlab doctor --probe-kvm`` in the README test boots the real one.)"""
    from bbrlab.testbed.local import accel
    from bbrlab.testbed.local.qemu import VmSpec

    monkeypatch.setattr(accel, "is_our_qemu", lambda pid, name: True)
    monkeypatch.setattr(accel, "SILENT_DEADLINE_S", 0.3)
    spec = VmSpec(vm_name="probe", hostname="probe", folder=tmp_path, accelerator="kvm", quiet_console=False)
    spec.console_log.write_text("")
    t0 = time.monotonic()
    silent = accel._watch(spec, 1, t0, 5.0, "k", "q")
    assert not silent.usable and "console stayed empty" in silent.detail
    assert time.monotonic() - t0 < 5.0
    spec.console_log.write_text("Linux version 6.1.0\n")
    talking = accel._watch(spec, 1, time.monotonic(), 0.8, "k", "q")
    assert not talking.usable and "not ready within" in talking.detail and "Linux version" in talking.detail
    spec.console_log.write_text(f"Linux version 6.1.0\n{accel.READY_LINE}\n")
    assert accel._watch(spec, 1, time.monotonic(), 0.8, "k", "q").usable


# -- stop_vm gives up when SIGKILL does not end QEMU -------------------------------------------------------

FAKE_QEMU = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(120)"


@pytest.mark.mock_only
def test_stop_vm_gives_up_when_sigkill_does_not_end_qemu_mock_only(monkeypatch):
    """A process that SIGKILL cannot end (stuck in the kernel) cannot be made on purpose here: a real
    process named like QEMU ignores SIGTERM, and os.kill drops the SIGKILL stop_vm sends it."""
    from bbrlab.testbed.local import qemu

    name = f"bbrlab-fake-{os.getpid()}"
    proc = subprocess.Popen(["bash", "-c", f'exec -a qemu-system-fake {sys.executable} -c "{FAKE_QEMU}" '
                                           f"-name {name},debug-threads=on"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"1\n"  # SIGTERM is ignored from here on
        assert qemu.is_our_qemu(proc.pid, name)
        real_kill = os.kill
        monkeypatch.setattr(os, "kill", lambda pid, sig: None if sig == signal.SIGKILL else real_kill(pid, sig))
        monkeypatch.setattr(qemu, "KILL_WAIT_S", 1.0, raising=False)  # (older code had no such bound)
        outcome: list = []

        def stop():
            try:
                outcome.append(qemu.stop_vm(proc.pid, name, timeout_s=0.5))
            except errors.TestbedError as e:
                outcome.append(e)

        worker = threading.Thread(target=stop, daemon=True)
        worker.start()
        worker.join(15)
        assert not worker.is_alive(), "stop_vm still waiting after SIGKILL"
        assert isinstance(outcome[0], errors.TestbedError) and "after SIGKILL" in str(outcome[0])
    finally:
        monkeypatch.undo()
        proc.kill()
        proc.wait()


def test_the_suites_testbeds_keep_their_state_out_of_the_users_directory():
    from pathlib import Path

    from bbrlab.testbed.local.state import state_root

    root = state_root()
    home_state = Path(os.path.expanduser("~/.local/state"))
    assert home_state not in root.parents and os.environ.get("BBRLAB_STATE_DIR")
    assert (os.stat(root.parent).st_mode & 0o077) == 0  # keys live there: private


def test_a_campaign_announces_each_run_on_the_testbeds_lock(tmp_path, monkeypatch):
    from bbrlab.campaign import loop as campaign
    from bbrlab.campaign.spec import CampaignSpec
    from bbrlab.testbed import lock

    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(tmp_path / "locks"))
    spec = CampaignSpec.from_dict({"name": "ann", "ccas": ["cubic"], "timeslices_ms": [1], "cpu_shares_pct": [25, 100],
                                   "rtts_ms": [20], "rates_mbit": [100], "repetitions": 2, "duration_s": 5})
    seen = []

    def run(scenario, staging, *, run_id, attempt):
        info = lock.holder("unit")
        seen.append((info["activity"], info["campaign"], info["run_id"], info["index"], info["planned"]))
        return {}

    out = tmp_path / "out"
    with lock.testbed_lock("unit"):
        campaign.run_campaign(spec, out, campaign.announcing(run, "unit", spec, out), options=QUIET)
    order = [s.run_id for s in spec.plan()]
    assert seen == [("campaign run", "ann", rid, i, 4) for i, rid in enumerate(order, 1)]
