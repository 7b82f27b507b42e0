"""A campaign's key directory left by a driver killed outright (SIGKILL) is removed by the next campaign on
this machine; live campaigns' and other users' directories are never touched. Real processes and real
directories in the real temporary folder; nothing is mocked."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bbrlab.campaign import tls as tlsconf
from bbrlab.core import owners

# A child makes its campaign key directory as a campaign does, prints it, and waits to be killed.
MAKE_DIR = """
from bbrlab.campaign import tls
print(tls.campaign_dir(), flush=True)
import time; time.sleep(600)
"""


def _driver() -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", MAKE_DIR], stdout=subprocess.PIPE, text=True)
    path = Path(proc.stdout.readline().strip())
    assert path.is_dir() and path.name.startswith(tlsconf.CAMPAIGN_DIR_PREFIX)
    (path / "ca.pem").write_text("x")
    return proc, path


def test_a_killed_campaigns_key_directory_is_swept_and_a_live_ones_kept():
    killed, killed_dir = _driver()
    live, live_dir = _driver()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        assert killed_dir.is_dir()  # SIGKILL leaves it: nothing in the dead process could remove it
        mine = tlsconf.campaign_dir()  # what the next campaign does first
        try:
            assert not killed_dir.exists()
            assert live_dir.is_dir() and (live_dir / "ca.pem").exists()
            assert oct(mine.stat().st_mode & 0o777) == "0o700"
        finally:
            shutil.rmtree(mine)
    finally:
        live.kill()
        live.wait(timeout=10)
        tlsconf.sweep_campaign_dirs()
    assert not live_dir.exists()


def test_another_users_directory_is_never_touched():
    proc, path = _driver()
    proc.kill()
    proc.wait(timeout=10)
    os.chown(path, 65534, 65534)  # as if user nobody's campaign had died
    try:
        assert path not in tlsconf.sweep_campaign_dirs()
        assert path.is_dir()
    finally:
        os.chown(path, os.geteuid(), os.getegid())
        assert path in tlsconf.sweep_campaign_dirs()


def test_the_sweep_looks_only_at_campaign_key_directories(tmp_path):
    other = Path(tempfile.mkdtemp(prefix="bbrlab-other-"))
    try:
        tlsconf.sweep_campaign_dirs()
        assert other.is_dir()
    finally:
        os.rmdir(other)


def _dead_owner_name() -> str:
    """A campaign key directory name of the form bbrlab gives, for a process that has ended."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    return f"{tlsconf.CAMPAIGN_DIR_PREFIX}{boot}.{dead.pid}.1-"


def test_folders_bbrlab_did_not_stamp_are_never_swept():
    """Issue 35 item 8: this user's ``bbrlab-tls-*`` folders without bbrlab's owner stamp stay, however old
    (a lab's certificates made with ``bbrlab tls --out /tmp/bbrlab-tls-lab``), and so does one named like a
    dead campaign's (the name alone says nothing of who made it)."""
    old = Path(tempfile.mkdtemp(prefix=tlsconf.CAMPAIGN_DIR_PREFIX + "lab-"))
    named = Path(tempfile.mkdtemp(prefix=_dead_owner_name()))
    try:
        for path in (old, named):
            (path / "ca-key.pem").write_text("x")
        os.utime(old, (0, 0))  # unchanged since 1970: older than any age rule
        gone = tlsconf.sweep_campaign_dirs()
        assert old not in gone and named not in gone
        assert (old / "ca-key.pem").is_file() and (named / "ca-key.pem").is_file()
    finally:
        for path in (old, named):
            (path / "ca-key.pem").unlink()
            os.rmdir(path)


def test_a_stamp_of_a_live_process_or_another_machine_keeps_the_folder():
    live = Path(tempfile.mkdtemp(prefix=_dead_owner_name()))
    elsewhere = Path(tempfile.mkdtemp(prefix=_dead_owner_name()))
    try:
        (live / tlsconf.OWNER_FILE).write_text(owners.Owner.current().stamp() + "\n")
        me = owners.Owner.current()
        other = owners.Owner("another-machine", me.boot, 1, 1)  # pid 1 of another machine: nothing here can tell
        (elsewhere / tlsconf.OWNER_FILE).write_text(other.stamp() + "\n")
        gone = tlsconf.sweep_campaign_dirs()
        assert live not in gone and elsewhere not in gone
        assert live.is_dir() and elsewhere.is_dir()
    finally:
        for path in (live, elsewhere):
            (path / tlsconf.OWNER_FILE).unlink()
            os.rmdir(path)
