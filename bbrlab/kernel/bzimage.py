"""Read an x86 kernel image (bzImage / Debian's vmlinuz) without booting it.

The real-mode header of a bzImage (Documentation/arch/x86/boot.rst) starts at offset 0x1F1:
the boot-sector signature ``0xAA55`` at 0x1FE, the magic ``HdrS`` at 0x202, the boot protocol
version at 0x206, and at 0x20E a pointer (relative to 0x200) to a NUL-terminated string such as
``5.10.0-32-amd64 (debian-kernel@lists.debian.org) #1 SMP Debian 5.10.223-1 (2024-08-10)``.
Its first word is the release ``uname -r`` will print.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core.errors import BbrlabError

HEADER_MAGIC = b"HdrS"
BOOT_FLAG = 0xAA55
MIN_PROTOCOL = 0x0200  # 2.00: the first protocol with a kernel_version pointer is 2.00
SETUP_START = 0x200


class NotABzImage(BbrlabError):
    """The file is not an x86 bzImage."""


@dataclass(frozen=True)
class BzImage:
    """What the header of a bzImage says."""

    path: Path
    protocol: str  # "2.15"
    version_string: str

    @property
    def release(self) -> str:
        """The kernel release, the first word of the header's version string (e.g. ``6.1.0-56-amd64``)."""
        return self.version_string.split()[0]


def read_bzimage(path: str | Path) -> BzImage:
    """Parse ``path``'s setup header; raise :class:`NotABzImage` naming the file and what is wrong."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(0x10000)
    except OSError as e:
        raise NotABzImage(f"{path}: cannot read it ({e.strerror})") from e
    if len(head) < 0x210:
        raise NotABzImage(f"{path} is not a bzImage: only {len(head)} bytes")
    (flag,) = struct.unpack_from("<H", head, 0x1FE)
    if flag != BOOT_FLAG or head[0x202:0x206] != HEADER_MAGIC:
        raise NotABzImage(f"{path} is not a bzImage: no x86 boot header (0xAA55 at 0x1FE, 'HdrS' at 0x202)")
    (protocol,) = struct.unpack_from("<H", head, 0x206)
    if protocol < MIN_PROTOCOL:
        raise NotABzImage(f"{path}: boot protocol {protocol >> 8}.{protocol & 0xFF:02d} is too old")
    (pointer,) = struct.unpack_from("<H", head, 0x20E)
    start = SETUP_START + pointer
    end = head.find(b"\0", start)
    if pointer == 0 or end < 0 or end - start < 3:
        raise NotABzImage(f"{path}: the header's kernel version pointer (0x20E) leads to no version string")
    text = head[start:end].decode("ascii", "replace").strip()
    if not text or not text[0].isdigit():
        raise NotABzImage(f"{path}: the header's version string {text[:60]!r} does not start with a release")
    return BzImage(path, f"{protocol >> 8}.{protocol & 0xFF:02d}", text)
