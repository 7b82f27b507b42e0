"""Real Debian kernels for the sender, without booting: mirror, verification, unpacking, bbr2b, boot files.

Downloads from the Debian mirror the first time (linux-image, headers and linux-source of
bullseye's 5.10 and bookworm-backports' 6.12, ~600 MB together), then works from the cache.
Booting them is tests/system/test_sender_kernel_testbed.py.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from bbrlab.core.cachefiles import sha256_file
from bbrlab.core.errors import ValidationError
from bbrlab.kernel import debian, sender
from bbrlab.kernel.bbr2b import build_bbr2b, check_bbr2b
from bbrlab.kernel.build import modinfo_field
from bbrlab.testbed.local import kernelboot
from bbrlab.testbed.local.lifecycle import resolve_sender_kernel

pytestmark = pytest.mark.system


@pytest.fixture(scope="module", params=["debian-5.10", "debian-6.12"])
def debian_kernel(request) -> sender.ResolvedKernel:
    return sender.resolve(request.param)


def test_debian_kernel_is_the_suites_package_and_has_what_the_sender_needs(debian_kernel):
    k, files = debian_kernel.kernel, debian_kernel.files
    kset = debian.resolve_kernel_set(k.name)
    assert (k.origin, k.package, k.package_version, k.suite) == ("debian", kset.image.name, kset.image.version,
                                                                 debian.SUITE_KERNELS[k.name].suite)
    assert k.release == kset.release == files.modules_dir.name
    assert k.release.startswith({"debian-5.10": "5.10.", "debian-6.12": "6.12."}[k.name])
    assert k.sha256 == sha256_file(files.bzimage)
    assert sha256_file(debian.download(kset.image)) == kset.image.sha256  # as the signed index says
    assert debian_kernel.features.missing_required == ()
    assert debian_kernel.features.found["tcp_bbr"] == "module"


def test_the_pinned_package_set_is_reused(debian_kernel):
    name = debian_kernel.kernel.name
    assert debian.resolve_kernel_set(name) == debian.resolve_kernel_set(name)
    assert debian.pinned_release(name) == debian_kernel.kernel.release


def test_bbr2b_builds_for_the_kernel_with_the_right_patch(debian_kernel):
    plan = check_bbr2b(debian_kernel)
    expected_patch = {"debian-5.10": "bbr1-5.10", "debian-6.12": "bbr1"}[debian_kernel.kernel.name]
    assert plan.build.patch_path.parent.name == expected_patch
    built = build_bbr2b(plan)
    assert built.target_release == debian_kernel.kernel.release
    assert modinfo_field(built.ko_path, "bbrlab_patch_sha256") == plan.build.patch_sha256
    assert "deficit_gain" in modinfo_field(built.ko_path, "parm")


def test_boot_files_carry_the_root_modules_and_a_modules_disk(debian_kernel, tmp_path):
    boot = kernelboot.boot_files(debian_kernel)
    assert boot.kernel == debian_kernel.files.bzimage
    listing = subprocess.run(["cpio", "-it"], stdin=open(boot.initrd, "rb"), capture_output=True, text=True,
                             check=True).stdout.split()
    assert {"init", "bin/busybox", "dev/console", "lib/modules/virtio_blk.ko", "lib/modules/ext4.ko",
            "etc/bbrlab/modules"} <= set(listing)
    disk = subprocess.run(["debugfs", "-R", "ls -l /", str(boot.modules_disk)], capture_output=True, text=True,
                          check=True).stdout
    assert "modules.dep.bin" in disk and "kernel" in disk
    assert kernelboot.boot_files(debian_kernel) == boot  # cached


def test_the_image_kernel_is_debian_6_1_with_its_own_initramfs():
    resolved = resolve_sender_kernel("debian-6.1")
    k = resolved.kernel
    assert k.name == "debian-6.1" and k.release.startswith("6.1.") and k.package == f"linux-image-{k.release}"
    assert resolved.files.initrd is not None and resolved.features.missing_required == ()
    assert kernelboot.boot_files(resolved).modules_disk is None


def test_a_linux_image_deb_is_a_user_kernel(tmp_path):
    kset = debian.resolve_kernel_set("debian-5.10")
    deb = tmp_path / "my-kernel.deb"
    shutil.copyfile(debian.download(kset.image), deb)
    resolved = sender.resolve(str(deb))
    assert (resolved.kernel.origin, resolved.kernel.release, resolved.kernel.path) == ("user", kset.release, str(deb))


def test_a_deb_that_is_not_a_kernel_is_refused(tmp_path):
    kset = debian.resolve_kernel_set("debian-5.10")
    headers = next(p for p in kset.headers if p.name.endswith("-common"))
    with pytest.raises(ValidationError, match="not a linux-image"):
        sender.resolve(str(debian.download(headers)))


def test_a_real_kernel_without_tcp_diag_is_refused_naming_it(tmp_path):
    """Debian's 5.10 (image + modules) copied, its tcp_diag.ko removed: refused before anything boots."""
    real = sender.resolve("debian-5.10").files
    mine = tmp_path / "kernel"
    mods = mine / "lib" / "modules" / real.modules_dir.name
    shutil.copytree(real.modules_dir, mods, symlinks=True)
    shutil.copyfile(real.bzimage, mine / "vmlinuz")
    ok = sender.resolve(str(mine))
    assert ok.kernel.origin == "user" and ok.kernel.sha256 == sha256_file(real.bzimage)
    for ko in mods.rglob("tcp_diag.ko*"):
        ko.unlink()
    with pytest.raises(ValidationError) as err:
        sender.resolve(str(mine))
    assert "tcp_diag (CONFIG_INET_TCP_DIAG" in str(err.value) and str(mine) in str(err.value)


def test_testbed_up_refuses_a_bad_kernel_before_anything_changes(tmp_path, capsys):
    import bbrlab.testbed as tbmod
    from bbrlab.cli.main import main
    from bbrlab.testbed.local import plumbing
    from bbrlab.testbed.local.state import state_dir

    fake = tmp_path / "kernel"
    fake.mkdir()
    (fake / "bzImage").write_text("not a kernel\n")
    with pytest.raises(ValidationError, match="is not a bzImage"):
        tbmod.up("zz-kern", progress=False, kernel=str(fake))
    assert main(["testbed", "up", "--name", "zz-kern", "--kernel", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "kernel = " in err and "does not exist" in err
    assert not state_dir("zz-kern").exists()
    assert not plumbing.netns_exists(plumbing.link_netns("zz-kern"))


def test_cca_probe_on_this_host_kernel():
    """This machine's kernel (6.18, BBR built in) answers the same probe the sender runs."""
    from bbrlab.core.hosts import LocalHost
    from bbrlab.kernel.ccaprobe import CcaIdentities, probe_ccas

    host = LocalHost()
    found = probe_ccas(host)
    offered = host.read_text("/proc/sys/net/ipv4/tcp_available_congestion_control").split()
    assert list(found) == offered
    assert found["cubic"].bbr_version is None and found["reno"].bbr_version is None
    if "bbr" in found:
        assert (found["bbr"].bbr_version, found["bbr"].info_bytes, found["bbr"].patched) == (1, 20, False)
    cache = CcaIdentities()
    assert cache.get(host, "cubic") == found["cubic"] and cache.boot_id
    with pytest.raises(Exception, match="no congestion control 'nope'"):
        cache.get(host, "nope")
