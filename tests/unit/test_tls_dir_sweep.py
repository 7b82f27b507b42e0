"""A campaign's key directory left by a driver killed outright (SIGKILL) is removed by the next campaign on
this machine; live campaigns' and other users' directories are never touched. Real processes and real
directories in the real temporary folder; nothing is mocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bbrlab.campaign import tls as tlsconf

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
            os.rmdir(mine)
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
