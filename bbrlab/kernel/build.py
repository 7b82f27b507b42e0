"""Patch the kernel's own ``tcp_bbr.c`` and build it as an out-of-tree module.

The module registers under the congestion-control name the patch gives it (``.name = "bbr2b"``),
so stock ``bbr`` and the patched algorithm run side by side on one kernel. The module file is
``<name>.ko`` (so its sysfs directory is ``/sys/module/<name>/``); it carries the SHA-256 of the
patch and of the pristine source as ``modinfo`` fields ``bbrlab_patch_sha256`` and
``bbrlab_source_sha256``, and a ``version`` so the kernel computes a ``srcversion``.

Any patch a researcher writes goes through the same path: :func:`build_module` with a different
``patch_path`` (a unified diff of ``net/ipv4/tcp_bbr.c``, ``-p1`` paths, with a ``SOURCE.sha256``
next to it or an explicit ``expected_sha256``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bbrlab.core import cachefiles, resources
from bbrlab.core.cachefiles import cache_dir, sha256_file
from bbrlab.core.errors import BbrlabError
from bbrlab.core.hosts import LocalHost
from bbrlab.core.signals import interruptible

from .source import (
    DEFAULT_SOURCE,
    SOURCE_MEMBER,
    check_sha256,
    prepare_source,
    read_expected_sha256,
    read_expected_sha256s,
)

#: The ``kernels/`` folder (patches, hashes, the Kbuild template), in a checkout or an installed package.
KERNELS_DIR = resources.kernels_dir()
#: The inflight-deficit patch for mainline BBRv1 (Linux 6.1).
DEFAULT_PATCH = KERNELS_DIR / "bbr1" / "inflight-deficit.patch"
KBUILD_TEMPLATE = KERNELS_DIR / "Kbuild.in"
#: Bump when the build steps change in a way the cache key below does not show.
BUILD_RECIPE_VERSION = 1
_CA_NAME = re.compile(r"^[a-z][a-z0-9_]{0,14}$")  # TCP_CA_NAME_MAX is 16 with the NUL
_OPS_NAME = re.compile(r'\.name\s*=\s*"([^"]*)"')


class BuildError(BbrlabError):
    """Patching or compiling a module failed."""


@dataclass(frozen=True)
class ModuleBuild:
    """Everything that determines one module build (inputs, all verified)."""

    patch_path: Path
    patch_sha256: str
    source_path: Path
    source_sha256: str
    headers_dir: Path
    kernel_release: str
    make_args: tuple[str, ...] = ()  # see make_overrides()
    fuzz: int = 0  # patch(1) fuzz allowed; 0 unless a patch is known to need context slack

    def cache_key(self) -> str:
        """Hash of the inputs: same key, same module. Headers count through their Module.symvers."""
        symvers = self.headers_dir / "Module.symvers"
        symvers_sha = hashlib.sha256(symvers.read_bytes()).hexdigest() if symvers.is_file() else "-"
        text = "|".join([str(BUILD_RECIPE_VERSION), self.patch_sha256, self.source_sha256,
                         self.kernel_release, symvers_sha, hashlib.sha256(KBUILD_TEMPLATE.read_bytes()).hexdigest(),
                         *self.make_args, *([f"fuzz={self.fuzz}"] if self.fuzz else [])])
        return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class BuiltModule:
    """A built ``.ko`` and its identity."""

    ko_path: Path
    name: str
    srcversion: str
    vermagic: str
    patch_sha256: str
    source_sha256: str = ""
    kernel_release: str = ""

    @property
    def target_release(self) -> str:
        """The ``uname -r`` this module loads into (first word of vermagic)."""
        return self.vermagic.split()[0] if self.vermagic else ""

    def to_dict(self) -> dict:
        """The fields with ``ko_path`` as a string: what the build folder's ``build.json`` holds (and
        ``bbrlab kernel build`` prints)."""
        d = asdict(self)
        d["ko_path"] = str(self.ko_path)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BuiltModule:
        """The module back from :meth:`to_dict`'s dict (a ``build.json``)."""
        return cls(**{**d, "ko_path": Path(d["ko_path"])})


def headers_release(headers_dir: str | Path) -> str:
    """The kernel release (``uname -r``) the headers at ``headers_dir`` build for."""
    path = Path(headers_dir) / "include" / "generated" / "utsrelease.h"
    if not path.is_file():
        raise BuildError(f"{headers_dir} is not a kernel headers/build directory (no {path.name}); "
                         f"install linux-headers-<release> for the target kernel")
    m = re.search(r'UTS_RELEASE\s+"([^"]+)"', path.read_text())
    if not m:
        raise BuildError(f"{path}: no UTS_RELEASE")
    return m.group(1)


def default_headers_dir(release: str) -> Path:
    """Where Debian installs the build headers for ``release``."""
    return Path("/usr/src") / f"linux-headers-{release}"


def installed_headers() -> list[Path]:
    """Kernel build-header directories installed under /usr/src, oldest release first."""
    found = [p for p in Path("/usr/src").glob("linux-headers-*")
             if (p / "include" / "generated" / "utsrelease.h").is_file() and (p / "Makefile").is_file()]
    return sorted(found)


def patch_targets(patch_text: str) -> list[str]:
    """Files a unified diff changes (``+++ b/...`` paths with the first component stripped)."""
    targets = []
    for line in patch_text.splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].strip()
            targets.append(path.split("/", 1)[1] if "/" in path else path)
    return targets


def check_patch(patch_path: Path) -> str:
    """Read a patch and make sure it changes exactly ``net/ipv4/tcp_bbr.c``; return its text."""
    if not patch_path.is_file():
        raise BbrlabError(f"patch = {str(patch_path)!r} is not allowed: an existing unified diff of {SOURCE_MEMBER}")
    text = patch_path.read_text()
    targets = patch_targets(text)
    if targets != [SOURCE_MEMBER]:
        raise BbrlabError(f"patch = {str(patch_path)!r} is not allowed: it must change exactly {SOURCE_MEMBER} "
                          f"(paths a/{SOURCE_MEMBER}, b/{SOURCE_MEMBER}); it changes {targets or 'nothing'}")
    return text


def ca_name(source_text: str) -> str:
    """The congestion-control name a (patched) ``tcp_bbr.c`` registers: its ops' ``.name``."""
    names = _OPS_NAME.findall(source_text)
    if len(names) != 1:
        raise BuildError(f"expected exactly one '.name = \"...\"' in the patched source, found {names}")
    name = names[0]
    if name == "bbr":
        raise BuildError('the patched source still registers .name = "bbr": a patched module needs its own '
                         'name (e.g. "bbr2b") so it can run beside stock bbr')
    if not _CA_NAME.match(name):
        raise BuildError(f'.name = "{name}" is not allowed: 1-15 characters, a-z, 0-9 and _, starting with a letter')
    return name


def expected_sha256_for(patch_path: Path, expected_sha256: str | None) -> str:
    """The source hash a patch declares: given explicitly, or in ``SOURCE.sha256`` beside it."""
    if expected_sha256:
        return check_sha256(expected_sha256)
    sidecar = patch_path.parent / "SOURCE.sha256"
    if not sidecar.is_file():
        raise BbrlabError(f"no SOURCE.sha256 beside {patch_path}: give the SHA-256 of the {SOURCE_MEMBER} the "
                          f"patch was written for (--sha256) or put it in {sidecar}")
    return read_expected_sha256(sidecar)


def expected_sha256s_for(patch_path: Path, expected_sha256: str | None) -> tuple[str, ...]:
    """Every source hash a patch accepts: the one given, else all lines of its ``SOURCE.sha256``."""
    if expected_sha256:
        return (check_sha256(expected_sha256),)
    expected_sha256_for(patch_path, None)  # the same message when the sidecar is missing
    return read_expected_sha256s(patch_path.parent / "SOURCE.sha256")


def make_overrides(headers_dir: Path) -> tuple[str, ...]:
    """``make`` variables that let this machine build against ``headers_dir``.

    A distribution's headers name the compiler the kernel was built with (``CONFIG_CC_VERSION_TEXT``,
    e.g. bullseye's ``gcc-10``); when that is not installed here, the default ``gcc`` builds the
    module (vermagic does not record the compiler). Headers whose kernel generates BTF for modules
    call ``pahole``; without it the module is built without BTF (BPF introspection only).
    """
    config = headers_dir / ".config"
    text = config.read_text(errors="replace") if config.is_file() else ""
    out = []
    m = re.search(r'^CONFIG_CC_VERSION_TEXT="(\S+)', text, re.M)
    if m and shutil.which(m.group(1)) is None:
        out.append("CC=gcc")
    if re.search(r"^CONFIG_DEBUG_INFO_BTF_MODULES=y", text, re.M) and shutil.which("pahole") is None:
        out.append("CONFIG_DEBUG_INFO_BTF_MODULES=")
    return tuple(out)


def plan_build(patch_path: str | Path = DEFAULT_PATCH, headers_dir: str | Path | None = None, *,
               source: str | Path = DEFAULT_SOURCE, expected_sha256: str | None = None,
               release: str | None = None, fuzz: int = 0) -> ModuleBuild:
    """Check every input (patch, headers, source hash) and return the build they define.

    ``fuzz`` > 0 lets the patch apply with that much context slack (GNU patch ``--fuzz``); the
    value is part of the build's identity.
    """
    if isinstance(fuzz, bool) or not isinstance(fuzz, int) or not 0 <= fuzz <= 2:
        raise BbrlabError(f"fuzz = {fuzz!r} is not allowed: 0, 1 or 2")
    patch = Path(patch_path).expanduser().resolve()
    check_patch(patch)
    expected = expected_sha256s_for(patch, expected_sha256)
    if headers_dir:
        headers = Path(headers_dir)
    elif release:
        headers = default_headers_dir(release)
    else:
        found = installed_headers()
        if not found:
            raise BuildError("no kernel headers under /usr/src: install linux-headers-<release> of the target kernel")
        headers = found[-1]
    kernel_release = headers_release(headers)
    if release and release != kernel_release:
        raise BuildError(f"headers {headers} build for {kernel_release}, not for the target's {release}")
    pristine = prepare_source(source, expected)
    return ModuleBuild(patch, hashlib.sha256(patch.read_bytes()).hexdigest(), pristine, sha256_file(pristine),
                       headers.resolve(), kernel_release, make_overrides(headers), fuzz)


def _apply_patch(build: ModuleBuild, tree: Path) -> Path:
    """Copy the pristine file into ``tree`` and apply the patch there (no fuzz unless the build allows it)."""
    target = tree / SOURCE_MEMBER
    target.parent.mkdir(parents=True)
    shutil.copyfile(build.source_path, target)
    res = LocalHost().run(["patch", "-p1", "--batch", f"--fuzz={build.fuzz}", "--no-backup-if-mismatch", "-r", "-",
                           "-d", str(tree), "-i", str(build.patch_path)], check=False, timeout=60)
    if not res.ok:
        raise BuildError(f"patch {build.patch_path} does not apply to {build.source_path}: "
                         f"{(res.stdout + res.stderr).strip()[-800:]}")
    return target


def _ident_source(build: ModuleBuild) -> str:
    return ("// Generated by bbrlab.kernel: identity of this module build.\n"
            "#include <linux/module.h>\n"
            f'MODULE_INFO(bbrlab_patch_sha256, "{build.patch_sha256}");\n'
            f'MODULE_INFO(bbrlab_source_sha256, "{build.source_sha256}");\n'
            f'MODULE_VERSION("bbrlab-{build.patch_sha256[:12]}");\n')


def local_includes(source_text: str) -> list[str]:
    """Headers a source file takes from its own directory (``#include "name.h"``)."""
    return sorted(set(re.findall(r'^\s*#\s*include\s+"([^"/]+\.h)"', source_text, re.M)))


def _copy_local_include(build: ModuleBuild, header: str, src_dir: Path) -> None:
    """BBRv3's tcp_bbr.c includes net/ipv4/tcp_dctcp.h: an out-of-tree build carries such headers along."""
    found = build.source_path.parent / header
    if not found.is_file():
        raise BuildError(f"the patched source includes \"{header}\" from net/ipv4/, which {build.source_path.parent} "
                         f"does not hold: give the kernel tree (not a lone tcp_bbr.c or a tarball) as the source")
    shutil.copyfile(found, src_dir / header)


def modinfo_field(ko_path: Path, field: str) -> str:
    """One ``modinfo -F`` field of a ``.ko`` file (empty if absent)."""
    return LocalHost().output(["modinfo", "-F", field, str(ko_path)], timeout=30)


def _compile(build: ModuleBuild, src_dir: Path) -> Path:
    res = LocalHost().run(["make", "-C", str(build.headers_dir), f"M={src_dir}", *build.make_args, "modules"],
                          check=False, timeout=900)
    if not res.ok:
        raise BuildError(f"building the module against {build.headers_dir} failed:\n"
                         f"{(res.stdout + res.stderr).strip()[-1500:]}")
    kos = list(src_dir.glob("*.ko"))
    if len(kos) != 1:
        raise BuildError(f"expected one .ko in {src_dir}, found {[k.name for k in kos]}")
    return kos[0]


def build_in(build: ModuleBuild, out_dir: str | Path) -> BuiltModule:
    """Patch, write the Kbuild, compile; leave ``<name>.ko`` and ``build.json`` in ``out_dir``.

    The work happens in a temporary folder in ``out_dir``; both files appear whole or not at all. SIGINT,
    SIGTERM and SIGHUP stop the compiler and remove the temporary folder."""
    with interruptible():
        return _build_in(build, Path(out_dir))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _build_in(build: ModuleBuild, out: Path) -> BuiltModule:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp:
        patched = _apply_patch(build, Path(tmp) / "tree")
        name = ca_name(patched.read_text())
        src_dir = Path(tmp) / "module"
        src_dir.mkdir()
        shutil.copyfile(patched, src_dir / f"tcp_{name}.c")
        for header in local_includes(patched.read_text()):
            _copy_local_include(build, header, src_dir)
        (src_dir / "bbrlab_ident.c").write_text(_ident_source(build))
        (src_dir / "Kbuild").write_text(KBUILD_TEMPLATE.read_text().replace("@NAME@", name))
        ko = _compile(build, src_dir)
        final = out / f"{name}.ko"
        shutil.copyfile(ko, Path(tmp) / "copy.ko")  # same file system as out: the rename below is atomic
        os.replace(Path(tmp) / "copy.ko", final)
    built = BuiltModule(final, name, modinfo_field(final, "srcversion"), modinfo_field(final, "vermagic"),
                        build.patch_sha256, build.source_sha256, build.kernel_release)
    if not built.srcversion or built.target_release != build.kernel_release:
        raise BuildError(f"{final}: unexpected identity srcversion={built.srcversion!r} vermagic={built.vermagic!r}")
    _write_atomically(out / "build.json", json.dumps(built.to_dict(), indent=2) + "\n")
    return built


def build_module(patch_path: str | Path = DEFAULT_PATCH, headers_dir: str | Path | None = None,
                 out_dir: str | Path | None = None, *, source: str | Path = DEFAULT_SOURCE,
                 expected_sha256: str | None = None) -> BuiltModule:
    """Build the module a patch defines. ``out_dir=None`` uses (and fills) the cache.

    All inputs are checked first (patch shape, headers, source hash); a wrong source is refused
    before anything is patched or compiled.
    """
    build = plan_build(patch_path, headers_dir, source=source, expected_sha256=expected_sha256)
    if out_dir is not None:
        return build_in(build, out_dir)
    return cached_build(build)


def cached_build(build: ModuleBuild) -> BuiltModule:
    """The module for ``build`` from ``<cache>/modules/<key>/``, built there first if missing."""
    final = cache_dir() / "modules" / build.cache_key()
    record = final / "build.json"
    if record.is_file():
        built = BuiltModule.from_dict(json.loads(record.read_text()))
        if built.ko_path.is_file():
            cachefiles.mark_used(final)
            return built
    with interruptible():
        staging = cachefiles.work_dir(final.parent, final.name)
        try:
            built = build_in(build, staging)
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        built = BuiltModule(final / built.ko_path.name, **{k: v for k, v in built.to_dict().items() if k != "ko_path"})
        _write_atomically(record, json.dumps(built.to_dict(), indent=2) + "\n")
    return built
