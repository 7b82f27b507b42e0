"""Boot files for a sender kernel other than the guest image's own: a small initramfs and a modules disk.

The image's root file system carries only its own kernel's modules, and its base image is shared
(read-only under each VM's overlay), so another kernel's modules reach the sender on a second,
read-only virtio disk: an ext4 image of that kernel's ``lib/modules/<release>`` (with
``modules.dep`` made here by ``depmod``), which the initramfs mounts at
``/lib/modules/<release>`` inside the root file system before handing over to bbrlab's init.
Everything after that (``modprobe tcp_bbr``, ``inet_diag``, ``sch_fq`` ...) works as with the
image's kernel.

The initramfs is built here, per kernel: Debian's static busybox, bbrlab's ``initramfs-init``,
and the modules that mount the root disk (those of :data:`ROOT_MODULES` that the kernel has as
modules, with their dependencies, decompressed). It is a plain ``newc`` cpio written by
:func:`write_cpio`, so no root privileges are needed to make device nodes.

Both files are cached under ``${XDG_CACHE_HOME:-~/.cache}/bbrlab/boot/<key>/``; the key hashes
the kernel image, its modules tree (paths, sizes, times) and this recipe. They are built in a work
folder next to it (``.build-*``) under the image lock, which also sweeps the work folders of killed
builds; SIGINT, SIGTERM and SIGHUP stop a build and remove its work folder. A new entry prunes the
kernel caches to their cap (:mod:`.caches`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from bbrlab.core import cachefiles
from bbrlab.core.cachefiles import sha256_file
from bbrlab.core.errors import TestbedError
from bbrlab.core.signals import interruptible, run_group
from bbrlab.kernel.features import module_name
from bbrlab.kernel.sender import ResolvedKernel

from ..lock import image_lock
from . import caches
from .image import cache_dir, sweep_stale_builds
from .qemu import MODULES_DISK_SERIAL, BootFiles

BOOT_RECIPE_VERSION = 1
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static (scripts/install-system-packages)
#: Modules that find and mount the root disk, in load order (dependencies are added first).
#: crc32c: ext4's metadata checksums; crc32c_intel needs SSE4.2 (absent from TCG's default CPU),
#: crc32c_generic always works.
ROOT_MODULES = ("virtio_pci", "virtio_blk", "crc32c_generic", "crc32c_intel", "ext4")
OPTIONAL_ROOT_MODULES = ("crc32c_intel",)
MODULES_DISK_MARGIN = 1.25
MODULES_DISK_SLACK_MB = 16


def _init_script() -> bytes:
    return resources.files("bbrlab.testbed.local").joinpath("guest/initramfs-init").read_bytes()


def _tree_fingerprint(modules_dir: Path | None) -> str:
    if modules_dir is None:
        return "-"
    digest = hashlib.sha256()
    for p in sorted(modules_dir.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            digest.update(f"{p.relative_to(modules_dir)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def bundle_key(resolved: ResolvedKernel) -> str:
    """Hash of everything that shapes the boot files of ``resolved``."""
    if not BUSYBOX.is_file():
        raise TestbedError(f"{BUSYBOX} is missing: install busybox-static (make setup)")
    parts = [str(BOOT_RECIPE_VERSION), resolved.kernel.sha256, _tree_fingerprint(resolved.files.modules_dir),
             hashlib.sha256(_init_script()).hexdigest(), sha256_file(BUSYBOX), ",".join(ROOT_MODULES)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def boot_files(resolved: ResolvedKernel, progress: Callable[[str], None] = lambda s: None) -> BootFiles:
    """Kernel, initrd and modules disk that boot ``resolved`` as the sender (built once, cached)."""
    files = resolved.files
    if files.initrd is not None:  # the image's own kernel: Debian's initramfs, modules in the image
        return BootFiles(files.bzimage, files.initrd)
    final = cache_dir() / "boot" / bundle_key(resolved)
    if (final / "boot.json").is_file():
        cachefiles.mark_used(final)
    else:
        with image_lock():
            for stale in sweep_stale_builds():
                progress(f"kernel {resolved.kernel.name}: removed {stale}, left by a build that was killed")
            if not (final / "boot.json").is_file():  # another process may have built it while we waited
                _build(resolved, final, progress)
                _prune(resolved, final, progress)
    disk = final / "modules.raw"
    return BootFiles(files.bzimage, final / "initrd.img", disk if disk.is_file() else None)


def _prune(resolved: ResolvedKernel, final: Path, progress: Callable[[str], None]) -> None:
    """Keep the kernel caches under their cap; never this kernel's files (a failure only warns)."""
    files = resolved.files
    keep = [final, *(p for p in (files.bzimage, files.modules_dir, files.headers_dir, files.source) if p)]
    try:
        report = caches.prune(keep=keep)
    except (OSError, TestbedError) as e:
        progress(f"kernel caches: not pruned ({e})")
        return
    for entry in report.removed:
        progress(f"kernel caches: removed {entry.path} ({entry.size_bytes / 1e6:.0f} MB, least recently used)")


def _build(resolved: ResolvedKernel, final: Path, progress: Callable[[str], None]) -> None:
    with interruptible():
        _build_in_work_dir(resolved, final, progress)


def _build_in_work_dir(resolved: ResolvedKernel, final: Path, progress: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    release = resolved.kernel.release
    work = cachefiles.work_dir(final.parent, final.name)
    try:
        staged = None
        if resolved.files.modules_dir is not None:
            progress(f"kernel {resolved.kernel.name}: modules disk for {release} (depmod, mke2fs)")
            staged = _stage_modules(resolved.files.modules_dir, work / "root", release)
            _make_modules_disk(staged, work / "modules.raw")
        modules = root_module_files(staged) if staged is not None else []
        write_cpio(work / "initrd.img", _initramfs_entries(release, modules, staged is not None))
        if staged is not None:
            shutil.rmtree(work / "root")
        info = {"kernel": resolved.kernel.to_dict(), "root_modules": [m.name for m in modules],
                "build_s": round(time.monotonic() - t0, 1)}
        (work / "boot.json").write_text(json.dumps(info, indent=2) + "\n")
        try:
            os.rename(work, final)
        except OSError:  # another process finished first
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    progress(f"kernel {resolved.kernel.name}: boot files built in {time.monotonic() - t0:.1f} s")


def _run(step: str, argv: list[str], timeout_s: float = 600) -> None:
    p = run_group(argv, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise TestbedError(f"kernel boot files: {step} failed (exit {p.returncode}): "
                           f"{(p.stderr or p.stdout).strip()[-800:]}")


def _stage_modules(modules_dir: Path, root: Path, release: str) -> Path:
    """A copy of the modules tree with its dependency files made by ``depmod`` (the source is not touched)."""
    staged = root / "lib" / "modules" / release
    staged.parent.mkdir(parents=True)
    shutil.copytree(modules_dir, staged, symlinks=True)
    for link in ("build", "source"):  # point at headers on the build machine, meaningless in the guest
        (staged / link).unlink(missing_ok=True)
    _run("depmod", ["depmod", "-b", str(root), release])
    return staged


def _make_modules_disk(staged: Path, disk: Path) -> None:
    used = sum(p.stat().st_size for p in staged.rglob("*") if p.is_file() and not p.is_symlink())
    size_mb = int(used * MODULES_DISK_MARGIN / 2**20) + MODULES_DISK_SLACK_MB
    _run("mke2fs -d (modules disk)", ["mke2fs", "-q", "-t", "ext4", "-O", "^has_journal", "-L", "bbrlab-mods",
                                      "-d", str(staged), str(disk), f"{size_mb}M"])


def _module_map(staged: Path) -> dict[str, tuple[str, list[str]]]:
    """``name -> (path relative to the tree, [dependency paths])`` from ``modules.dep``."""
    out = {}
    for line in (staged / "modules.dep").read_text().splitlines():
        path, _, deps = line.partition(":")
        if path:
            out[module_name(path)] = (path.strip(), deps.split())
    return out


def root_module_files(staged: Path) -> list[Path]:
    """The module files :data:`ROOT_MODULES` need, dependencies before dependants (built-ins skipped)."""
    mods = _module_map(staged)
    by_path = {path: name for name, (path, _) in mods.items()}
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name not in mods:
            return
        for dep in mods[name][1]:
            visit(by_path.get(dep, module_name(dep)))
        order.append(name)

    for name in ROOT_MODULES:
        visit(name)
    return [staged / mods[name][0] for name in order]


def _decompressed(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        p = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, timeout=60)
        if p.returncode != 0:
            raise TestbedError(f"zstd -dc {path} failed: {p.stderr.decode(errors='replace')[-300:]}")
        return p.stdout
    return data


def _initramfs_entries(release: str, modules: list[Path], modules_disk: bool) -> list[tuple]:
    """``(path, mode, data-or-None, rdev)`` entries of the initramfs, directories first."""
    entries: list[tuple] = [(d, stat.S_IFDIR | 0o755, None, 0)
                            for d in ("bin", "dev", "etc", "etc/bbrlab", "lib", "lib/modules", "newroot",
                                      "proc", "sys")]
    entries.append(("dev/console", stat.S_IFCHR | 0o600, None, os.makedev(5, 1)))
    entries.append(("bin/busybox", stat.S_IFREG | 0o755, BUSYBOX.read_bytes(), 0))
    entries.append(("init", stat.S_IFREG | 0o755, _init_script(), 0))
    entries.append(("etc/bbrlab/release", stat.S_IFREG | 0o644, f"{release}\n".encode(), 0))
    serial = f"{MODULES_DISK_SERIAL}\n".encode() if modules_disk else b""
    entries.append(("etc/bbrlab/modules-disk", stat.S_IFREG | 0o644, serial, 0))
    names = []
    for path in modules:
        name = module_name(path.name)
        names.append(name)
        entries.append((f"lib/modules/{name}.ko", stat.S_IFREG | 0o644, _decompressed(path), 0))
    listing = "".join(f"{n} {'optional' if n in OPTIONAL_ROOT_MODULES else 'required'}\n" for n in names)
    entries.append(("etc/bbrlab/modules", stat.S_IFREG | 0o644, listing.encode(), 0))
    return entries


def write_cpio(path: Path, entries: list[tuple]) -> None:
    """Write a ``newc`` cpio archive (what the kernel unpacks as an initramfs), owner root, time 0."""
    def header(ino: int, name: str, mode: int, size: int, rdev: int) -> bytes:
        fields = [ino, mode, 0, 0, 2 if stat.S_ISDIR(mode) else 1, 0, size, 0, 0,
                  os.major(rdev), os.minor(rdev), len(name) + 1, 0]
        raw = b"070701" + b"".join(f"{v:08x}".encode() for v in fields) + name.encode() + b"\0"
        return raw + b"\0" * (-len(raw) % 4)

    with open(path, "wb") as out:
        for ino, (name, mode, data, rdev) in enumerate(entries, start=1):
            body = data or b""
            out.write(header(ino, name, mode, len(body), rdev))
            out.write(body + b"\0" * (-len(body) % 4))
        out.write(header(0, "TRAILER!!!", 0, 0, 0))
