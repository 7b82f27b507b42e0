"""Local testbed bookkeeping: crash-safe state, the re-entrant lock, the QEMU command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bbrlab.testbed import lock
from bbrlab.testbed.local import qemu
from bbrlab.testbed.local.image import GuestImage
from bbrlab.testbed.local.state import State


def test_state_is_written_at_every_record_and_reads_back(tmp_path, monkeypatch):
    monkeypatch.delenv("BBRLAB_STATE_DIR", raising=False)  # the test suite's own state root
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    s = State("unit")
    s.add_netns("bbrlab-unit-link")
    on_disk = json.loads((tmp_path / "bbrlab/testbeds/unit/state.json").read_text())
    assert on_disk["netns"] == ["bbrlab-unit-link"]
    s.set_vm("sender", vm_name="bbrlab-unit-sender", ssh_port=2222)
    s.set_vm("sender", pid=1234)
    again = State.load("unit")
    assert again.vms["sender"] == {"vm_name": "bbrlab-unit-sender", "ssh_port": 2222, "pid": 1234}
    assert not list((tmp_path / "bbrlab/testbeds/unit").glob("*.tmp"))
    assert State.load("other") is None


def test_lock_is_reentrant_in_our_process_tree(tmp_path):
    path = str(tmp_path / "tb.lock")
    with lock.hold(path):
        assert os.getpid() in lock.lock_holders(path)
        assert lock.held_by_us(path)
        with lock.hold(path, timeout_s=1):  # would time out if it waited for itself
            pass
        # A child process is under our lock too; it must not wait either.
        code = ("import sys; from bbrlab.testbed import lock; "
                f"sys.exit(0 if lock.held_by_us({path!r}) else 3)")
        assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
    assert lock.lock_holders(path) == set()


def test_qemu_command_line_keeps_management_local_and_names_threads(tmp_path):
    spec = qemu.VmSpec(vm_name="bbrlab-unit-sender", hostname="sender", folder=tmp_path, vcpus=2,
                       ssh_port=40022, tap_fds=[7], authorized_key_file=tmp_path / "k.pub")
    argv = qemu.qemu_argv(spec, GuestImage(Path("/img")))
    joined = " ".join(argv)
    assert "bbrlab-unit-sender,debug-threads=on" in argv
    assert "user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22" in argv
    assert "tap,id=exp1,fd=7" in argv
    assert argv[argv.index("-smp") + 1] == "2"
    assert "-cpu host" not in joined and "tcg" in joined
    assert f"name=opt/bbrlab/authorized_keys,file={tmp_path / 'k.pub'}" in argv
    assert "net.ifnames=0" in argv[argv.index("-append") + 1]


def test_is_our_qemu_refuses_other_processes():
    assert not qemu.is_our_qemu(os.getpid(), "bbrlab-unit-sender")
    assert not qemu.is_our_qemu(2 ** 22 + 12345, "bbrlab-unit-sender")


def test_image_recipe_pins_the_host_headers_kernel_and_hashes_the_init_script(monkeypatch):
    from bbrlab.testbed.local import image

    r = image.recipe()
    package, version = image.guest_kernel_package()
    assert r["kernel"] == f"{package}={version}"
    assert package == f"linux-image-{image.host_kernel_abi()}"
    assert image.recipe_hash() == image.recipe_hash(r)  # stable
    monkeypatch.setattr(image, "_init_script", lambda: "#!/bin/bash\n# changed\n")
    assert image.recipe_hash() != image.recipe_hash(r)  # any change to the init script rebuilds


def test_prune_keeps_the_new_image_and_those_running_testbeds_use(tmp_path, monkeypatch):
    from bbrlab.testbed.local import image

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path / "state"))
    images = tmp_path / "cache/bbrlab/images"
    for name in ("new", "old", "inuse", ".build-x"):
        (images / name).mkdir(parents=True)
        (images / name / "image.json").write_text("{}")
    State("running", {"name": "running", "phase": "up", "netns": [], "vms": {},
                      "image": str(images / "inuse")}).save()
    State("stopped", {"name": "stopped", "phase": "down", "netns": [], "vms": {},
                      "image": str(images / "old")}).save()
    removed = image.prune_images(keep=images / "new")
    assert removed == [images / "old"]
    assert sorted(p.name for p in images.iterdir()) == [".build-x", "inuse", "new"]


def test_lock_files_live_in_a_private_directory_and_symlinks_are_refused(tmp_path, monkeypatch):
    import pytest

    from bbrlab.core.errors import TestbedError

    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(tmp_path / "locks"))
    path = lock.lock_path("unit")
    assert path.parent == tmp_path / "locks"
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    path.symlink_to(victim)  # planted at the lock's name: must not be followed (nor truncated, nor chmod-ed)
    with pytest.raises(TestbedError, match="symbolic link"):
        with lock.testbed_lock("unit", timeout_s=1):
            pass
    assert victim.read_text() == "keep me"
    path.unlink()
    with lock.testbed_lock("unit", timeout_s=1):
        assert (path.stat().st_mode & 0o777) == 0o600
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(open_dir))
    with pytest.raises(TestbedError, match="writable by others"):
        lock.lock_path("unit")


def test_lock_holder_says_what_it_is_doing_and_other_names_are_independent(tmp_path, monkeypatch):
    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(tmp_path))
    assert lock.holder("unit") is None
    with lock.testbed_lock("unit"):
        lock.set_activity("unit", "campaign demo", run="3/54")
        info = lock.holder("unit")
        assert info["pids"] == [os.getpid()] and info["activity"] == "campaign demo" and info["run"] == "3/54"
        code = ("import sys; from bbrlab.testbed import lock; "
                "sys.exit(0 if lock.held_by_us(lock.lock_path('other')) else 3)")
        assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 3
        with lock.testbed_lock("other", timeout_s=1):  # another testbed's lock is free
            pass
    assert lock.holder("unit") is None


def test_isolation_plan_gives_each_testbed_cpus_of_its_own_or_refuses():
    import pytest

    from bbrlab.core.errors import TestbedError
    from bbrlab.testbed import isolation

    assert isolation.plan(["a", "b"], cpus=[0, 1], kind="v1") == {"a": [0], "b": [1]}
    assert isolation.plan(["a", "b"], cpus=[0, 1, 2, 3, 4], kind="v1") == {"a": [0, 1, 2], "b": [3, 4]}
    assert isolation.plan(["a", "b"], cpus=[0, 1, 2], kind="v2") == {"a": [1], "b": [2]}  # v2 keeps CPU 0
    with pytest.raises(TestbedError, match="3 local testbeds need 3 CPUs of their own; this machine can give 2"):
        isolation.plan(["a", "b", "c"], cpus=[0, 1], kind="v1")
    with pytest.raises(TestbedError, match="one kept for the system"):
        isolation.plan(["a", "b"], cpus=[0, 1], kind="v2")
    with pytest.raises(TestbedError, match="no cpuset cgroup"):
        isolation.plan(["a", "b"], cpus=[0, 1], kind=None)
    assert isolation._parse_cpus("0-2,5") == [0, 1, 2, 5]
