"""Issue 24, item 11: bounded error messages, YAML alias bombs, campaign files never written through links,
a campaign that waits for the testbed's lock before it reads the testbed, a test suite apart from ``local``."""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbrlab.campaign.directory import prepare
from bbrlab.campaign.loop import directory_lock
from bbrlab.campaign.spec import spec_from_yaml
from bbrlab.core.errors import ELISION, MAX_VALUE_CHARS, BbrlabError, ValidationError
from bbrlab.core.yamlfile import MAX_EXPANDED_NODES, load_text
from bbrlab.run import record as rec
from bbrlab.testbed import lock

ROOT = Path(__file__).resolve().parents[3]

SPEC = """\
name: hardening
rtts_ms: [10]
rates_mbit: [10]
buffers_bdp: [1]
ccas: [cubic]
timeslices_ms: [10]
cpu_shares_pct: [100]
duration_s: 2
repetitions: 1
"""


def alias_bomb(levels: int) -> str:
    """A spec whose ``name`` is nine aliases of nine aliases ... of nine strings (``levels`` deep)."""
    text = "x-anchors:\n - &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n"
    for i in range(1, levels):
        text += f" - &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n"
    return text + f"name: *a{levels - 1}\n"


# -- (d) error messages truncate values --------------------------------------------------------------------
@pytest.mark.parametrize("levels", [7, 8])
def test_a_spec_of_a_few_hundred_bytes_with_nested_aliases_gives_a_short_error(levels):
    text = alias_bomb(levels)
    assert len(text.encode()) < 430  # on main: a 39 MB (7 levels) or 351 MB (8 levels) message
    t0 = time.monotonic()
    with pytest.raises(ValidationError) as e:
        spec_from_yaml(text)
    assert len(str(e.value)) < 1000
    assert time.monotonic() - t0 < 5


def test_a_huge_value_is_cut_in_the_message_and_kept_whole_on_the_error():
    value = ["x" * 1000] * 1000
    e = ValidationError("link.rtt_ms", value, "a number from 0 to 10000")
    msg = str(e)
    assert msg.startswith("link.rtt_ms = ") and msg.endswith("is not allowed: a number from 0 to 10000")
    assert len(msg) < MAX_VALUE_CHARS + 200 and ELISION in msg
    assert e.value is value  # what the program may inspect is untouched
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == msg


def test_a_deeply_nested_value_is_cut_without_building_its_repr():
    nested: list = ["lol"] * 9
    for _ in range(6):  # 9**7 strings written out: a 43 MB repr on main (deeper would only cost main more memory)
        nested = [nested] * 9
    t0 = time.monotonic()
    msg = str(ValidationError("name", nested, "a string"))
    assert len(msg) < 1000 and time.monotonic() - t0 < 0.5


def test_yaml_alias_expansion_is_bounded_and_plain_aliases_still_work():
    ok = load_text("base: &b {rtt_ms: 10}\nother: *b\nlist: [*b, *b]\n", "small.yaml")
    assert ok["other"] == {"rtt_ms": 10} and ok["list"] == [{"rtt_ms": 10}] * 2
    with pytest.raises(ValidationError) as e:
        load_text(alias_bomb(6), "bomb.yaml")  # 9**6 = 531441 strings
    assert e.value.field == "spec" and str(MAX_EXPANDED_NODES) in e.value.allowed
    assert load_text("", "empty.yaml") is None


# -- (e) campaign lock and temporary files: O_NOFOLLOW, private modes ----------------------------------------
def test_the_campaign_lock_is_private_and_a_planted_link_is_refused(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    with directory_lock(out):
        assert stat.S_IMODE(os.lstat(out / ".lock").st_mode) == 0o600  # main: 0644
    (out / ".lock").unlink()
    victim = tmp_path / "victim"
    os.symlink(victim, out / ".lock")
    with pytest.raises(BbrlabError, match="symbolic link"):
        with directory_lock(out):
            pass
    assert not victim.exists()  # main: followed the link and created it


def test_temporary_files_are_never_written_through_a_planted_link(tmp_path):
    spec = spec_from_yaml(SPEC)
    out = tmp_path / "c"
    prepare(spec, out)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    # resuming, spec.yaml gone: it is written again, through a temporary file
    (out / "spec.yaml").unlink()
    os.symlink(victim, out / ".spec.yaml.tmp")  # main's fixed name
    os.symlink(victim, rec.temporary_name(out / "spec.yaml"))
    prepare(spec, out)
    assert victim.read_text() == "precious\n"  # main: overwritten with the spec
    assert (out / "spec.yaml").is_file() and not (out / "spec.yaml").is_symlink()
    os.symlink(victim, rec.temporary_name(out / "calibration.json"))
    rec.write_json_atomic(out / "calibration.json", {"a": 1})
    assert victim.read_text() == "precious\n"  # main: overwritten with the JSON
    assert not rec.temporary_name(out / "calibration.json").exists()
    assert stat.S_IMODE(os.stat(out / "calibration.json").st_mode) == 0o666 & ~rec._umask()  # the usual mode


def test_runs_are_staged_in_a_private_tmp_and_a_linked_tmp_is_refused(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    staging = rec.staging_dir(out, "run-1")
    assert stat.S_IMODE(os.lstat(out / rec.TMP).st_mode) == 0o700  # main: 0755 (umask)
    rec.write_file(staging / "a.json", "{}")
    os.symlink(tmp_path / "victim", staging / "b.json")
    with pytest.raises(OSError):
        rec.write_file(staging / "b.json", "{}")
    assert not (tmp_path / "victim").exists()
    other = tmp_path / "d"
    other.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, other / rec.TMP)
    with pytest.raises(BbrlabError, match="symbolic link"):
        rec.staging_dir(other, "run-1")
    assert list(elsewhere.iterdir()) == []  # main: the run was staged in the link's target


# -- (a) lock holders ------------------------------------------------------------------------------------
def test_proc_locks_device_numbers_are_read_as_hex(tmp_path):
    path = tmp_path / "x.lock"
    with lock.hold(path):
        st = os.stat(path)
        line = next(ln for ln in Path("/proc/locks").read_text().splitlines()
                    if ln.split()[4] == str(os.getpid()) and ln.split()[5].endswith(f":{st.st_ino}"))
        assert lock._lock_file_id(line.split()[5]) == (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        assert os.getpid() in lock.lock_holders(path)


# -- (c) a campaign takes the testbed lock before it reads the testbed ----------------------------------------
def test_a_campaign_waits_for_the_testbed_lock_before_it_reads_the_testbed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BBRLAB_LOCK_DIR": str(tmp_path / "locks"),
           "BBRLAB_STATE_DIR": str(tmp_path / "state"), "BBRLAB_TESTBED": "lockfirst"}
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bbrlab.testbed import lock\n"
         "with lock.testbed_lock('lockfirst'):\n    print('held', flush=True); sys.stdin.read()"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = subprocess.Popen([sys.executable, "-c", "import sys; from bbrlab.cli.main import main; sys.exit(main())", "campaign", "run", str(spec), "--out",
                                 str(tmp_path / "out"), "--no-progress"], env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Ready when it says it waits (read line by line, never a fixed sleep: a loaded machine starts it late).
        said = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("waiting" in line for line in said):
            line = proc.stderr.readline()
            if not line:
                break
            said.append(line)
        assert any("in use by" in line and "waiting" in line for line in said), \
            f"the campaign did not wait for the testbed's lock: {''.join(said)}"
        assert proc.poll() is None, "the campaign ended while the lock was still held"
    finally:
        holder.stdin.close()
        holder.wait(10)
    _, err = proc.communicate(timeout=120)
    assert "not up" in err  # read once it held the lock: the testbed was never brought up
    assert proc.returncode != 0


# -- (g) the suite's testbed is not a user's `local` ------------------------------------------------------------
def test_the_test_suite_drives_a_testbed_of_its_own_name(monkeypatch):
    from bbrlab.testbed.local import lifecycle, plumbing
    from bbrlab.testbed.local.state import check_name
    from tests import conftest

    assert check_name(conftest.TEST_TESTBED) != "local"
    monkeypatch.delenv("BBRLAB_TESTBED", raising=False)
    assert conftest.suite_testbed() == conftest.TEST_TESTBED
    # everything named machine-wide after the testbed differs from a user's `local`
    name = conftest.suite_testbed()
    assert lock.lock_path(name) != lock.lock_path("local")
    assert {plumbing.link_netns(name), plumbing.receiver_netns(name)}.isdisjoint(
        {plumbing.link_netns("local"), plumbing.receiver_netns("local")})
    assert {lifecycle.vm_name(name, r) for r in ("sender", "emulator")}.isdisjoint(
        {lifecycle.vm_name("local", r) for r in ("sender", "emulator")})
    monkeypatch.setenv("BBRLAB_TESTBED", "lab.yaml")  # an override still wins
    assert conftest.suite_testbed() == "lab.yaml"


def test_commands_the_tests_start_default_to_the_suites_testbed():
    from bbrlab.testbed import target

    assert os.environ.get("BBRLAB_TESTBED") and os.environ["BBRLAB_TESTBED"] != "local"
    assert target.default_testbed() == os.environ["BBRLAB_TESTBED"]


# -- item 4: a host's lock, held by a long-lived command (here on this machine; over SSH in tests/system) -------
HOLDER = """
import sys
from bbrlab.core.hosts import LocalHost
from bbrlab.testbed import hostlock
with hostlock.hold(LocalHost(), testbed=sys.argv[2], activity="campaign run", directory=sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def _holder(directory: Path, testbed: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), testbed], cwd=ROOT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_hosts_lock_names_its_holder_and_goes_with_it(tmp_path):
    from bbrlab.core.hosts import LocalHost
    from bbrlab.testbed import hostlock

    d = tmp_path / "hostlock"
    first = _holder(d, "lab-a")
    try:
        held = hostlock.holder(LocalHost(), str(d))
        assert held["pid"] == first.pid and held["testbed"] == "lab-a" and held["token"] != hostlock.SESSION_TOKEN
        with pytest.raises(hostlock.HostBusy) as e:
            with hostlock.hold(LocalHost(), testbed="lab-b", timeout_s=0, directory=str(d)):
                pass
        assert f"pid {first.pid} on " in str(e.value) and "testbed lab-a: campaign run" in str(e.value)
    finally:
        first.kill()  # SIGKILL: no clean-up of its own; the lock goes with the process
        first.wait()
    t0 = time.monotonic()
    with hostlock.hold(LocalHost(), testbed="lab-b", timeout_s=20, directory=str(d)) as me:
        assert time.monotonic() - t0 < 5
        assert hostlock.holder(LocalHost(), str(d))["token"] == me["token"] == hostlock.SESSION_TOKEN
        with hostlock.hold(LocalHost(), testbed="lab-b", timeout_s=0, directory=str(d)):  # re-entrant
            pass
    assert hostlock.holder(LocalHost(), str(d)) is None


def test_a_driver_waits_for_a_held_host_and_says_for_whom(tmp_path):
    import io

    from bbrlab.core.hosts import LocalHost
    from bbrlab.testbed import hostlock

    d = tmp_path / "hostlock"
    first = _holder(d, "lab-a")
    note = io.StringIO()
    try:
        import threading

        threading.Timer(3.0, first.stdin.close).start()  # the first driver ends its session in 3 s
        t0 = time.monotonic()
        with hostlock.hold(LocalHost(), testbed="lab-b", timeout_s=60, note=note, directory=str(d)):
            waited = time.monotonic() - t0
    finally:
        first.wait(10)
    assert 2.5 < waited < 10
    assert f"in use by another bbrlab: pid {first.pid}" in note.getvalue() and "waiting" in note.getvalue()


def test_a_planted_link_or_a_shared_directory_is_refused_on_the_host(tmp_path):
    from bbrlab.core.errors import TestbedError
    from bbrlab.core.hosts import LocalHost
    from bbrlab.testbed import hostlock

    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(TestbedError, match="not a directory"):
        with hostlock.hold(LocalHost(), testbed="x", directory=str(tmp_path / "link")):
            pass
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(TestbedError, match="writable by others"):
        with hostlock.hold(LocalHost(), testbed="x", directory=str(shared)):
            pass
