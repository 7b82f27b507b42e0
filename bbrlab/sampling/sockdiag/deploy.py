"""Putting a sampler on a sender: copied over SSH when missing or when its SHA-256 differs.

The sender runs ``/usr/local/libexec/bbrlab/<name>`` (``sockdiag_sampler``, ``sockbpf_sampler``).
:func:`ensure_on_host` reads that file's SHA-256 on the host (one command) and copies the locally built
binary only when it is absent or
different: a lab sender gets it on its first sampled run, the local testbed's guest image already
carries it (see :mod:`bbrlab.testbed.local.image`). The copy goes to a private temporary file first
and is renamed into place, so a sampler that is running keeps its own file and a half copy never
runs. A host on this machine (``LocalHost``, ``NetnsHost``) runs the cached build directly.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import asdict, dataclass

from bbrlab.core.errors import BbrlabError
from bbrlab.core.hosts import Host

from .binary import SamplerBinary, build, program

REMOTE_DIR = "/usr/local/libexec/bbrlab"
REMOTE_PATH = f"{REMOTE_DIR}/sockdiag_sampler"


class SamplerDeployError(BbrlabError):
    """The sampler could not be installed on a host, or what is there is not what was built."""


@dataclass(frozen=True)
class Deployed:
    """The sampler on one host: where it is, its SHA-256 as read there, and whether this call copied it."""

    host: str
    kind: str
    path: str
    sha256: str
    source_sha256: str
    copied: bool

    def to_dict(self) -> dict:
        """As a run record names the sampler that ran (``metadata.sampling.binary``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Deployed:
        """The sampler named in a run record."""
        return cls(d["host"], d["kind"], d["path"], d["sha256"], d["source_sha256"], d["copied"])


def remote_path(kind: str = "netlink") -> str:
    """Where a sender keeps the sampler of ``kind``."""
    return f"{REMOTE_DIR}/{program(kind).binary_name}"


def remote_sha256(host: Host, path: str = REMOTE_PATH) -> str | None:
    """SHA-256 of ``path`` on ``host`` (None when it is missing or unreadable)."""
    res = host.run(["sh", "-c", 'sha256sum "$1" 2>/dev/null', "sh", path], check=False, timeout=60)
    words = res.stdout.split()
    return words[0] if res.ok and words else None


#: $1 staged file, $2 final path: make it executable and rename it into place (same directory first, so
#: the rename is atomic and a running sampler keeps its own inode).
_INSTALL = r"""
set -e
dir=$(dirname "$2")
mkdir -p "$dir"
tmp=$(mktemp "$dir/.sampler.XXXXXX")
trap 'rm -f "$tmp" "$1"' EXIT
cat "$1" > "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$2"
"""


def ensure_on_host(host: Host, binary: SamplerBinary | None = None, *, kind: str = "netlink",
                   path: str | None = None) -> Deployed:
    """Make sure ``host`` has the sampler ``binary`` (default: :func:`bbrlab.sampling.sockdiag.build` of ``kind``)
    at ``path`` (default: :func:`remote_path`)."""
    binary = binary or build(kind)
    kind = binary.kind
    path = path or remote_path(kind)
    if host.is_local:
        return Deployed(host.name, kind, str(binary.path), binary.sha256, binary.source_sha256, False)
    if not posixpath.isabs(path):
        raise SamplerDeployError(f"the sampler's path on {host.name} must be absolute, not {path!r}")
    have = remote_sha256(host, path)
    if have == binary.sha256:
        return Deployed(host.name, kind, path, have, binary.source_sha256, False)
    staged = host.output(["mktemp", "/tmp/bbrlab-sockdiag.XXXXXX"], timeout=30)
    try:
        host.put(binary.path, staged)
        host.run(["sh", "-c", _INSTALL, "sh", staged, path], sudo=True, timeout=60)
    finally:
        host.run(["rm", "-f", staged], check=False, timeout=30)
    have = remote_sha256(host, path)
    if have != binary.sha256:
        raise SamplerDeployError(f"after copying the sampler to {host.name}:{shlex.quote(path)} its SHA-256 reads "
                                 f"{have}, not {binary.sha256}")
    return Deployed(host.name, kind, path, have, binary.source_sha256, True)
