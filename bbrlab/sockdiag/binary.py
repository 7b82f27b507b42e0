"""Building the sockdiag sampler: one C file compiled static, cached by the hash of what it is built from.

``make sampler``, ``bbrlab testbed up`` (the guest image carries it) and every sampled run call
:func:`build`, so an installed package builds it the same way as a checkout. The binary lives in
``${XDG_CACHE_HOME:-~/.cache}/bbrlab/sockdiag/<key>/sockdiag_sampler`` where ``key`` hashes the
source and the compiler flags; a build happens in a temporary folder renamed into place, so a
crash never leaves a half binary that looks finished. The binary's own SHA-256 is what a run
record names (:class:`SamplerBinary`).

Static glibc (``libc.a``) and the kernel's uapi headers come with ``build-essential`` (``libc6-dev``,
``linux-libc-dev``) on Debian.
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

from ..errors import BbrlabError
from ..kernel.source import cache_dir, sha256_file

BINARY_NAME = "sockdiag_sampler"
SOURCE_NAME = "native/sockdiag_sampler.c"
CC = "cc"
CFLAGS = ("-static", "-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11")


class SamplerBuildError(BbrlabError):
    """The sampler's C source could not be compiled."""


@dataclass(frozen=True)
class SamplerBinary:
    """A built sampler: its path here, its SHA-256 and the SHA-256 of the source it came from."""

    path: Path
    sha256: str
    source_sha256: str

    def to_dict(self) -> dict:
        return {**asdict(self), "path": str(self.path)}


def source_text() -> bytes:
    """The C source shipped inside the package."""
    return resources.files("bbrlab").joinpath(SOURCE_NAME).read_bytes()


def source_sha256() -> str:
    return hashlib.sha256(source_text()).hexdigest()


def cache_key(source: bytes | None = None) -> str:
    """Hash of the source and the flags: the same key builds the same program."""
    blob = (source if source is not None else source_text()) + b"\0" + " ".join((CC, *CFLAGS)).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _compile(source: bytes, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="bbrlab-sockdiag-") as tmp:
        src = Path(tmp) / "sockdiag_sampler.c"
        src.write_bytes(source)
        try:
            p = subprocess.run([CC, *CFLAGS, "-o", str(out), str(src)], capture_output=True, text=True, timeout=300)
        except FileNotFoundError as e:
            raise SamplerBuildError(f"no C compiler ({CC}): install build-essential (make setup)") from e
        if p.returncode != 0:
            raise SamplerBuildError(f"compiling the sockdiag sampler failed ({CC} {' '.join(CFLAGS)}):\n"
                                    f"{(p.stderr or p.stdout).strip()[-1500:]}\n(static glibc and the kernel "
                                    "headers come with build-essential: make setup)")


def build(out_dir: str | Path | None = None) -> SamplerBinary:
    """The sampler binary, compiled first when the cache has none for this source and these flags.

    ``out_dir`` builds there instead of the cache (always compiles).
    """
    source = source_text()
    source_sha = hashlib.sha256(source).hexdigest()
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        _compile(source, out / BINARY_NAME)
        return SamplerBinary(out / BINARY_NAME, sha256_file(out / BINARY_NAME), source_sha)
    final = cache_dir() / "sockdiag" / cache_key(source)
    record = final / "build.json"
    if record.is_file() and (final / BINARY_NAME).is_file():
        info = json.loads(record.read_text())
        if info.get("sha256") == sha256_file(final / BINARY_NAME):
            return SamplerBinary(final / BINARY_NAME, info["sha256"], info["source_sha256"])
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        _compile(source, staging / BINARY_NAME)
        built = SamplerBinary(final / BINARY_NAME, sha256_file(staging / BINARY_NAME), source_sha)
        (staging / "build.json").write_text(json.dumps(
            {"sha256": built.sha256, "source_sha256": source_sha, "cc": CC, "cflags": list(CFLAGS)}, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return built


def main() -> None:
    """Build (or find) the sampler, print its path and SHA-256 (``python -m bbrlab.sockdiag``)."""
    built = build()
    print(f"{built.path}\nsha256 {built.sha256}\nsource sha256 {built.source_sha256}")
