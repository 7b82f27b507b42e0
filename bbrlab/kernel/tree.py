"""Build a sender kernel and its ``bbr2b`` from a kernel source tree (``bbrlab kernel build-tree``).

The tree is any Linux source a researcher has: a google/bbr checkout (BBRv2 / BBRv3), Debian's
``linux-source-6.1`` unpacked, a mainline release. Nothing is downloaded and the tree is not
written to (the build runs with ``make O=<out>/build``). Steps:

1. check the tree (``Makefile``, ``net/ipv4/tcp_bbr.c``, the x86 defconfig) and the build tools,
   and choose the bbr2b patch for the tree's ``tcp_bbr.c`` (dry run), before compiling anything;
2. configure: ``x86_64_defconfig`` + ``kvm_guest.config`` + ``kernels/sender-kernel.config``
   (virtio, ext4, fw_cfg, inet_diag, tcp_diag, tcp_bbr, fq, netem, tbf, htb, no debug info),
   ``olddefconfig``, then refuse if any line of the fragment did not hold;
3. ``make bzImage modules`` (under ``nice``), ``modules_install`` into ``<out>``;
4. build ``bbr2b`` against the fresh build directory with the chosen patch (the v3 patch for a
   BBRv3 tree; its ``tcp_dctcp.h`` is carried along) into ``<out>/bbr2b/``.

``<out>`` is then a kernel directory ``bbrlab testbed up --kernel <out>`` boots: ``bzImage``,
``config``, ``lib/modules/<release>/``, ``bbr2b/``, and ``kernel.json`` (what was built, from
what, how long it took).

SIGINT, SIGTERM and SIGHUP stop the build: every command it runs leads its own process group, which is
stopped as a whole (make deletes its half-made targets, so ``<out>/build`` can be built on). Once step 3
has begun installing into ``<out>``, an interrupted or failed build removes what it installed there
(``bzImage``, ``config``, ``lib/modules``, ``bbr2b``), so a half-installed kernel never looks bootable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bbrlab.core.cachefiles import sha256_file
from bbrlab.core.errors import BbrlabError
from bbrlab.core.signals import interruptible, run_group

from .bbr2b import PATCH_NAME, Bbr2bUnavailable, patch_for_source
from .build import KERNELS_DIR, BuiltModule, build_in, plan_build
from .bzimage import read_bzimage
from .features import read_config
from .source import SOURCE_MEMBER

FRAGMENT = KERNELS_DIR / "sender-kernel.config"
V3_PATCH = KERNELS_DIR / "bbr3" / PATCH_NAME
BUILD_TOOLS = ("make", "gcc", "ld", "flex", "bison", "bc", "perl", "depmod")
TOOL_PACKAGES = "build-essential flex bison bc libelf-dev libssl-dev kmod"
DEFAULT_LOCALVERSION = "-bbrlab"


class TreeBuildError(BbrlabError):
    """The kernel tree cannot be built into a sender kernel (the message says which step and why)."""


@dataclass(frozen=True)
class Bbr2bChoice:
    """The bbr2b patch a tree gets, and the source hashes it accepts."""

    patch: Path
    expected_sha256: str | None  # None: the patch's own SOURCE.sha256 lists the tree's file
    fuzz: int = 0


@dataclass
class TreeBuild:
    """What ``build-tree`` made (also written to ``<out>/kernel.json``)."""

    source: str
    out: str
    release: str = ""
    tree_bbr_version: int | None = None  # from the tree's tcp_bbr.c text; the running kernel is probed later
    tcp_bbr_sha256: str = ""
    jobs: int = 1
    nice: int = 10
    build_s: float = 0.0
    bbr2b: dict | None = None
    config_fragment: str = str(FRAGMENT)
    steps_s: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The fields as a dict, ``bbr2b`` being the module's
        :meth:`~bbrlab.kernel.build.BuiltModule.to_dict`: what ``<out>/kernel.json`` holds."""
        return asdict(self)


def tree_bbr_version(tcp_bbr_text: str) -> int | None:
    """The BBR version a ``tcp_bbr.c`` declares: Google's trees ``#define BBR_VERSION <n>``; mainline is 1."""
    m = re.search(r"^#define\s+BBR_VERSION\s+(\d+)", tcp_bbr_text, re.M)
    if m:
        return int(m.group(1))
    return 1 if "struct tcp_congestion_ops" in tcp_bbr_text else None


def check_tree(source: Path) -> Path:
    """The tree's ``tcp_bbr.c`` after checking the tree is an x86 kernel source; refuse otherwise."""
    if not source.is_dir():
        raise TreeBuildError(f"--source {source} is not a directory (give an unpacked kernel source tree)")
    for member in ("Makefile", SOURCE_MEMBER, "arch/x86/configs/x86_64_defconfig", "scripts/kconfig/merge_config.sh"):
        if not (source / member).is_file():
            raise TreeBuildError(f"--source {source} is not a Linux source tree: it has no {member}")
    if (source / ".config").exists():
        raise TreeBuildError(f"{source} has a .config (it was configured in place); `make O=...` needs a clean tree: "
                             f"run `make mrproper` in it, or use a fresh copy")
    missing = [t for t in BUILD_TOOLS if shutil.which(t) is None]
    if missing:
        raise TreeBuildError(f"missing build tools {', '.join(missing)}: apt-get install {TOOL_PACKAGES}")
    if not Path("/usr/include/gelf.h").is_file():
        raise TreeBuildError(f"libelf headers are missing (objtool needs them): apt-get install {TOOL_PACKAGES}")
    return source / SOURCE_MEMBER


def choose_bbr2b(tcp_bbr_c: Path, patch: Path | None = None, expected_sha256: str | None = None,
                 fuzz: int = 0) -> Bbr2bChoice:
    """Which patch makes bbr2b for this ``tcp_bbr.c``, checked by a dry run (nothing is built)."""
    if patch is None:
        try:
            patch = patch_for_source(tcp_bbr_c)
        except Bbr2bUnavailable:
            if tree_bbr_version(tcp_bbr_c.read_text()) != 3:
                raise
            patch = V3_PATCH
            if expected_sha256 is None and not _listed(patch, tcp_bbr_c):
                found = sha256_file(tcp_bbr_c)
                raise Bbr2bUnavailable(
                    f"{tcp_bbr_c} is BBRv3 (sha256 {found}), which kernels/bbr3/{PATCH_NAME} has not been checked "
                    f"against: pass --bbr2b-sha256 {found} to build it anyway (recorded), or --no-bbr2b") from None
    choice = Bbr2bChoice(patch.resolve(), expected_sha256, fuzz)
    _dry_run(choice, tcp_bbr_c)
    return choice


def _listed(patch: Path, tcp_bbr_c: Path) -> bool:
    from .source import read_expected_sha256s

    sidecar = patch.parent / "SOURCE.sha256"
    return sidecar.is_file() and sha256_file(tcp_bbr_c) in read_expected_sha256s(sidecar)


def _dry_run(choice: Bbr2bChoice, tcp_bbr_c: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="bbrlab-dry-") as tmp:
        target = Path(tmp) / SOURCE_MEMBER
        target.parent.mkdir(parents=True)
        shutil.copyfile(tcp_bbr_c, target)
        p = subprocess.run(["patch", "-p1", "--dry-run", "--batch", f"--fuzz={choice.fuzz}", "-d", tmp,
                            "-i", str(choice.patch)], capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise Bbr2bUnavailable(f"{choice.patch} does not apply to {tcp_bbr_c} (fuzz {choice.fuzz}): "
                                   f"{(p.stdout + p.stderr).strip()[-600:]}")


def fragment_settings(path: Path = FRAGMENT) -> dict[str, str]:
    """``CONFIG_X -> y|m|n|value`` lines of a config fragment."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def config_mismatches(wanted: dict[str, str], final: dict[str, str]) -> list[str]:
    """Fragment lines the final ``.config`` does not honour (``=n`` means: not set)."""
    bad = []
    for key, value in wanted.items():
        got = final.get(key, "n")
        if value == "n":
            if got not in ("n", ""):
                bad.append(f"{key}=n (got {got})")
        elif got != value.strip('"'):
            bad.append(f"{key}={value} (got {got})")
    return bad


class _Runner:
    """Runs the build's commands with a log file and per-step timings."""

    def __init__(self, log: Path, nice: int, progress: Callable[[str], None]):
        self.log, self.nice, self.progress = log, nice, progress
        self.steps: dict[str, float] = {}

    def __call__(self, step: str, argv: list[str], cwd: Path | None = None, niced: bool = False) -> None:
        self.progress(f"build-tree: {step}")
        t0 = time.monotonic()
        full = (["nice", "-n", str(self.nice)] if niced and self.nice else []) + argv
        with open(self.log, "a") as log:
            log.write(f"\n$ {' '.join(full)}\n")
            log.flush()
            p = run_group(full, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        self.steps[step] = round(time.monotonic() - t0, 1)
        if p.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise TreeBuildError(f"build-tree step '{step}' failed (exit {p.returncode}); log {self.log}:\n{tail}")


def build_tree(source: str | Path, out: str | Path, *, jobs: int | None = None, nice: int = 10,
               localversion: str = DEFAULT_LOCALVERSION, bbr2b: bool = True, bbr2b_patch: str | Path | None = None,
               bbr2b_sha256: str | None = None, bbr2b_fuzz: int = 0,
               progress: Callable[[str], None] = lambda s: None) -> TreeBuild:
    """Build the sender kernel of the tree ``source`` into ``out`` (see the module docstring)."""
    with interruptible():
        return _build_tree(source, out, jobs=jobs, nice=nice, localversion=localversion, bbr2b=bbr2b,
                           bbr2b_patch=bbr2b_patch, bbr2b_sha256=bbr2b_sha256, bbr2b_fuzz=bbr2b_fuzz,
                           progress=progress)


#: What an install into ``<out>`` writes (removed again when the build does not finish).
INSTALLED = ("kernel.json", "bzImage", "config", "lib", "bbr2b")


def _remove_installed(dest: Path) -> None:
    for name in INSTALLED:
        path = dest / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _build_tree(source: str | Path, out: str | Path, *, jobs: int | None, nice: int, localversion: str,
                bbr2b: bool, bbr2b_patch: str | Path | None, bbr2b_sha256: str | None, bbr2b_fuzz: int,
                progress: Callable[[str], None]) -> TreeBuild:
    src = Path(source).expanduser().resolve()
    dest = Path(out).expanduser().resolve()
    jobs = jobs or os.cpu_count() or 1
    if not re.fullmatch(r"[-.a-z0-9]{0,20}", localversion):
        raise TreeBuildError(f"--localversion {localversion!r}: up to 20 of a-z, 0-9, '-' and '.'")
    tcp_bbr_c = check_tree(src)
    choice = choose_bbr2b(tcp_bbr_c, Path(bbr2b_patch) if bbr2b_patch else None, bbr2b_sha256, bbr2b_fuzz) \
        if bbr2b else None
    build_dir = dest / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    result = TreeBuild(str(src), str(dest), tree_bbr_version=tree_bbr_version(tcp_bbr_c.read_text()),
                       tcp_bbr_sha256=sha256_file(tcp_bbr_c), jobs=jobs, nice=nice)
    run = _Runner(dest / "build.log", nice, progress)
    t0 = time.monotonic()
    _configure(run, src, build_dir, localversion)
    run(f"make -j{jobs} bzImage modules (the long step)", ["make", "-C", str(src), f"O={build_dir}", f"-j{jobs}",
                                                           "bzImage", "modules"], niced=True)
    try:
        _install(run, src, build_dir, dest)
        result.release = read_bzimage(dest / "bzImage").release
        if choice is not None:
            result.bbr2b = _build_bbr2b(choice, tcp_bbr_c, build_dir, dest, result.release).to_dict()
        result.build_s = round(time.monotonic() - t0, 1)
        result.steps_s = run.steps
        (dest / "kernel.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    except BaseException:
        _remove_installed(dest)
        raise
    progress(f"build-tree: {result.release} built in {result.build_s:.0f} s -> {dest}")
    return result


def _configure(run: _Runner, src: Path, build_dir: Path, localversion: str) -> None:
    make = ["make", "-C", str(src), f"O={build_dir}"]
    run("x86_64_defconfig + kvm_guest.config", [*make, "x86_64_defconfig", "kvm_guest.config"])
    fragment = build_dir / "bbrlab-sender.config"
    fragment.write_text(FRAGMENT.read_text() + f'CONFIG_LOCALVERSION="{localversion}"\n'
                        "# CONFIG_LOCALVERSION_AUTO is not set\n")
    run("merge kernels/sender-kernel.config", [str(src / "scripts/kconfig/merge_config.sh"), "-m", "-O",
                                                str(build_dir), str(build_dir / ".config"), str(fragment)], cwd=src)
    run("olddefconfig", [*make, "olddefconfig"])
    bad = config_mismatches(fragment_settings(), read_config(build_dir / ".config"))
    if bad:
        raise TreeBuildError(f"the tree's Kconfig does not allow what the sender needs: {', '.join(bad)} "
                             f"(see {FRAGMENT})")


def _install(run: _Runner, src: Path, build_dir: Path, dest: Path) -> None:
    modules = dest / "lib" / "modules"
    if modules.exists():
        shutil.rmtree(modules)  # a previous build's release must not linger beside this one
    run("modules_install", ["make", "-C", str(src), f"O={build_dir}", f"INSTALL_MOD_PATH={dest}",
                            "INSTALL_MOD_STRIP=1", "modules_install"])
    shutil.copyfile(build_dir / "arch/x86/boot/bzImage", dest / "bzImage")
    shutil.copyfile(build_dir / ".config", dest / "config")


def _build_bbr2b(choice: Bbr2bChoice, tcp_bbr_c: Path, build_dir: Path, dest: Path, release: str) -> BuiltModule:
    folder = dest / "bbr2b"
    if folder.exists():
        shutil.rmtree(folder)
    build = plan_build(choice.patch, build_dir, source=tcp_bbr_c, expected_sha256=choice.expected_sha256,
                       release=release, fuzz=choice.fuzz)
    return build_in(build, folder)
