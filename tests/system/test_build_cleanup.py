"""Interrupted builds clean up, for real: a sender kernel's boot files (depmod, mke2fs of a 400 MB modules tree,
an initramfs) built by a separate bbrlab process into a cache of the test's own (``XDG_CACHE_HOME``), stopped
half-way.

- SIGTERM while mke2fs runs: the process ends saying so, its build steps are stopped, and the cache holds
  no work folder (``.build-*``) and no entry, half-made or otherwise.
- SIGKILL while mke2fs runs leaves the work folder (nothing can run then); the next build sweeps it, and
  the build step the killed process left running with it, and builds the entry. A work folder of a process
  that still runs is left alone.

The kernel is the guest image's own 6.1 given as a kernel directory (its vmlinuz, its modules copied out of
the image's root disk with debugfs, its headers' .config), so nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbrlab.testbed.local import image

pytestmark = pytest.mark.system

CHILD = """
import sys
from bbrlab.kernel import sender
from bbrlab.testbed.local import kernelboot
resolved = sender.resolve(sys.argv[1])
kernelboot.boot_files(resolved, lambda s: print(s, flush=True))
print("built", flush=True)
"""


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    """bzImage + lib/modules/<release> + config of the guest image's kernel."""
    img = image.ensure_image()
    release = img.kernel_release
    root = tmp_path_factory.mktemp("kernel")
    (root / "lib" / "modules").mkdir(parents=True)
    shutil.copyfile(img.kernel, root / "bzImage")
    shutil.copyfile(f"/usr/src/linux-headers-{release}/.config", root / "config")
    subprocess.run(["debugfs", "-R", f"rdump /lib/modules/{release} {root / 'lib' / 'modules'}", str(img.disk)],
                   check=True, capture_output=True, timeout=120)  # debugfs opens the image read-only
    assert (root / "lib" / "modules" / release / "kernel").is_dir()
    return root


@pytest.fixture
def own_cache(tmp_path) -> dict:
    """The environment of a bbrlab process whose caches, locks and testbed state are the test's own."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), BBRLAB_LOCK_DIR=str(tmp_path / "locks"),
               BBRLAB_STATE_DIR=str(tmp_path / "state"))
    return env


def _procs_naming(path: Path) -> list[int]:
    """Processes whose command line names something inside ``path``."""
    inside = os.fsencode(f"{path}/")
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if inside in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_build(kernel_dir: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(kernel_dir)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_step(proc: subprocess.Popen, boot: Path, timeout_s: float = 60) -> tuple[Path, list[int]]:
    """The build's work folder and the pids of the build step running in it, once one runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for work in boot.glob(".build-*"):
            pids = _procs_naming(work)
            if pids:
                return work, pids
        assert proc.poll() is None, f"the build ended before a step could be caught: {proc.communicate()}"
        time.sleep(0.005)
    raise AssertionError("no build step ran within the deadline")


def _wait_gone(pids: list[int], timeout_s: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


def test_sigterm_mid_build_leaves_no_work_folder_and_no_half_made_entry(kernel_dir, own_cache, tmp_path):
    boot = tmp_path / "cache" / "bbrlab" / "boot"
    proc = _start_build(kernel_dir, own_cache)
    work, step_pids = _wait_for_step(proc, boot)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "built" not in out
    assert "SIGTERM" in err
    assert _wait_gone(step_pids) == [], "a build step outlived the build"
    assert not work.exists()
    assert list(boot.iterdir()) == [], "a half-made boot entry or a work folder is left"


def test_a_killed_builds_work_folder_is_swept_by_the_next_build(kernel_dir, own_cache, tmp_path):
    boot = tmp_path / "cache" / "bbrlab" / "boot"
    proc = _start_build(kernel_dir, own_cache)
    work, step_pids = _wait_for_step(proc, boot)
    proc.kill()
    proc.communicate(timeout=30)
    assert work.is_dir(), "SIGKILL should have left the work folder (else this test tests nothing)"
    # a work folder of a build that is still running (this process's name in it) must survive the sweep
    ticks = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    alive = boot / f".build-other-{boot_id}.{os.getpid()}.{ticks}-abcdefgh"
    alive.mkdir()
    again = subprocess.run([sys.executable, "-c", CHILD, str(kernel_dir)], env=own_cache, text=True,
                           capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"removed {work}" in again.stdout
    assert not work.exists() and _procs_naming(work) == []
    assert _wait_gone(step_pids) == []
    assert alive.is_dir()
    entries = [p for p in boot.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and (entries[0] / "boot.json").is_file() and (entries[0] / "modules.raw").is_file()
    assert {p.name for p in boot.glob(".build-*")} == {alive.name}
