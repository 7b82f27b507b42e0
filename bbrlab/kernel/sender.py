"""The sender's kernel: a name or a path, resolved to files and checked before anything boots.

Names:

- ``debian-6.1`` (default): the guest image's own kernel (Debian 12's, the ABI of this machine's
  ``linux-headers-*-amd64``), booted with the image's Debian initramfs;
- ``debian-5.10``: Debian 11's kernel (bullseye); ``debian-6.12``: Debian 13's series as built
  for Debian 12 (bookworm-backports; see :data:`bbrlab.kernel.debian.SUITE_KERNELS` for why).
  Fetched from the mirror into the cache (:mod:`bbrlab.kernel.debian`).

Paths (a user's kernel):

- a directory holding one kernel image (``bzImage``, ``vmlinuz``, ``vmlinuz-<release>``,
  ``boot/vmlinuz-<release>`` or ``arch/x86/boot/bzImage``), its modules as
  ``make modules_install INSTALL_MOD_PATH=<dir>`` leaves them (``lib/modules/<release>/``), and
  optionally its ``.config`` (``.config``, ``config``, ``config-<release>``,
  ``boot/config-<release>``) and a prebuilt ``bbr2b/`` (``bbrlab kernel build-tree`` makes all
  of this);
- a ``linux-image-*.deb``: unpacked into the cache and read like a directory.

:func:`resolve` returns a :class:`ResolvedKernel`: the :class:`SenderKernel` a run records as
``metadata.kernel``, the files the testbed boots, and the :class:`FeatureReport` proving the
kernel has virtio, ext4, fw_cfg, inet_diag and tcp_diag. Every refusal is a
:class:`~bbrlab.core.errors.ValidationError` for the field ``kernel`` naming the kernel and the fault.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import bbrlab.kernel.debian as debian
from bbrlab.core.cachefiles import sha256_file
from bbrlab.core.errors import BbrlabError, ValidationError

from .bzimage import NotABzImage, read_bzimage
from .features import FeatureReport, MissingFeatures, check_features

DEFAULT_KERNEL = "debian-6.1"
KERNEL_NAMES = (DEFAULT_KERNEL, *debian.SUITE_KERNELS)
ALLOWED = (f"one of {', '.join(KERNEL_NAMES)}, or a path to a kernel directory (bzImage + lib/modules/<release>) "
           "or to a linux-image .deb")
BZIMAGE_PATTERNS = ("bzImage", "vmlinuz", "vmlinuz-*", "boot/vmlinuz-*", "arch/x86/boot/bzImage")
CONFIG_PATTERNS = (".config", "config", "config-{release}", "boot/config-{release}")
MODULE_ROOTS = ("lib/modules", "usr/lib/modules")
BBR2B_DIR = "bbr2b"


@dataclass(frozen=True)
class SenderKernel:
    """What a run records about the sender's kernel (``metadata.kernel``).

    ``origin`` is ``debian`` (then ``package``/``package_version``/``suite`` name the Debian
    package) or ``user`` (then ``path`` is the directory or .deb given). ``sha256`` is always the
    kernel image's (the bzImage / vmlinuz), so two records with the same value ran the same kernel.
    """

    name: str
    release: str
    origin: str
    sha256: str
    package: str | None = None
    package_version: str | None = None
    suite: str | None = None
    path: str | None = None

    def to_dict(self) -> dict:
        """The kernel as a run records it (``metadata.kernel``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SenderKernel:
        """Read ``metadata.kernel`` back (absent fields as None)."""
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})

    @property
    def label(self) -> str:
        """A human label: the Debian package and version, or the user's path with release and a short sha256.
        """
        if self.origin == "debian":
            return f"{self.name} ({self.package} {self.package_version})"
        return f"{self.path} ({self.release}, sha256 {self.sha256[:12]})"


@dataclass(frozen=True)
class KernelOrigin:
    """``metadata.kernel`` of a testbed that does not name the sender's kernel (a lab's, the host-netns one):
    only where it came from, the testbed's kind. Its ``name`` is None (unknown). A record's ``kernel`` with
    more keys is no KernelOrigin (``extra``: forbid, for :mod:`bbrlab.core.recordjson`)."""

    __pydantic_config__: ClassVar[dict] = {"extra": "forbid"}
    origin: str
    name: ClassVar[None] = None


@dataclass(frozen=True)
class KernelFiles:
    """Where a resolved kernel's parts are on this machine."""

    bzimage: Path
    modules_dir: Path | None = None  # .../lib/modules/<release>; None: all built in, or inside the image
    config: Path | None = None
    initrd: Path | None = None  # only the image's own kernel brings one (Debian's initramfs)
    headers_dir: Path | None = None  # build headers for out-of-tree modules, when known now
    source: Path | None = None  # tcp_bbr.c / kernel tree / source tarball, when known now
    bbr2b_dir: Path | None = None  # a prebuilt bbr2b module (build.json + .ko)


@dataclass(frozen=True)
class ResolvedKernel:
    """A kernel spec resolved and checked: what runs record, where its files are, and what it supports."""

    kernel: SenderKernel
    files: KernelFiles
    features: FeatureReport = field(repr=False)


def _refuse(spec: object, why: str) -> ValidationError:
    return ValidationError("kernel", spec, ALLOWED, why)


def resolve(spec: str | Path = DEFAULT_KERNEL, *, image_kernel: Callable[[], ResolvedKernel] | None = None,
            progress: Callable[[str], None] = lambda s: None) -> ResolvedKernel:
    """Resolve and check the kernel ``spec`` (see the module docstring); nothing boots here.

    ``image_kernel`` resolves ``debian-6.1`` (the guest image's kernel: only the testbed knows
    where its image is); without it that name is refused.
    """
    if not isinstance(spec, (str, Path)) or not str(spec).strip():
        raise _refuse(spec, "empty")
    text = str(spec)
    if text == DEFAULT_KERNEL:
        if image_kernel is None:
            raise BbrlabError(f"kernel {DEFAULT_KERNEL} is the guest image's own kernel: resolve it through "
                              "bbrlab.testbed (resolve_sender_kernel)")
        return image_kernel()
    if text in debian.SUITE_KERNELS:
        return _debian_kernel(text, progress)
    if "/" not in text and not text.endswith(".deb") and not Path(text).exists():
        raise _refuse(spec, "not a known kernel name, and no such file or directory")
    return _user_kernel(Path(text).expanduser().resolve(), text, progress)


def image_kernel(vmlinuz: Path, initrd: Path, package: str, version: str, headers_dir: Path,
                 source: Path) -> ResolvedKernel:
    """The guest image's own kernel (``debian-6.1``): checked with its headers' ``.config``."""
    release = read_bzimage(vmlinuz).release
    config = headers_dir / ".config"
    features = check_features(release, None, config if config.is_file() else None, modules_elsewhere=True)
    kernel = SenderKernel(DEFAULT_KERNEL, release, "debian", sha256_file(vmlinuz), package, version, "bookworm")
    return ResolvedKernel(kernel, KernelFiles(vmlinuz, None, config, initrd, headers_dir, source), features.require())


# -- Debian suite kernels -------------------------------------------------------------------------
def _debian_kernel(name: str, progress: Callable[[str], None]) -> ResolvedKernel:
    kset = debian.resolve_kernel_set(name)
    progress(f"kernel {name}: {kset.image.name} {kset.image.version} ({kset.suite})")
    deb = debian.download(kset.image)
    root = debian.unpack(deb, kset.image.key)
    files = _layout(root, name)
    release = read_bzimage(files.bzimage).release
    if release != kset.release:
        raise debian.DebianError(f"{deb} holds kernel {release}, its package name says {kset.release}")
    features = check_features(name, files.modules_dir, files.config).require()
    kernel = SenderKernel(name, release, "debian", sha256_file(files.bzimage), kset.image.name,
                          kset.image.version, kset.suite)
    return ResolvedKernel(kernel, files, features)


# -- a user's kernel ------------------------------------------------------------------------------
def _user_kernel(path: Path, spec: str, progress: Callable[[str], None]) -> ResolvedKernel:
    if not path.exists():
        raise _refuse(spec, f"{path} does not exist")
    root = path
    if path.is_file():
        if not path.name.endswith(".deb"):
            raise _refuse(spec, f"{path} is a file but not a .deb: give the directory that holds the bzImage")
        try:
            fields = debian.deb_fields(path)
        except debian.DebianError as e:
            raise _refuse(spec, str(e)) from e
        if not fields.get("Package", "").startswith("linux-image-"):
            raise _refuse(spec, f"{path} is package {fields.get('Package')!r}, not a linux-image-* kernel package")
        progress(f"kernel {path.name}: unpacking {fields['Package']} {fields.get('Version')}")
        root = debian.unpack(path, f"user-{debian.file_key(path)}")
    files = _layout(root, spec)
    try:
        release = read_bzimage(files.bzimage).release
        features = check_features(str(path), files.modules_dir, files.config).require()
    except (NotABzImage, MissingFeatures) as e:
        raise _refuse(spec, str(e)) from e
    kernel = SenderKernel(path.name, release, "user", sha256_file(files.bzimage), path=str(path))
    return ResolvedKernel(kernel, files, features)


def _one_match(root: Path, patterns: tuple[str, ...], what: str, spec: str, required: bool) -> Path | None:
    found = sorted({p.resolve() for pat in patterns for p in root.glob(pat) if p.is_file()})
    if len(found) > 1:
        raise _refuse(spec, f"{root} holds more than one {what}: {', '.join(str(p) for p in found)}")
    if not found:
        if required:
            raise _refuse(spec, f"{root} holds no {what} (looked for {', '.join(patterns)})")
        return None
    return found[0]


def _layout(root: Path, spec: str) -> KernelFiles:
    """Find the kernel image, modules tree, .config and bbr2b of a kernel directory."""
    bzimage = _one_match(root, BZIMAGE_PATTERNS, "kernel image", spec, required=True)
    assert bzimage is not None
    try:
        release = read_bzimage(bzimage).release
    except NotABzImage as e:
        raise _refuse(spec, str(e)) from e
    modules_dir = None
    others: list[str] = []
    for base in MODULE_ROOTS:
        candidate = root / base / release
        if candidate.is_dir():
            modules_dir = candidate
            break
        if (root / base).is_dir():
            others += [p.name for p in (root / base).iterdir() if p.is_dir()]
    if modules_dir is None and others:
        raise _refuse(spec, f"{root} has modules for {', '.join(sorted(others))} but the kernel image is {release}")
    config = _one_match(root, tuple(p.format(release=release) for p in CONFIG_PATTERNS), ".config", spec,
                        required=False)
    bbr2b = root / BBR2B_DIR
    return KernelFiles(bzimage, modules_dir, config, bbr2b_dir=bbr2b if (bbr2b / "build.json").is_file() else None)
