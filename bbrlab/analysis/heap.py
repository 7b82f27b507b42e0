"""Give memory that was freed back to the operating system, after a step that allocated and freed much of it.

Reading one large log allocates and frees tens of megabytes of small objects (one row at a time) and Arrow
buffers; glibc's heap and Arrow's memory pool keep such freed memory for reuse, so the process's resident size
stays at its high-water mark and the next step adds to it. Asking both to return what they hold free keeps the
ingest's peak at what it really holds (``make bench``'s memory step prints it). Where the C library is not glibc,
only Arrow's pool is asked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

#: A log of at least this many rows is large enough to give back what reading it freed.
LARGE_ROWS = 50_000


@lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def give_back() -> None:
    """Return the free memory of Arrow's pool and glibc's heap to the operating system."""
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pyarrow is a dependency; nothing held by it then
        pa = None
    if pa is not None:
        pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
