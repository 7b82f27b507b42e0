"""``bbr2b`` for a given sender kernel: which patch, which headers, or why not.

A patch is only applied to the exact ``tcp_bbr.c`` it was checked against (``SOURCE.sha256``
beside it). For a kernel, :func:`plan_bbr2b` finds that file and the build headers, then picks
the patch directory under ``kernels/`` whose ``SOURCE.sha256`` lists the file's hash:

=================  ==============================================  ==================================
kernel             source and headers                               patch
=================  ==============================================  ==================================
``debian-6.1``     ``/usr/src/linux-source-6.1.tar.xz``,            ``kernels/bbr1`` (written for it)
                   ``/usr/src/linux-headers-<release>``
``debian-6.12``    ``linux-source-6.12`` and the headers packages   ``kernels/bbr1`` (applies unchanged)
                   of the same version, from the mirror
``debian-5.10``    ``linux-source-5.10`` ... from the mirror        ``kernels/bbr1-5.10`` (ported)
a user kernel      a prebuilt ``bbr2b/`` beside its bzImage          (``bbrlab kernel build-tree``)
=================  ==============================================  ==================================

A kernel for which none of this holds is refused with a :class:`Bbr2bUnavailable` that says why;
:func:`check_bbr2b` is the call to make before a campaign starts (it downloads and checks, it
does not compile).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bbrlab.kernel.debian as debian
from bbrlab.core.cachefiles import sha256_file
from bbrlab.core.errors import BbrlabError
from bbrlab.core.hosts import Host

from .build import KERNELS_DIR, BuiltModule, ModuleBuild, cached_build, plan_build
from .remote import load
from .sender import ResolvedKernel
from .source import SOURCE_MEMBER, locate_source, read_expected_sha256s

PATCH_NAME = "inflight-deficit.patch"
MODULE_NAME = "bbr2b"


class Bbr2bUnavailable(BbrlabError):
    """bbr2b cannot be had for this kernel (the message says why and what would help)."""


@dataclass(frozen=True)
class Bbr2bPlan:
    """How ``bbr2b`` comes to a kernel: built here (``build``) or shipped with it (``prebuilt``)."""

    release: str
    build: ModuleBuild | None = None
    prebuilt: BuiltModule | None = None

    @property
    def patch(self) -> str:
        """The patch file the module is built from, or ``prebuilt``."""
        return str(self.build.patch_path) if self.build else "prebuilt"


def patch_dirs() -> list[Path]:
    """The patch directories under ``kernels/``: an inflight-deficit patch with its SOURCE.sha256."""
    return sorted(p.parent for p in KERNELS_DIR.glob(f"*/{PATCH_NAME}") if (p.parent / "SOURCE.sha256").is_file())


def patch_for_source(tcp_bbr_c: Path) -> Path:
    """The patch written for (or verified against) exactly this ``tcp_bbr.c``; refuse otherwise."""
    found = sha256_file(tcp_bbr_c)
    for folder in patch_dirs():
        if found in read_expected_sha256s(folder / "SOURCE.sha256"):
            return folder / PATCH_NAME
    known = ", ".join(p.name for p in patch_dirs())
    raise Bbr2bUnavailable(f"no bbr2b patch was checked against this kernel's {SOURCE_MEMBER} (sha256 {found}); "
                           f"patches exist for the sources listed in kernels/{{{known}}}/SOURCE.sha256. Port "
                           f"kernels/bbr1/{PATCH_NAME} to it and add its hash")


def _sources(resolved: ResolvedKernel, progress: Callable[[str], None]) -> tuple[Path, Path]:
    """``(headers_dir, source)`` of a Debian kernel."""
    files, kernel = resolved.files, resolved.kernel
    if files.headers_dir is not None and files.source is not None:
        return files.headers_dir, files.source
    if kernel.name not in debian.SUITE_KERNELS:
        raise Bbr2bUnavailable(f"kernel {kernel.label}: no build headers and kernel source are known for it")
    kset = debian.resolve_kernel_set(kernel.name)
    progress(f"bbr2b for {kernel.release}: headers and {kset.source.name} {kset.source.version} from {kset.suite}")
    return debian.headers_tree(kset), debian.source_tarball(kset)


def plan_bbr2b(resolved: ResolvedKernel, progress: Callable[[str], None] = lambda s: None) -> Bbr2bPlan:
    """Everything ``bbr2b`` needs for this kernel, checked (no compiling); :class:`Bbr2bUnavailable` if not."""
    kernel = resolved.kernel
    if kernel.origin == "user":
        return Bbr2bPlan(kernel.release, prebuilt=_prebuilt(resolved))
    headers, source = _sources(resolved, progress)
    try:
        tcp_bbr_c = locate_source(source)
        patch = patch_for_source(tcp_bbr_c)
        build = plan_build(patch, headers, source=tcp_bbr_c, release=kernel.release)
    except BbrlabError as e:
        raise Bbr2bUnavailable(f"bbr2b is not available for kernel {kernel.label}: {e}") from e
    return Bbr2bPlan(kernel.release, build=build)


def _prebuilt(resolved: ResolvedKernel) -> BuiltModule:
    kernel, folder = resolved.kernel, resolved.files.bbr2b_dir
    if folder is None:
        raise Bbr2bUnavailable(f"bbr2b is not available for kernel {kernel.label}: it has no prebuilt {MODULE_NAME}/ "
                               f"(build.json and {MODULE_NAME}.ko); `bbrlab kernel build-tree --source <tree>` builds "
                               "a kernel together with its bbr2b")
    built = BuiltModule.from_dict(json.loads((folder / "build.json").read_text()))
    built = BuiltModule(**{**built.__dict__, "ko_path": folder / built.ko_path.name})
    if not built.ko_path.is_file():
        raise Bbr2bUnavailable(f"kernel {kernel.label}: {folder}/build.json names {built.ko_path.name}, which is missing")
    if built.target_release != kernel.release:
        raise Bbr2bUnavailable(f"kernel {kernel.label}: its prebuilt {built.ko_path.name} is for {built.target_release}, "
                               f"the kernel is {kernel.release}")
    return built


def check_bbr2b(resolved: ResolvedKernel, progress: Callable[[str], None] = lambda s: None) -> Bbr2bPlan:
    """The pre-campaign check: returns the plan, or raises :class:`Bbr2bUnavailable` naming the kernel."""
    return plan_bbr2b(resolved, progress)


def build_bbr2b(plan: Bbr2bPlan) -> BuiltModule:
    """The module of ``plan``: the prebuilt one, or built here (cached by its inputs)."""
    if plan.prebuilt is not None:
        return plan.prebuilt
    assert plan.build is not None
    return cached_build(plan.build)


def ensure_bbr2b_for(host: Host, resolved: ResolvedKernel, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Build (cached) and load ``bbr2b`` for the kernel ``host`` runs; return the module identity."""
    return load(host, build_bbr2b(plan_bbr2b(resolved, progress)))
