"""Sender kernels from files: bzImage header, feature evidence, layout, refusals, boot files, probe parsing.

The negative cases use small made-up kernel directories (a bzImage header with a version string, a
modules tree of empty .ko files): they test bbrlab's input validation, which reads only those
files. Real Debian kernels are resolved, built for and booted in tests/system/.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from bbrlab.core.cachefiles import sha256_file
from bbrlab.core.errors import ValidationError
from bbrlab.kernel import debian
from bbrlab.kernel.bbr2b import Bbr2bUnavailable, patch_dirs, patch_for_source
from bbrlab.kernel.bzimage import NotABzImage, read_bzimage
from bbrlab.kernel.ccaprobe import parse_probe
from bbrlab.kernel.features import REQUIRED, MissingFeatures, check_features
from bbrlab.kernel.sender import SenderKernel, resolve
from bbrlab.kernel.source import read_expected_sha256s
from bbrlab.kernel.tree import FRAGMENT, config_mismatches, fragment_settings, tree_bbr_version
from bbrlab.testbed.local import kernelboot, qemu

RELEASE = "6.1.99-test"
MODULE_PATHS = {  # where Linux keeps these modules
    "virtio_pci": "drivers/virtio", "virtio_blk": "drivers/block", "virtio_net": "drivers/net", "ext4": "fs/ext4",
    "qemu_fw_cfg": "drivers/firmware", "inet_diag": "net/ipv4", "tcp_diag": "net/ipv4", "tcp_bbr": "net/ipv4",
}


def write_bzimage(path: Path, version: str = f"{RELEASE} (someone@example) #1 SMP") -> Path:
    """A file with an x86 boot header whose kernel_version pointer leads to ``version``."""
    data = bytearray(0x1000)
    struct.pack_into("<H", data, 0x1FE, 0xAA55)
    data[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", data, 0x206, 0x020F)
    struct.pack_into("<H", data, 0x20E, 0x800 - 0x200)
    text = version.encode() + b"\0"
    data[0x800:0x800 + len(text)] = text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data))
    return path


def kernel_dir(root: Path, *, builtin=("virtio_pci", "ext4"), drop=(), release=RELEASE) -> Path:
    """bzImage + lib/modules/<release>: ``builtin`` in modules.builtin, the rest as (empty) .ko files."""
    write_bzimage(root / "bzImage", f"{RELEASE} (someone@example) #1 SMP")
    mods = root / "lib" / "modules" / release
    mods.mkdir(parents=True)
    (mods / "modules.builtin").write_text("".join(f"kernel/{MODULE_PATHS[m]}/{m}.ko\n" for m in builtin))
    for name, where in MODULE_PATHS.items():
        if name in builtin or name in drop:
            continue
        (mods / "kernel" / where).mkdir(parents=True, exist_ok=True)
        (mods / "kernel" / where / f"{name}.ko.xz").write_bytes(b"")
    return root


# -- bzImage ------------------------------------------------------------------------------------
def test_bzimage_header_gives_the_release(tmp_path):
    img = read_bzimage(write_bzimage(tmp_path / "bzImage"))
    assert img.release == RELEASE and img.protocol == "2.15"


@pytest.mark.parametrize("content, why", [
    (b"#!/bin/sh\necho not a kernel\n", "only"),
    (bytes(0x1000), "no x86 boot header"),
])
def test_not_a_bzimage_is_refused_with_the_reason(tmp_path, content, why):
    path = tmp_path / "bzImage"
    path.write_bytes(content)
    with pytest.raises(NotABzImage, match=why) as err:
        read_bzimage(path)
    assert str(path) in str(err.value)


def test_a_header_without_a_version_string_is_refused(tmp_path):
    path = write_bzimage(tmp_path / "bzImage")
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 0x20E, 0)
    path.write_bytes(bytes(data))
    with pytest.raises(NotABzImage, match="version"):
        read_bzimage(path)


# -- features -----------------------------------------------------------------------------------
def test_features_from_a_modules_tree(tmp_path):
    root = kernel_dir(tmp_path)
    report = check_features("k", root / "lib/modules" / RELEASE, None).require()
    assert report.found["virtio_pci"] == "builtin" and report.found["tcp_diag"] == "module"
    assert report.found["sch_netem"] == "missing" and report.missing_required == ()


def test_missing_tcp_diag_is_named_with_its_config_symbol(tmp_path):
    root = kernel_dir(tmp_path, drop=("tcp_diag",))
    report = check_features("mykernel", root / "lib/modules" / RELEASE, None)
    with pytest.raises(MissingFeatures) as err:
        report.require()
    assert "mykernel" in str(err.value) and "tcp_diag (CONFIG_INET_TCP_DIAG" in str(err.value)
    assert "inet_diag (" not in str(err.value)


def test_config_only_counts_modules_as_missing_unless_they_are_elsewhere(tmp_path):
    config = tmp_path / "config"
    config.write_text("".join(f"{f.config}=m\n" for f in REQUIRED).replace("CONFIG_EXT4_FS=m", "CONFIG_EXT4_FS=y"))
    alone = check_features("k", None, config)
    assert alone.found["ext4"] == "builtin" and "tcp_diag" in alone.missing_required
    assert check_features("k", None, config, modules_elsewhere=True).missing_required == ()


def test_no_evidence_at_all_is_refused():
    with pytest.raises(MissingFeatures, match="neither a modules tree"):
        check_features("k", None, None)


# -- resolving a user's kernel --------------------------------------------------------------------
def test_a_user_kernel_directory_resolves_with_its_identity(tmp_path):
    root = kernel_dir(tmp_path / "k")
    resolved = resolve(str(root))
    k = resolved.kernel
    assert (k.origin, k.release, k.path) == ("user", RELEASE, str(root))
    assert k.sha256 == sha256_file(root / "bzImage") and k.package is None
    assert resolved.files.modules_dir == root / "lib/modules" / RELEASE and resolved.files.initrd is None
    assert SenderKernel.from_dict(k.to_dict()) == k


@pytest.mark.parametrize("make, why", [
    (lambda p: p, "does not exist"),
    (lambda p: (p.mkdir(), p)[1], "holds no kernel image"),
    (lambda p: (p.mkdir(), (p / "bzImage").write_text("hello\n"), p)[2], "is not a bzImage"),
    (lambda p: kernel_dir(p, drop=("tcp_diag",)), "missing tcp_diag"),
    (lambda p: kernel_dir(p, release="5.4.0-other"), "modules for 5.4.0-other"),
    (lambda p: (kernel_dir(p), write_bzimage(p / "vmlinuz"), p)[2], "more than one kernel image"),
    (lambda p: (p.parent.mkdir(exist_ok=True), p.with_suffix(".deb").write_text("x"), p.with_suffix(".deb"))[2],
     "not a Debian package"),
])
def test_a_bad_kernel_is_refused_before_anything_boots(tmp_path, make, why):
    path = make(tmp_path / "kern")
    with pytest.raises(ValidationError) as err:
        resolve(str(path))
    assert err.value.field == "kernel" and why in str(err.value) and str(path) in str(err.value)


def test_an_unknown_kernel_name_is_refused():
    with pytest.raises(ValidationError, match="debian-5.10, debian-6.12"):
        resolve("debian-7")


def test_the_image_kernel_name_needs_the_testbed():
    with pytest.raises(Exception, match="guest image"):
        resolve("debian-6.1")


# -- Debian index ---------------------------------------------------------------------------------
RELEASE_TEXT = """Origin: Debian
SHA256:
 aaaa 100 main/binary-amd64/Packages
 bbbb 200 main/binary-amd64/Packages.xz
"""
PACKAGES_TEXT = """Package: linux-image-amd64
Version: 5.10.223-1
Depends: linux-image-5.10.0-32-amd64 (= 5.10.223-1)
Filename: pool/main/l/linux-signed-amd64/linux-image-amd64_5.10.223-1_amd64.deb
Size: 1000
SHA256: cccc

Package: libfoo
Version: 1

Package: linux-headers-5.10.0-32-amd64
Version: 5.10.223-1
Depends: linux-headers-5.10.0-32-common (= 5.10.223-1), linux-kbuild-5.10 (>= 5.10.223-1), linux-compiler-gcc-10-x86
Filename: pool/main/l/linux/linux-headers-5.10.0-32-amd64_5.10.223-1_amd64.deb
Size: 2000
SHA256: dddd
"""


def test_release_file_gives_the_index_hash():
    assert debian.index_sha256(RELEASE_TEXT) == "bbbb"
    with pytest.raises(debian.DebianError):
        debian.index_sha256("SHA256:\n aaaa 1 other\n")


def test_packages_index_keeps_kernel_packages_and_their_dependencies():
    index = debian.parse_packages(PACKAGES_TEXT, "bullseye")
    assert set(index) == {"linux-image-amd64", "linux-headers-5.10.0-32-amd64"}
    meta = index["linux-image-amd64"][0]
    assert debian.depends(meta) == [("linux-image-5.10.0-32-amd64", "= 5.10.223-1")]
    headers = index["linux-headers-5.10.0-32-amd64"][0]
    assert [n for n, _ in debian.depends(headers)] == ["linux-headers-5.10.0-32-common", "linux-kbuild-5.10",
                                                        "linux-compiler-gcc-10-x86"]
    assert debian.DebPackage("a", "1:2~bpo", "f", "s", 1, "x").key == "a_1%3a2~bpo"


def test_debian_6_12_comes_from_bookworm_backports():
    assert debian.SUITE_KERNELS["debian-6.12"].suite == "bookworm-backports"
    assert debian.SUITE_KERNELS["debian-5.10"].suite == "bullseye"


# -- bbr2b patches --------------------------------------------------------------------------------
def test_each_patch_directory_lists_the_sources_it_was_checked_against():
    names = {p.name for p in patch_dirs()}
    assert {"bbr1", "bbr1-5.10"} <= names
    assert len(read_expected_sha256s(Path(__file__).parents[3] / "kernels/bbr1/SOURCE.sha256")) == 2  # 6.1, 6.12


def test_a_tcp_bbr_c_no_patch_was_checked_against_is_refused(tmp_path):
    src = tmp_path / "tcp_bbr.c"
    src.write_text("/* some other BBR */\n")
    with pytest.raises(Bbr2bUnavailable, match=sha256_file(src)):
        patch_for_source(src)


# -- build-tree helpers ---------------------------------------------------------------------------
def test_fragment_asks_for_what_the_sender_needs():
    wanted = fragment_settings(FRAGMENT)
    for f in REQUIRED:
        assert wanted[f.config] == "y", f.config
    assert wanted["CONFIG_TCP_CONG_BBR"] == "m" and wanted["CONFIG_NET_SCH_NETEM"] == "y"
    assert config_mismatches(wanted, {**wanted, "CONFIG_DEBUG_INFO_BTF": "n"}) == []
    bad = config_mismatches({"CONFIG_A": "y", "CONFIG_B": "n"}, {"CONFIG_A": "m", "CONFIG_B": "y"})
    assert bad == ["CONFIG_A=y (got m)", "CONFIG_B=n (got y)"]


def test_tree_bbr_version_from_the_source_text():
    assert tree_bbr_version("#include <x>\n#define BBR_VERSION\t\t3\n") == 3
    assert tree_bbr_version("static struct tcp_congestion_ops tcp_bbr_cong_ops = {};") == 1
    assert tree_bbr_version("int x;") is None


# -- boot files -----------------------------------------------------------------------------------
def read_newc(path: Path) -> dict[str, tuple[int, bytes, int]]:
    """name -> (mode, data, rdev) of a newc cpio archive."""
    blob, pos, out = path.read_bytes(), 0, {}
    while True:
        assert blob[pos:pos + 6] == b"070701"
        f = [int(blob[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        namesize, size = f[11], f[6]
        name = blob[pos + 110: pos + 110 + namesize - 1].decode()
        pos += 110 + namesize
        pos += -pos % 4
        if name == "TRAILER!!!":
            return out
        out[name] = (f[1], blob[pos:pos + size], os.makedev(f[9], f[10]))
        pos += size + (-size % 4)


def test_cpio_writer_makes_a_newc_archive_with_a_console_node(tmp_path):
    entries = [("dev", stat.S_IFDIR | 0o755, None, 0), ("dev/console", stat.S_IFCHR | 0o600, None, os.makedev(5, 1)),
               ("init", stat.S_IFREG | 0o755, b"#!/bin/sh\n", 0), ("odd", stat.S_IFREG | 0o644, b"abc", 0)]
    kernelboot.write_cpio(tmp_path / "i.cpio", entries)
    got = read_newc(tmp_path / "i.cpio")
    assert set(got) == {"dev", "dev/console", "init", "odd"}
    assert stat.S_ISCHR(got["dev/console"][0]) and got["dev/console"][2] == os.makedev(5, 1)
    assert got["init"][1] == b"#!/bin/sh\n" and got["odd"][1] == b"abc"


def test_root_modules_come_with_their_dependencies_first(tmp_path):
    (tmp_path / "modules.dep").write_text(
        "kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/jbd2/jbd2.ko.xz\n"
        "kernel/lib/crc16.ko.xz:\nkernel/fs/jbd2/jbd2.ko.xz:\n"
        "kernel/drivers/block/virtio_blk.ko.xz:\nkernel/net/ipv4/tcp_bbr.ko.xz:\n")
    files = [p.relative_to(tmp_path).as_posix() for p in kernelboot.root_module_files(tmp_path)]
    assert files == ["kernel/drivers/block/virtio_blk.ko.xz", "kernel/lib/crc16.ko.xz", "kernel/fs/jbd2/jbd2.ko.xz",
                     "kernel/fs/ext4/ext4.ko.xz"]


def test_qemu_boots_the_given_kernel_with_its_read_only_modules_disk(tmp_path):
    boot = qemu.BootFiles(tmp_path / "vmlinuz", tmp_path / "initrd.img", tmp_path / "modules.raw")
    spec = qemu.VmSpec(vm_name="bbrlab-t-sender", hostname="sender", folder=tmp_path, boot=boot, ssh_port=2222)
    argv = qemu.qemu_argv(spec, image=None)
    assert argv[argv.index("-kernel") + 1] == str(boot.kernel) and argv[argv.index("-initrd") + 1] == str(boot.initrd)
    drive = next(a for a in argv if a.startswith(f"file={boot.modules_disk}"))
    assert "readonly=on" in drive and "format=raw" in drive
    assert any(f"serial={qemu.MODULES_DISK_SERIAL}" in a and "addr=0x8" in a for a in argv)


def test_parse_probe_output():
    line = ("name=bbr2b\tin_use_as=bbr2b\tmodule=bbr2b\trefcount_rose=bbr2b\tinfo_bytes=20\tbbr_version=1\t"
            "patch_sha256=abc\tsrcversion=XYZ\nname=cubic\tin_use_as=cubic\tmodule=\trefcount_rose=\tinfo_bytes=0\t"
            "bbr_version=\tpatch_sha256=\tsrcversion=\n")
    got = parse_probe(line)
    assert got["bbr2b"].bbr_version == 1 and got["bbr2b"].patched and got["bbr2b"].module == "bbr2b"
    assert got["cubic"].bbr_version is None and not got["cubic"].patched and got["cubic"].module is None
