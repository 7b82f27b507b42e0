"""Pruning the kernel caches (boot files, Debian packages and trees) to a cap, least recently used first, never
what a testbed uses; ``bbrlab cache show|prune``. Real files in a cache of the test's own (``XDG_CACHE_HOME``),
a real testbed state file, a real process working in an entry."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from bbrlab.cli.main import main
from bbrlab.core.errors import ValidationError
from bbrlab.testbed.local import caches

MB = 10**6


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv(caches.MAX_GB_ENV, raising=False)
    root = tmp_path / "xdg" / "bbrlab"
    root.mkdir(parents=True)
    return root


def _entry(root: Path, rel: str, mb: int, days_ago: float) -> Path:
    """An entry of ``mb`` MB of real data, last used ``days_ago``."""
    path = root / rel
    if rel.endswith(".deb"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(mb * MB))
    else:
        path.mkdir(parents=True)
        (path / "data").write_bytes(os.urandom(mb * MB))
    t = time.time() - days_ago * 86400
    os.utime(path, (t, t))
    return path


def _testbed_up_using(name: str, files: dict) -> None:
    state = Path(os.environ["BBRLAB_STATE_DIR"]) / "testbeds" / name
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"name": name, "phase": "up", "sender_boot": files}))


def test_prune_removes_least_recently_used_until_under_the_cap_and_keeps_what_is_in_use(cache):
    oldest_in_use = _entry(cache, "boot/aaaa", 2, days_ago=30)
    old = _entry(cache, "debian/pool/linux-image_1_amd64.deb", 2, days_ago=20)
    worked_in = _entry(cache, "debian/unpacked/linux-headers_1", 2, days_ago=15)
    middle = _entry(cache, "debian/unpacked/linux-image_1", 2, days_ago=10)
    recent = _entry(cache, "boot/bbbb", 2, days_ago=1)
    pins = cache / "debian" / "kernels"
    pins.mkdir(parents=True)
    (pins / "debian-5.10.json").write_text("{}")
    _testbed_up_using("tb1", {"kernel": str(middle / "boot" / "vmlinuz"), "initrd": str(oldest_in_use / "initrd.img"),
                              "modules_disk": None})
    worker = subprocess.Popen(["sleep", "60"], cwd=worked_in)  # a process working in an entry
    try:
        assert [e.path for e in caches.entries()] == [p.resolve() for p in (oldest_in_use, old, worked_in, middle,
                                                                           recent)]
        dry = caches.prune(5 * MB, dry_run=True)
        assert [e.path for e in dry.removed] == [old.resolve(), recent.resolve()] and old.exists() and recent.exists()
        report = caches.prune(5 * MB)
    finally:
        worker.kill()
        worker.wait()
    # 10 MB -> old (2) goes -> 8; worked_in, middle and oldest_in_use are in use -> recent (2) goes -> 6 MB
    assert [e.path for e in report.removed] == [old.resolve(), recent.resolve()]
    assert {e.path for e in report.kept_in_use} == {oldest_in_use.resolve(), worked_in.resolve(), middle.resolve()}
    assert not old.exists() and not recent.exists()
    assert oldest_in_use.is_dir() and worked_in.is_dir() and middle.is_dir() and (pins / "debian-5.10.json").is_file()
    assert report.before_bytes > 10 * MB > report.after_bytes > 5 * MB


def test_prune_stops_as_soon_as_the_entries_fit(cache):
    a = _entry(cache, "boot/a", 3, days_ago=3)
    b = _entry(cache, "boot/b", 3, days_ago=2)
    c = _entry(cache, "boot/c", 3, days_ago=1)
    report = caches.prune(7 * MB)
    assert [e.path for e in report.removed] == [a.resolve()]
    assert b.is_dir() and c.is_dir()
    caches.prune(0)
    assert list((cache / "boot").iterdir()) == []


def test_a_down_testbed_protects_nothing(cache):
    entry = _entry(cache, "boot/cccc", 1, days_ago=1)
    state = Path(os.environ["BBRLAB_STATE_DIR"]) / "testbeds" / "tb2"
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"phase": "down", "sender_boot": {"initrd": str(entry / "x")}}))
    assert caches.prune(0).removed[0].path == entry.resolve() and not entry.exists()


def test_prune_sweeps_work_folders_whose_process_is_gone(cache):
    boot = cache / "boot"
    boot.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    stale = boot / f".build-x-{boot_id}.{dead.pid}.1-abcdefgh"
    stale.mkdir()
    ticks = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    live = boot / f".build-y-{boot_id}.{os.getpid()}.{ticks}-abcdefgh"
    live.mkdir()
    report = caches.prune(5 * MB)
    assert report.swept == [stale] and not stale.exists() and live.is_dir()


def test_the_cap_comes_from_the_environment_and_bad_values_are_refused(cache, monkeypatch):
    assert caches.default_max_bytes() == caches.DEFAULT_MAX_GB * 10**9
    monkeypatch.setenv(caches.MAX_GB_ENV, "0.5")
    assert caches.default_max_bytes() == 500 * MB
    for bad in ("-1", "nan", "inf", "lots"):
        monkeypatch.setenv(caches.MAX_GB_ENV, bad)
        with pytest.raises(ValidationError, match=caches.MAX_GB_ENV):
            caches.default_max_bytes()


def test_cache_cli_shows_and_prunes(cache, capsys):
    old = _entry(cache, "boot/old", 2, days_ago=9)
    new = _entry(cache, "boot/new", 2, days_ago=1)
    assert main(["cache", "show"]) == 0
    shown = capsys.readouterr().out
    assert str(cache) in shown and shown.index(str(old.resolve())) < shown.index(str(new.resolve()))
    assert main(["cache", "prune", "--max-gb", "0.003", "--dry-run"]) == 0
    assert "would remove" in capsys.readouterr().out and old.exists()
    assert main(["cache", "prune", "--max-gb", "0.003"]) == 0
    assert f"removed {old.resolve()}" in capsys.readouterr().out and not old.exists() and new.exists()
    assert main(["cache", "prune", "--max-gb", "-2"]) == 1
    assert "--max-gb = '-2' is not allowed" in capsys.readouterr().err and new.exists()


def test_cache_help_teaches_what_is_kept_and_how_to_prune(capsys):
    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    text = capsys.readouterr().out
    for word in ("boot/", "debian/", "least recently used", "BBRLAB_CACHE_MAX_GB", "--dry-run", "--max-gb 2"):
        assert word in text


def _outside(tmp_path: Path) -> Path:
    """A folder outside the cache with a file in it: what a planted link points to."""
    target = tmp_path / "outside"
    target.mkdir()
    (target / "keep.txt").write_bytes(os.urandom(2 * MB))
    return target


def test_prune_removes_a_linked_entry_as_a_link_and_leaves_its_target(cache, tmp_path):
    """Issue 35 item 8: an entry that is a symbolic link to a folder outside the cache is pruned as the link;
    the folder it points to, and its file, stay."""
    target = _outside(tmp_path)
    (cache / "boot").mkdir()
    link = cache / "boot" / "linked"
    link.symlink_to(target)
    os.utime(link, (0, 0), follow_symlinks=False)  # the oldest entry: pruned first
    _entry(cache, "boot/real", 1, days_ago=1)
    report = caches.prune(0)
    assert link in [e.path for e in report.removed] and not os.path.lexists(link)
    assert (target / "keep.txt").stat().st_size == 2 * MB


def test_prune_never_reaches_through_a_linked_entry_folder(cache, tmp_path):
    """An entry folder (``debian/unpacked``) that is a link to a folder outside the cache: nothing in that folder is
    an entry, nothing of it is removed or swept."""
    target = _outside(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    work = target / f".build-x-{boot_id}.{dead.pid}.1-abcdefgh"  # looks like a stale work folder
    work.mkdir()
    (cache / "debian").mkdir()
    (cache / "debian" / "unpacked").symlink_to(target)
    report = caches.prune(0)
    assert report.removed == [] and report.swept == []
    assert (target / "keep.txt").is_file() and work.is_dir()
