"""The pristine kernel source a patch was written for: find it, extract it, prove it is the one.

A patch to ``net/ipv4/tcp_bbr.c`` is only meaningful against the exact file it was written for.
Each patch directory under ``kernels/`` has a ``SOURCE.sha256`` (``<hex>  net/ipv4/tcp_bbr.c``);
:func:`prepare_source` returns the file only if its SHA-256 matches and otherwise refuses with a
message naming the file, the expected and the found hash. The source may be given as

- the ``tcp_bbr.c`` file itself,
- a kernel tree (a directory holding ``net/ipv4/tcp_bbr.c``),
- a tarball such as Debian's ``/usr/src/linux-source-6.1.tar.xz`` (the one member is extracted
  once and cached under ``${XDG_CACHE_HOME:-~/.cache}/bbrlab/sources/``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from bbrlab.core.cachefiles import cache_dir, sha256_file
from bbrlab.core.errors import BbrlabError
from bbrlab.core.hosts import LocalHost

#: The file every patch here targets, relative to a kernel tree.
SOURCE_MEMBER = "net/ipv4/tcp_bbr.c"
#: Debian's source package for the paper's guest kernel.
DEFAULT_SOURCE = Path("/usr/src/linux-source-6.1.tar.xz")
TARBALL_SUFFIXES = (".tar", ".tar.xz", ".tar.gz", ".tgz", ".tar.bz2", ".tar.zst")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class SourceMismatchError(BbrlabError):
    """The kernel source is not the one the patch was written for."""


def read_expected_sha256s(path: str | Path) -> tuple[str, ...]:
    """Every hash in a ``SOURCE.sha256`` file (``sha256sum`` format, one verified source per line).

    A patch that applies unchanged to several kernels' ``tcp_bbr.c`` (e.g. 6.1 and 6.12) lists
    each file it was checked against; any of them is accepted.
    """
    values = []
    for line in Path(path).read_text().splitlines():
        value = line.split()[0].lower() if line.strip() else ""
        if not value:
            continue
        if not _HEX64.match(value):
            raise BbrlabError(f"{path}: expected a SHA-256 (64 hex digits) as first field, found {value!r}")
        values.append(value)
    if not values:
        raise BbrlabError(f"{path}: no SHA-256 in it")
    return tuple(values)


def read_expected_sha256(path: str | Path) -> str:
    """The first hash in a ``SOURCE.sha256`` file (the source the patch was written for)."""
    return read_expected_sha256s(path)[0]


def check_sha256(value: str) -> str:
    """Normalise a hex SHA-256 given by a user; raise if it is not one."""
    v = value.strip().lower()
    if not _HEX64.match(v):
        raise BbrlabError(f"expected_sha256 = {value!r} is not allowed: 64 hexadecimal digits")
    return v


def _is_tarball(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TARBALL_SUFFIXES)


def _extract_member(tarball: Path, member: str) -> Path:
    """Extract ``*/member`` from a kernel source tarball, once; return the cached file."""
    st = tarball.stat()
    key = hashlib.sha256(f"{tarball.resolve()}|{st.st_size}|{st.st_mtime_ns}|{member}".encode()).hexdigest()[:16]
    out_dir = cache_dir() / "sources" / key
    out = out_dir / Path(member).name
    if out.is_file():
        return out
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".extract-") as tmp:
        res = LocalHost().run(["tar", "-xf", str(tarball), "-C", tmp, "--wildcards", "--no-anchored",
                               f"*/{member}"], check=False, timeout=600)
        found = sorted(Path(tmp).rglob(Path(member).name))
        found = [p for p in found if p.as_posix().endswith(member)]
        if not found:
            raise BbrlabError(f"{tarball} holds no */{member} (tar said: {res.stderr.strip()[-300:]})")
        staged = Path(tmp) / "staged"
        staged.mkdir()
        shutil.copyfile(found[0], staged / out.name)
        if not out_dir.exists():  # another process may have finished first: keep its copy
            os.replace(staged, out_dir)
    return out


def locate_source(source: str | Path, member: str = SOURCE_MEMBER) -> Path:
    """The ``tcp_bbr.c`` that ``source`` (file, kernel tree or tarball) stands for."""
    path = Path(source).expanduser()
    if not path.exists():
        raise BbrlabError(f"kernel source {path} does not exist (give tcp_bbr.c, a kernel tree or a "
                          f"source tarball such as {DEFAULT_SOURCE})")
    if path.is_dir():
        candidate = path / member
        if not candidate.is_file():
            raise BbrlabError(f"kernel tree {path} has no {member}")
        return candidate
    if _is_tarball(path):
        return _extract_member(path, member)
    return path


def prepare_source(source_tarball_or_dir: str | Path, expected_sha256: str | tuple[str, ...] | list[str],
                   member: str = SOURCE_MEMBER) -> Path:
    """Return the pristine ``tcp_bbr.c`` if its SHA-256 is (one of) ``expected_sha256``, else refuse.

    Nothing is patched or built before this check passes, so a wrong source never gets further.
    """
    wanted = [expected_sha256] if isinstance(expected_sha256, str) else list(expected_sha256)
    expected = [check_sha256(v) for v in wanted]
    path = locate_source(source_tarball_or_dir, member)
    found = sha256_file(path)
    if found not in expected:
        origin = f" (from {source_tarball_or_dir})" if Path(source_tarball_or_dir) != path else ""
        raise SourceMismatchError(
            f"kernel source {path}{origin} is not the file the patch was written for: "
            f"expected sha256 {' or '.join(expected)}, found {found}. Use the matching kernel source "
            f"(e.g. Debian's linux-source-6.1), or port the patch and update its SOURCE.sha256.")
    return path
