"""Private directories of runs killed outright, swept for real on this machine: made by a child process through
``Host.private_dir`` (stamped with its owner in the same command), the child killed with SIGKILL, the sweep run.
What is not ours, or whose owner still runs, stays."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bbrlab.core import leftdirs
from bbrlab.core.hosts import LocalHost
from tests.polling import wait_for

pytestmark = pytest.mark.system

PURPOSE = "lefttest"
_CHILD = """
import subprocess, sys, time
from bbrlab.core.hosts import LocalHost
from tests.polling import wait_for
with LocalHost().private_dir(sys.argv[1]) as d:
    open(d + "/log", "w").close()
    worker = subprocess.Popen(["tail", "-f", d + "/log"], start_new_session=True)
    print(d, worker.pid, flush=True)
    time.sleep(600)
"""


def _ours() -> set[str]:
    return {str(p) for p in Path(tempfile.gettempdir()).glob(f"bbrlab-{PURPOSE}.*")}


@pytest.fixture
def killed_child_dir():
    """The private directory of a child killed with SIGKILL, and the pid of a process still working in it."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, PURPOSE], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    directory, worker = child.stdout.readline().split()
    child.kill()
    child.wait(timeout=30)
    yield directory, int(worker)
    subprocess.run(["kill", "-KILL", worker], check=False)
    subprocess.run(["rm", "-rf", "--", directory], check=False)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except FileNotFoundError:
        return False


def test_a_killed_owners_directory_is_removed_with_what_works_in_it(killed_child_dir):
    directory, worker = killed_child_dir
    assert Path(directory, "owner").read_text().startswith("bbrlab-owner ")  # stamped when it was made
    assert _running(worker)
    assert leftdirs.sweep(LocalHost(), PURPOSE) == [directory]
    assert not os.path.exists(directory)
    wait_for(lambda: not _running(worker), "the process working in it to be killed", 10.0)


def test_a_living_owners_directory_and_what_is_not_ours_stay(killed_child_dir, tmp_path):
    directory, _ = killed_child_dir
    host = LocalHost()
    with host.private_dir(PURPOSE) as mine:  # its owner (this process) runs
        unstamped = tempfile.mkdtemp(prefix=f"bbrlab-{PURPOSE}.", dir=tempfile.gettempdir())
        foreign = tempfile.mkdtemp(prefix=f"bbrlab-{PURPOSE}.", dir=tempfile.gettempdir())
        Path(foreign, "owner").write_text(Path(directory, "owner").read_text())  # a gone owner's stamp, copied
        nobody = pwd.getpwnam("nobody")
        os.chown(foreign, nobody.pw_uid, nobody.pw_gid)  # but another user's directory
        link = Path(tempfile.gettempdir(), f"bbrlab-{PURPOSE}.Link1234")
        link.symlink_to(directory)
        try:
            assert leftdirs.sweep(host, PURPOSE) == [directory]  # only the killed child's own
            assert {mine, unstamped, foreign, str(link)} <= _ours() and os.path.exists(mine)
        finally:
            link.unlink()
            subprocess.run(["rm", "-rf", "--", unstamped, foreign], check=False)


def test_purposes_are_checked_before_anything_runs():
    for bad in ("", "Iperf3", "a/b", "x" * 17, "3d"):
        with pytest.raises(ValueError, match="short lowercase"):
            leftdirs.sweep(LocalHost(), bad)
    with pytest.raises(ValueError):
        leftdirs.sweep(LocalHost())
