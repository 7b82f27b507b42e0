"""Building the samplers: small C programs compiled static, cached by the hash of what they are built from.

Two programs, both in ``bbrlab/sampling/native/``:

- ``netlink``: ``sockdiag_sampler.c``, a persistent NETLINK_SOCK_DIAG client (``cc -static``);
- ``bpf``: ``sockbpf_sampler.bpf.c`` compiled for BPF by clang, embedded by ``bpftool gen skeleton``
  into the loader ``sockbpf_sampler.c``, linked static against libbpf (and libelf, zlib, zstd).

Both include ``sampler_common.h`` (what the two programs share: their common options, signals, clocks,
output), which is among the sources of each: it is hashed into both cache keys and ``source_sha256``.

``make sampler``, the local guest image's recipe and every sampled run call :func:`build`, so an
installed package builds them the same way as a checkout. A binary lives in
``${XDG_CACHE_HOME:-~/.cache}/bbrlab/sockdiag/<key>/<name>`` where ``key`` hashes the sources and the
build commands; a build happens in a temporary folder renamed into place, so a crash never leaves a
half binary that looks finished. The binary's own SHA-256 is what a run record names.

Debian packages: ``build-essential`` (static glibc, kernel uapi headers) for both; ``clang``,
``libbpf-dev``, ``bpftool``, ``libelf-dev``, ``zlib1g-dev``, ``libzstd-dev`` for the BPF sampler
(scripts/install-system-packages installs them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from bbrlab.core.cachefiles import cache_dir, sha256_file
from bbrlab.core.errors import BbrlabError, ValidationError

CC = "cc"
CFLAGS = ("-static", "-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11")
BPF_CFLAGS = ("-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wall", "-Werror",
              "-I/usr/include/x86_64-linux-gnu")
BPF_LIBS = ("-lbpf", "-lelf", "-lz", "-lzstd")
SKELETON_NAME = "sockbpf"


class SamplerBuildError(BbrlabError):
    """A sampler's sources could not be compiled."""


@dataclass(frozen=True)
class Program:
    """One sampler program: its kind, the binary's name and the package files it is built from."""

    kind: str
    binary_name: str
    sources: tuple[str, ...]


#: What both programs include from one place (options, clocks, signals, output; see the file).
COMMON_HEADER = "native/sampler_common.h"
SCHEDULE_HEADER = "native/sampler_schedule.h"  # the netlink samplers' slot schedule
PROGRAMS = {
    "netlink": Program("netlink", "sockdiag_sampler", ("native/sockdiag_sampler.c", COMMON_HEADER, SCHEDULE_HEADER)),
    "bpf": Program("bpf", "sockbpf_sampler", ("native/sockbpf_sampler.bpf.c", "native/sockbpf_sampler.c",
                                              "native/sockbpf_record.h", COMMON_HEADER)),
    "qdisc": Program("qdisc", "qdisc_sampler", ("native/qdisc_sampler.c", COMMON_HEADER, SCHEDULE_HEADER)),
}
#: The socket samplers a flow can name (``flow.sampler``); ``qdisc`` is the emulator's bottleneck sampler.
KINDS = ("netlink", "bpf")


@dataclass(frozen=True)
class SamplerBinary:
    """A built sampler: kind, path here, its SHA-256, and the SHA-256 of its sources (see
    :func:`source_sha256`)."""

    kind: str
    path: Path
    sha256: str
    source_sha256: str

    @property
    def name(self) -> str:
        """The binary's file name (the program's ``binary_name``)."""
        return self.path.name

    def to_dict(self) -> dict:
        """Every field by name, JSON-ready (``path`` as a string)."""
        return {**asdict(self), "path": str(self.path)}


def program(kind: str) -> Program:
    """The :class:`Program` of sampler ``kind`` (one of :data:`PROGRAMS`); :class:`ValidationError` for any
    other kind."""
    if kind not in PROGRAMS:
        raise ValidationError("sampler", kind, f"one of {', '.join(PROGRAMS)}")
    return PROGRAMS[kind]


def sources(kind: str) -> dict[str, bytes]:
    """The sources shipped inside the package, by file name."""
    files = resources.files("bbrlab.sampling")
    return {Path(rel).name: files.joinpath(rel).read_bytes() for rel in program(kind).sources}


def source_sha256(kind: str = "netlink") -> str:
    """SHA-256 of a program's sources: of the file itself for one file, else of ``name\\0content\\0`` of each."""
    srcs = sources(kind)
    if len(srcs) == 1:
        return hashlib.sha256(next(iter(srcs.values()))).hexdigest()
    digest = hashlib.sha256()
    for name, data in srcs.items():
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def _commands(kind: str) -> str:
    if kind in ("netlink", "qdisc"):
        return " ".join((CC, *CFLAGS))
    return " ".join(("clang", *BPF_CFLAGS, "|", "bpftool gen skeleton", SKELETON_NAME, "|", CC, *CFLAGS, *BPF_LIBS))


def cache_key(kind: str = "netlink", srcs: dict[str, bytes] | None = None) -> str:
    """Hash of the sources and the build commands: the same key builds the same program."""
    digest = hashlib.sha256(kind.encode() + b"\0" + _commands(kind).encode())
    for name, data in sorted((srcs if srcs is not None else sources(kind)).items()):
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def _run(argv: list[str], what: str, cwd: Path, stdout=None) -> None:
    try:
        p = subprocess.run(argv, cwd=cwd, stdout=stdout if stdout is not None else subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=600)
    except FileNotFoundError as e:
        raise SamplerBuildError(f"{what}: {argv[0]} is not installed (make setup installs the sampler's "
                                "toolchain)") from e
    if p.returncode != 0:
        tail = (p.stderr or (p.stdout if stdout is None else "") or "").strip()[-1500:]
        raise SamplerBuildError(f"{what} failed ({' '.join(argv[:6])} ...):\n{tail}")


def _compile(kind: str, srcs: dict[str, bytes], out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="bbrlab-sampler-") as tmp:
        work = Path(tmp)
        for name, data in srcs.items():
            (work / name).write_bytes(data)
        if kind in ("netlink", "qdisc"):
            name = "sockdiag" if kind == "netlink" else "qdisc"
            _run([CC, *CFLAGS, "-o", str(out), f"{name}_sampler.c"], f"compiling the {name} sampler", work)
            return
        _run(["clang", *BPF_CFLAGS, "-I.", "-c", "sockbpf_sampler.bpf.c", "-o", "sockbpf_sampler.bpf.o"],
             "compiling the BPF program", work)
        with open(work / f"{SKELETON_NAME}.skel.h", "w") as skel:
            _run(["bpftool", "gen", "skeleton", "sockbpf_sampler.bpf.o", "name", SKELETON_NAME],
                 "generating the BPF skeleton", work, stdout=skel)
        _run([CC, *CFLAGS, "-I.", "-o", str(out), "sockbpf_sampler.c", *BPF_LIBS], "compiling the BPF loader", work)


def build(kind: str = "netlink", out_dir: str | Path | None = None) -> SamplerBinary:
    """The sampler binary of ``kind`` (netlink or bpf), compiled first when the cache has none for these
    sources and commands. ``out_dir`` builds there instead of the cache (always compiles)."""
    prog = program(kind)
    srcs = sources(kind)
    source_sha = source_sha256(kind)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        _compile(kind, srcs, out / prog.binary_name)
        return SamplerBinary(kind, out / prog.binary_name, sha256_file(out / prog.binary_name), source_sha)
    final = cache_dir() / "sockdiag" / cache_key(kind, srcs)
    binary, record = final / prog.binary_name, final / "build.json"
    if record.is_file() and binary.is_file():
        info = json.loads(record.read_text())
        if info.get("sha256") == sha256_file(binary):
            return SamplerBinary(kind, binary, info["sha256"], info["source_sha256"])
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        _compile(kind, srcs, staging / prog.binary_name)
        built = SamplerBinary(kind, binary, sha256_file(staging / prog.binary_name), source_sha)
        (staging / "build.json").write_text(json.dumps(
            {"kind": kind, "sha256": built.sha256, "source_sha256": source_sha, "commands": _commands(kind)},
            indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return built


def main() -> None:
    """Build (or find) both samplers, print their paths and SHA-256 (``python -m bbrlab.sampling.sockdiag``)."""
    for kind in PROGRAMS:
        built = build(kind)
        print(f"{kind}: {built.path}\n  sha256 {built.sha256}\n  source sha256 {built.source_sha256}")
