"""The guest image of the local testbed: recipe, build, cache.

The recipe is a Debian bookworm ``debootstrap --variant=minbase`` with the paper's guest kernel
(Debian's 6.1, pinned to the same ABI as this machine's installed ``linux-headers-*-amd64`` so a
module built here loads in the guest), the tools the experiments run, and bbrlab's own init script.
The folder becomes an ext4 image with ``mke2fs -d`` (no loop mount); kernel and initrd are copied
out of its ``/boot`` for QEMU's ``-kernel``/``-initrd``.

Everything that shapes the image is hashed (:func:`recipe`); the image lives in
``${XDG_CACHE_HOME:-~/.cache}/bbrlab/images/<hash>/`` and is rebuilt only when the hash changes.
A build happens in a work folder next to it (``.build-*``, named for the building process, see
:mod:`bbrlab.core.cachefiles`) and is renamed into place when complete, so a crash never leaves a half
image that looks finished. SIGINT, SIGTERM and SIGHUP stop a build cleanly: its build steps (and
everything they started) are stopped and the work folder removed. A work folder left by a build that
was killed outright is swept by the next build, under the image lock.

debootstrap checks the mirror's signed ``Release`` against Debian's archive keyring and each package against
it (``--keyring ... --force-check-gpg``); without the keyring it would only warn and install whatever the
plain-HTTP mirror served, so a build without it is refused before anything is downloaded.

The image carries an SSH host key (ed25519) generated at build time (public half next to the image,
``host_key.pub``), but no testbed trusts it: the image is shared by every VM of every testbed, so each VM
is handed a key of its own at boot and only that one is pinned (see
:mod:`bbrlab.testbed.local.lifecycle`). A VM that served the image's key would be refused.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from bbrlab.core import cachefiles
from bbrlab.core.errors import TestbedError
from bbrlab.core.signals import interruptible, run_group
from bbrlab.kernel.debian import KEYRING, DebianError, check_keyring

IMAGE_VERSION = 1  # bump when the build steps change in a way the recipe below does not show
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
IMAGE_SIZE_MB = 2048
INIT_PATH = "/usr/local/sbin/bbrlab-init"
GUEST_TOOLS = (
    "iperf3", "iproute2", "openssh-server", "ethtool", "kmod", "python3-minimal",
    "iputils-ping", "procps", "initramfs-tools", "busybox", "linux-base", "rsync",
)
# Modules Debian's initramfs must carry to find the root disk (no udev coldplug in minbase).
INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "ext4")


def cache_dir() -> Path:
    """Where bbrlab caches built things: ``${XDG_CACHE_HOME:-~/.cache}/bbrlab``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "bbrlab"


def host_kernel_abi() -> str:
    """The ABI of the installed amd64 headers (``6.1.0-56-amd64``): the guest kernel must match."""
    found = sorted(glob.glob("/usr/src/linux-headers-*-amd64"))
    if not found:
        raise TestbedError("no /usr/src/linux-headers-*-amd64: install linux-headers-amd64 (make setup)")
    return found[-1].removeprefix("/usr/src/linux-headers-")


def guest_kernel_package() -> tuple[str, str]:
    """``(linux-image-<abi>, version)``: the kernel of the same build as the installed headers.

    Debian publishes point releases of the kernel through bookworm-security, which debootstrap
    does not read; so the package is fetched with this machine's apt (``apt-get download``) and
    installed into the folder with ``dpkg -i``.
    """
    abi = host_kernel_abi()
    p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", f"linux-headers-{abi}"],
                       capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        raise TestbedError(f"cannot read the version of linux-headers-{abi}: {p.stderr.strip()}")
    return f"linux-image-{abi}", p.stdout.strip()


def _init_script() -> str:
    return resources.files("bbrlab.testbed.local").joinpath("guest/bbrlab-init").read_text()


def recipe() -> dict:
    """Everything that determines the image; its hash names the cache entry."""
    kernel_pkg, kernel_version = guest_kernel_package()
    return {
        "image_version": IMAGE_VERSION,
        "suite": SUITE,
        "mirror": MIRROR,
        "size_mb": IMAGE_SIZE_MB,
        "packages": sorted(GUEST_TOOLS),
        "kernel": f"{kernel_pkg}={kernel_version}",
        "initramfs_modules": list(INITRAMFS_MODULES),
        "init_sha256": hashlib.sha256(_init_script().encode()).hexdigest(),
    }


def recipe_hash(r: dict | None = None) -> str:
    """The first 16 hex digits of the SHA-256 of recipe ``r`` as sorted JSON (default: :func:`recipe`, which
    reads this machine's headers): the name of the image's cache folder."""
    blob = json.dumps(r or recipe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class GuestImage:
    """A finished image: root disk (raw ext4), kernel, initrd and the pinned host key."""

    folder: Path

    @property
    def disk(self) -> Path:
        """The raw ext4 root disk, ``root.raw``: the base of every VM's overlay."""
        return self.folder / "root.raw"

    @property
    def kernel(self) -> Path:
        """The image's own kernel, ``vmlinuz``."""
        return self.folder / "vmlinuz"

    @property
    def initrd(self) -> Path:
        """The image's initramfs, ``initrd.img``."""
        return self.folder / "initrd.img"

    @property
    def host_key_pub(self) -> str:
        """The image's own SSH host public key, ``ssh-ed25519 AAAA...`` (replaced in every VM at boot; never pinned)."""
        return (self.folder / "host_key.pub").read_text().split("\n")[0].strip()

    @property
    def info(self) -> dict:
        """``image.json``, read now: recipe, kernel release, build time in seconds and build date."""
        return json.loads((self.folder / "image.json").read_text())

    @property
    def kernel_release(self) -> str:
        """The ``uname -r`` of the image's kernel, from ``image.json``."""
        return self.info["kernel_release"]


def cached_image() -> GuestImage | None:
    """The image for the current recipe if it is built, else None."""
    folder = cache_dir() / "images" / recipe_hash()
    if (folder / "image.json").is_file():
        return GuestImage(folder)
    return None


def ensure_image(progress: Callable[[str], None] = lambda s: None) -> GuestImage:
    """The cached image, built first when the recipe changed or it was never built."""
    from ..lock import image_lock

    img = cached_image()
    if img is not None:
        return img
    with image_lock():
        img = cached_image()  # another process may have built it while we waited
        if img is not None:
            return img
        for stale in sweep_stale_builds():
            progress(f"image: removed {stale}, left by a build that was killed")
        img = build_image(progress)
        for old in prune_images(keep=img.folder):
            progress(f"image: removed the outdated image {old}")
    return img


def _images_in_use() -> set[str]:
    """Image folders that a testbed not yet brought down was started from (its overlays need them),
    or that a running QEMU boots from (a testbed recorded under another state root, e.g. the tests')."""
    from .state import state_root

    used = _images_of_running_qemus()
    for path in state_root().glob("*/state.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("phase") != "down" and data.get("image"):
            used.add(str(Path(data["image"]).resolve()))
    return used


def _images_of_running_qemus() -> set[str]:
    """Image folders that QEMU processes on this machine have open (the root disk behind an overlay,
    the kernel) or name on their command line."""
    images = (cache_dir() / "images").resolve()
    used = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not argv or b"qemu-system" not in argv[0]:
                continue
            paths = [os.fsdecode(a) for a in argv]
            paths += [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        for text in paths:
            path = Path(text.removeprefix("file="))
            if path.is_absolute() and path.parent.parent == images:
                used.add(str(path.parent))
    return used


def prune_images(keep: Path) -> list[Path]:
    """Remove finished images of older recipes that no running testbed uses; return what went."""
    used = _images_in_use() | {str(keep.resolve())}
    removed = []
    for folder in (cache_dir() / "images").iterdir():
        if folder.name.startswith(".") or not (folder / "image.json").is_file():
            continue  # a build in progress, or not ours
        if str(folder.resolve()) not in used:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def sweep_stale_builds() -> list[Path]:
    """Remove the work folders of image and boot-file builds whose process is gone (see
    :mod:`bbrlab.core.cachefiles`); return what went. Callers hold the image lock."""
    root = cache_dir()
    return cachefiles.sweep(root / "images") + cachefiles.sweep(root / "boot")


def _step(name: str, argv: list[str], progress: Callable[[str], None], timeout_s: float = 1800) -> str:
    """Run one build step; fail loudly naming the step and the tail of its output."""
    progress(f"image: {name}")
    try:
        p = run_group(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"guest image build step '{name}' timed out after {timeout_s:.0f} s") from e
    except OSError as e:
        raise TestbedError(f"guest image build step '{name}' could not start {argv[0]}: {e}") from e
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip())[-1500:]
        raise TestbedError(f"guest image build step '{name}' failed (exit {p.returncode}): {tail}")
    return p.stdout


def build_image(progress: Callable[[str], None] = lambda s: None, *, keyring: Path = KEYRING) -> GuestImage:
    """Build the image for the current recipe into the cache (see the module docstring); ``keyring`` is Debian's
    archive keyring debootstrap checks the mirror with (refused before anything is done when it is missing)."""
    try:
        check_keyring(keyring)
    except DebianError as e:
        raise TestbedError(f"not building the guest image: {e}") from None
    with interruptible():
        return _build_image(progress, keyring)


def _build_image(progress: Callable[[str], None], keyring: Path) -> GuestImage:
    r = recipe()
    final = cache_dir() / "images" / recipe_hash(r)
    t0 = time.monotonic()
    work = cachefiles.work_dir(final.parent, final.name)
    try:
        root = work / "rootfs"
        _debootstrap(r, root, progress, keyring)
        _configure(root, progress)
        _install_kernel(r["kernel"], root, progress)  # its postinst builds the initramfs
        release = _export_boot_files(root, work)
        _make_disk(root, work / "root.raw", r["size_mb"], progress)
        shutil.rmtree(root)
        info = {"recipe": r, "kernel_release": release, "build_s": round(time.monotonic() - t0, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (work / "image.json").write_text(json.dumps(info, indent=2) + "\n")
        if final.exists():  # another build finished first; keep theirs
            shutil.rmtree(work)
        else:
            os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    progress(f"image: built in {time.monotonic() - t0:.0f} s -> {final}")
    return GuestImage(final)


def debootstrap_argv(r: dict, root: Path, keyring: Path = KEYRING) -> list[str]:
    """debootstrap's command for recipe ``r`` into ``root``: the mirror's Release checked against ``keyring``,
    and a failed or impossible check an error, never a warning (``--force-check-gpg``)."""
    return ["debootstrap", "--variant=minbase", f"--keyring={keyring}", "--force-check-gpg",
            f"--include={','.join(r['packages'])}", r["suite"], str(root), r["mirror"]]


def _debootstrap(r: dict, root: Path, progress: Callable[[str], None], keyring: Path) -> None:
    _step("debootstrap (a few minutes)", debootstrap_argv(r, root, keyring), progress)


def _install_kernel(package: str, root: Path, progress: Callable[[str], None]) -> None:
    debs = root / "tmp/kernel-debs"
    debs.mkdir(parents=True)
    progress(f"image: apt-get download {package}")
    try:
        p = run_group(["apt-get", "download", package], cwd=debs, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"guest image build step 'download {package}' timed out") from e
    if p.returncode != 0:
        raise TestbedError(f"guest image build step 'download {package}' failed: {p.stderr.strip()[-800:]}")
    names = [f"/tmp/kernel-debs/{d.name}" for d in debs.glob("*.deb")]
    _step(f"install {package}", ["chroot", str(root), "dpkg", "-i", *names], progress, timeout_s=900)
    shutil.rmtree(debs)


def _configure(root: Path, progress: Callable[[str], None]) -> None:
    """Init script, host key, initramfs modules, sshd settings (before the kernel is installed)."""
    progress("image: configure")
    init = root / INIT_PATH.lstrip("/")
    init.write_text(_init_script())
    init.chmod(0o755)
    ssh_dir = root / "etc/ssh"
    for old in ssh_dir.glob("ssh_host_*"):
        old.unlink()
    _step("generate SSH host key", ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bbrlab-guest",
                                    "-f", str(ssh_dir / "ssh_host_ed25519_key")], progress)
    shutil.copyfile(ssh_dir / "ssh_host_ed25519_key.pub", root.parent / "host_key.pub")
    (ssh_dir / "sshd_config.d").mkdir(exist_ok=True)
    (ssh_dir / "sshd_config.d/bbrlab.conf").write_text(
        "# bbrlab: key-only root login, one host key, no DNS lookups of clients\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nUseDNS no\nUsePAM no\n"
    )
    with open(root / "etc/initramfs-tools/modules", "a") as f:
        f.write("".join(f"{m}\n" for m in INITRAMFS_MODULES))
    (root / "etc/hostname").write_text("bbrlab-guest\n")


def _export_boot_files(root: Path, out: Path) -> str:
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise TestbedError("guest image build step 'export kernel' failed: no /boot/vmlinuz-* in the rootfs")
    release = kernels[-1].name.removeprefix("vmlinuz-")
    initrd = root / "boot" / f"initrd.img-{release}"
    if not initrd.is_file():
        raise TestbedError(f"guest image build step 'export initrd' failed: no {initrd}")
    if not re.match(r"6\.1\.", release):
        raise TestbedError(f"guest image has kernel {release}, expected Debian's 6.1")
    shutil.copyfile(kernels[-1], out / "vmlinuz")
    shutil.copyfile(initrd, out / "initrd.img")
    return release


def _make_disk(root: Path, disk: Path, size_mb: int, progress: Callable[[str], None]) -> None:
    _step("mke2fs -d (ext4 image from the folder)",
          ["mke2fs", "-q", "-t", "ext4", "-L", "bbrlab-root", "-d", str(root), str(disk), f"{size_mb}M"],
          progress, timeout_s=600)
