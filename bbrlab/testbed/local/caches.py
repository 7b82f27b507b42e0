"""What bbrlab keeps in ``${XDG_CACHE_HOME:-~/.cache}/bbrlab``, what a running testbed uses of it, and pruning
the kernel caches to a size cap, least recently used first.

The caches that grow with use are the sender-kernel ones: the boot files of each kernel booted
(``boot/<key>/``: initramfs and modules disk, see :mod:`.kernelboot`) and the Debian kernel packages
(``debian/pool/*.deb`` and ``debian/unpacked/<package>/``, see :mod:`bbrlab.kernel.debian`). Each of
those is an *entry*; its last use is its modification time (:func:`bbrlab.core.cachefiles.mark_used`).
:func:`prune` removes entries, oldest use first, until the entries together fit ``max_bytes``, and
never one a testbed uses: named in the state of a local testbed that is not down (its sender's
kernel, initramfs and modules disk), named or held open by a QEMU process running on this machine
(a testbed recorded under another state directory), or the working directory or an argument of any
running process. A symbolic link among the entries is an entry itself: pruning removes the link, never
what it points to, and nothing is reached through a link. What it removes is rebuilt or downloaded again
when needed. The guest image (``images/``) is not an entry: an outdated one is removed when the next
image is built (:func:`.image.prune_images`). The Debian pins (``debian/kernels/``) and indexes stay.

The cap is :data:`DEFAULT_MAX_GB` unless ``$BBRLAB_CACHE_MAX_GB`` or ``bbrlab cache prune --max-gb``
says otherwise; a boot-file build prunes to it when it adds an entry.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bbrlab.core import cachefiles, owners
from bbrlab.core.errors import ValidationError

from . import image
from .state import state_root

#: The default cap of the kernel caches: about three Debian kernels (packages, unpacked trees, headers,
#: source) with their boot files.
DEFAULT_MAX_GB = 5.0
MAX_GB_ENV = "BBRLAB_CACHE_MAX_GB"
GB = 10**9
#: Entry folders: ``(kind, path below the cache root)``.
ENTRY_FOLDERS = (("boot", "boot"), ("debian-deb", "debian/pool"), ("debian-unpacked", "debian/unpacked"))


def check_max_gb(value: object, field_name: str = "max_gb") -> float:
    """``value`` as a number of GB (decimal), refused unless finite and 0 or more."""
    try:
        gb = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        gb = math.nan
    if isinstance(value, bool) or not math.isfinite(gb) or gb < 0:
        raise ValidationError(field_name, value, "a number of GB, 0 or more (e.g. 5 or 0.5)")
    return gb


def default_max_bytes() -> int:
    """The cap: ``$BBRLAB_CACHE_MAX_GB`` GB when set, else :data:`DEFAULT_MAX_GB`."""
    text = os.environ.get(MAX_GB_ENV, "").strip()
    return int(check_max_gb(text, MAX_GB_ENV) * GB) if text else int(DEFAULT_MAX_GB * GB)


@dataclass(frozen=True)
class Entry:
    """One prunable cache entry."""

    path: Path
    kind: str
    size_bytes: int
    last_used: float  # seconds since the epoch
    in_use: bool

    def to_dict(self) -> dict:
        """The entry as JSON types (``path`` as a string), as ``bbrlab cache show --json`` and
        :meth:`PruneReport.to_dict` give it."""
        return {**asdict(self), "path": str(self.path)}


@dataclass
class PruneReport:
    """What :func:`prune` did (or, with ``dry_run``, would do)."""

    max_bytes: int
    before_bytes: int
    after_bytes: int
    removed: list[Entry] = field(default_factory=list)
    kept_in_use: list[Entry] = field(default_factory=list)
    swept: list[Path] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict:
        """The report as JSON types (paths as strings): what ``bbrlab cache prune --json`` prints."""
        return {"max_bytes": self.max_bytes, "before_bytes": self.before_bytes, "after_bytes": self.after_bytes,
                "removed": [e.to_dict() for e in self.removed], "kept_in_use": [e.to_dict() for e in self.kept_in_use],
                "swept": [str(p) for p in self.swept], "dry_run": self.dry_run}


def disk_bytes(path: Path) -> int:
    """Bytes ``path`` takes on disk (allocated blocks: a sparse disk image counts what it holds)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return 0
    total = st.st_blocks * 512
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except FileNotFoundError:
                    pass
    return total


def entry_of(path: str | Path, root: Path | None = None) -> Path | None:
    """The entry a file belongs to (``boot/<key>``, ``debian/pool/<deb>``, ``debian/unpacked/<key>``), or None."""
    root = (root or image.cache_dir()).resolve()
    try:
        rel = Path(os.path.realpath(path)).relative_to(root)
    except ValueError:
        return None
    parts = rel.parts
    if len(parts) >= 2 and parts[0] == "boot":
        return root / "boot" / parts[1]
    if len(parts) >= 3 and parts[0] == "debian" and parts[1] in ("pool", "unpacked"):
        return root / "debian" / parts[1] / parts[2]
    return None


def _state_paths() -> set[str]:
    """Files named by local testbeds that are not down: the sender's boot files and the image."""
    out: set[str] = set()
    for path in state_root().glob("*/state.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("phase") == "down":
            continue
        boot = data.get("sender_boot") or {}
        out.update(str(v) for v in boot.values() if v)
        if data.get("image"):
            out.add(str(data["image"]))
    return out


def _qemu_paths() -> set[str]:
    """Absolute paths running QEMU processes name on their command line (``-kernel X``, ``-drive file=X,...``)
    or hold open."""
    out: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not argv or b"qemu-system" not in argv[0]:
                continue
            for arg in argv:
                for part in os.fsdecode(arg).split(","):
                    text = part.removeprefix("file=")
                    if text.startswith("/"):
                        out.add(text)
            for fd in os.listdir(f"/proc/{entry}/fd"):
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
                if target.startswith("/"):
                    out.add(target)
        except OSError:
            continue  # gone meanwhile
    return out


def in_use(root: Path | None = None) -> set[Path]:
    """The entries a running testbed uses (see the module docstring)."""
    root = root or image.cache_dir()
    found = {entry_of(p, root) for p in _state_paths() | _qemu_paths()}
    return {e for e in found if e is not None}


def entries(root: Path | None = None) -> list[Entry]:
    """Every prunable entry, least recently used first. An entry is the name in its folder, never what a symbolic
    link there points to (pruning it removes the link), and an entry folder that is a link is left out."""
    root = (root or image.cache_dir()).resolve()
    used = in_use(root)
    out = []
    for kind, rel in ENTRY_FOLDERS:
        folder = root / rel
        if not _real_folder(root, folder):
            continue
        for path in folder.iterdir():
            if path.name.startswith("."):
                continue  # a build in progress (or a stale one, for the sweep)
            try:
                last = path.lstat().st_mtime
            except FileNotFoundError:
                continue
            busy = path in used or bool(owners.users_of(path))
            out.append(Entry(path, kind, disk_bytes(path), last, busy))
    return sorted(out, key=lambda e: (e.last_used, str(e.path)))


def _real_folder(root: Path, folder: Path) -> bool:
    """True when ``folder`` (below ``root``) is a folder reached through no symbolic link."""
    here = root
    for part in folder.relative_to(root).parts:
        here = here / part
        if here.is_symlink() or not here.is_dir():
            return False
    return True


def prune(max_bytes: int | None = None, *, keep: Iterable[str | Path] = (), dry_run: bool = False,
          root: Path | None = None) -> PruneReport:
    """Sweep stale work folders, then remove entries, least recently used first, until the entries fit
    ``max_bytes`` (default :func:`default_max_bytes`); never an entry in use or in ``keep`` (entries, or
    files inside them). Holds the image lock."""
    from ..lock import image_lock

    root = (root or image.cache_dir()).resolve()
    cap = default_max_bytes() if max_bytes is None else max_bytes
    keep_entries = {entry_of(p, root) or Path(p).resolve() for p in keep}
    with image_lock():
        swept = [] if dry_run else image.sweep_stale_builds() + _sweep_kernel_work(root)
        found = entries(root)
        total = sum(e.size_bytes for e in found)
        report = PruneReport(cap, total, total, swept=swept, dry_run=dry_run)
        for e in found:
            if report.after_bytes <= cap:
                break
            if e.in_use or e.path in keep_entries:
                report.kept_in_use.append(e)
                continue
            if not dry_run:
                cachefiles.remove(e.path)
            report.removed.append(e)
            report.after_bytes -= e.size_bytes
    return report


def _sweep_kernel_work(root: Path) -> list[Path]:
    gone = cachefiles.sweep(root / "modules")
    for rel in ("debian/pool", "debian/unpacked", "debian/kernels"):
        gone += cachefiles.sweep(root / rel)
    for suite in sorted((root / "debian" / "dists").glob("*")):
        gone += cachefiles.sweep(suite)
    return gone


def summary(root: Path | None = None) -> dict:
    """Each folder of the cache: bytes on disk and number of items; the prunable entries; the cap."""
    root = root or image.cache_dir()
    folders = {}
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if path.is_dir() and not path.is_symlink():
                folders[path.name] = {"bytes": disk_bytes(path), "items": sum(1 for _ in path.iterdir())}
    return {"root": str(root), "folders": folders, "entries": [e.to_dict() for e in entries(root)],
            "max_bytes": default_max_bytes(), "free_bytes": shutil.disk_usage(root).free if root.is_dir() else None}
