"""Debian kernel packages from the mirror, without touching this machine's apt configuration.

A suite's package list is read the way apt reads it, but into bbrlab's cache: the suite's
``InRelease`` is checked with ``gpgv`` against Debian's archive keyring (refused before anything is
downloaded when the keyring is missing), then its own fields (:func:`check_release`): it must be the
suite asked for, not past its ``Valid-Until``, not dated in the future, and not older than the
``InRelease`` verified here before, so an old signed index replayed by a mirror or a man in the middle
is refused as apt refuses it. The ``Packages.xz`` it names is checked against the SHA-256 listed there,
and every ``.deb`` against the SHA-256 in ``Packages``. Nothing is added to ``/etc/apt``; nothing is
installed with dpkg.

Layout under ``${XDG_CACHE_HOME:-~/.cache}/bbrlab/debian/``::

    dists/<suite>/InRelease, Packages.xz      the verified index (refreshed on demand)
    pool/<package>_<version>_<arch>.deb       downloaded packages, keyed by package and version
    unpacked/<package>_<version>/             ``dpkg-deb -x`` of one package
    kernels/<name>.json                       the package set a kernel name resolved to (pinned)

Every file and folder is made under a work name (``.build-*``, see :mod:`bbrlab.core.cachefiles`) and
renamed into place when complete; SIGINT, SIGTERM and SIGHUP remove the work name on the way out, and
one left by a killed process is swept later. Each use of a package or an unpacked tree marks it used,
so pruning the cache (``bbrlab cache prune``) removes the least recently used first.

A kernel name resolves once (the suite's ``linux-image-amd64`` at that time) and stays pinned
to that package version until :func:`resolve_kernel_set` is called with ``refresh=True``, so a
campaign spread over days boots the same kernel.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import lzma
import os
import re
import shutil
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from bbrlab.core import cachefiles
from bbrlab.core.cachefiles import cache_dir, sha256_file
from bbrlab.core.errors import BbrlabError
from bbrlab.core.signals import interruptible, run_group

MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
ARCH = "amd64"
INDEX_MEMBER = f"main/binary-{ARCH}/Packages.xz"
DOWNLOAD_TIMEOUT_S = 120
#: Seconds an ``InRelease``'s ``Date`` may lie ahead of this machine's clock (apt allows none by default; a
#: few minutes of clock difference between the mirror and here is not a replay).
RELEASE_FUTURE_SKEW_S = 600


class DebianError(BbrlabError):
    """The mirror, its signature, or a package is not what bbrlab expects."""


@dataclass(frozen=True)
class SuiteKernel:
    """A Debian kernel bbrlab offers by name: the suite's ``linux-image-amd64`` and why this suite."""

    name: str
    suite: str
    series: str  # "5.10": the linux-source-<series> package holds its tcp_bbr.c
    why: str


#: Debian kernels a sender can boot besides the image's own 6.1 (see :mod:`bbrlab.kernel.sender`).
SUITE_KERNELS: dict[str, SuiteKernel] = {k.name: k for k in (
    SuiteKernel("debian-5.10", "bullseye", "5.10", "Debian 11's kernel"),
    SuiteKernel("debian-6.12", "bookworm-backports", "6.12",
                "Debian 13's kernel series as built for Debian 12: its kbuild tools link against bookworm's "
                "glibc and it was compiled with bookworm's gcc-12, so modules build here against its headers "
                "(trixie's linux-kbuild needs glibc >= 2.38 and gcc-14)"),
)}


@dataclass(frozen=True)
class DebPackage:
    """One binary package as the verified index lists it."""

    name: str
    version: str
    filename: str  # path below the mirror root
    sha256: str
    size: int
    suite: str
    depends: str = ""  # the raw Depends field

    @property
    def key(self) -> str:
        """``<package>_<version>``, with characters a file name should not carry replaced."""
        return f"{self.name}_{self.version}".replace(":", "%3a").replace("/", "_")

    def to_dict(self) -> dict:
        """The package's fields as a dict, as :meth:`KernelSet.to_dict` writes it."""
        return asdict(self)


@dataclass(frozen=True)
class KernelSet:
    """The packages of one Debian kernel build: image, headers, kbuild tools, source."""

    name: str
    suite: str
    release: str  # uname -r, e.g. 5.10.0-32-amd64
    image: DebPackage
    headers: tuple[DebPackage, ...]  # flavour headers, common headers, kbuild
    source: DebPackage

    def to_dict(self) -> dict:
        """The set as JSON types, each package as :meth:`DebPackage.to_dict`: what the pinned
        ``kernels/<name>.json`` holds."""
        return {"name": self.name, "suite": self.suite, "release": self.release, "image": self.image.to_dict(),
                "headers": [h.to_dict() for h in self.headers], "source": self.source.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> KernelSet:
        """The set back from :meth:`to_dict`'s dict (a pinned ``kernels/<name>.json``)."""
        return cls(d["name"], d["suite"], d["release"], DebPackage(**d["image"]),
                   tuple(DebPackage(**h) for h in d["headers"]), DebPackage(**d["source"]))


def debian_dir() -> Path:
    """The Debian package cache, ``${XDG_CACHE_HOME:-~/.cache}/bbrlab/debian`` (see the module docstring)."""
    return cache_dir() / "debian"


# -- the verified index ---------------------------------------------------------------------------
def _fetch(url: str, dest: Path) -> Path:
    """Download ``url`` to ``dest`` atomically (a temporary name, renamed when complete)."""
    fd, tmp = cachefiles.work_file(dest.parent, dest.name)
    try:
        with interruptible(), os.fdopen(fd, "wb") as out, \
                urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            shutil.copyfileobj(resp, out, 1 << 20)
        os.replace(tmp, dest)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DebianError(f"cannot download {url}: {e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def check_keyring(keyring: Path = KEYRING) -> None:
    """Refuse (:class:`DebianError`) to go on without Debian's archive keyring: nothing from the mirror can be
    checked without it."""
    if not Path(keyring).is_file():
        raise DebianError(f"Debian's archive keyring {keyring} is missing, so nothing from the mirror can be checked: "
                          "install debian-archive-keyring (scripts/install-system-packages)")


@dataclass(frozen=True)
class ReleaseInfo:
    """The fields of a (signed) ``Release`` text that say which index it is and when it holds."""

    suite: str
    codename: str
    date: dt.datetime
    valid_until: dt.datetime | None


def _release_time(value: str, field_name: str) -> dt.datetime:
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        when = None
    if when is None or when.tzinfo is None:
        raise DebianError(f"the Release file's {field_name} is not an RFC 2822 date with a zone: {value[:80]!r}")
    return when


def release_info(text: str) -> ReleaseInfo:
    """:class:`ReleaseInfo` of a Release text (its header paragraph: ``Suite``, ``Codename``, ``Date``,
    ``Valid-Until``); raises :class:`DebianError` naming a field that is missing or unreadable."""
    fields = dict(re.findall(r"^(Suite|Codename|Date|Valid-Until): *(.*?) *$", text, re.M))
    for name in ("Suite", "Codename", "Date"):
        if not fields.get(name):
            raise DebianError(f"the Release file has no {name} field")
    until = fields.get("Valid-Until")
    return ReleaseInfo(fields["Suite"], fields["Codename"], _release_time(fields["Date"], "Date"),
                       _release_time(until, "Valid-Until") if until else None)


def check_release(info: ReleaseInfo, suite: str, *, now: dt.datetime, previous: dt.datetime | None = None) -> None:
    """Refuse (:class:`DebianError`) a signed index that is not the one asked for now: another suite's
    (``Suite`` and ``Codename`` both differ from ``suite``), expired (``now`` past ``Valid-Until``), dated
    more than :data:`RELEASE_FUTURE_SKEW_S` ahead of ``now``, or older than ``previous`` (the ``Date`` of the
    index verified here before: a replay of an old signed index)."""
    if suite not in (info.suite, info.codename):
        raise DebianError(f"the InRelease fetched for {suite} is {info.codename}'s ({info.suite}): Suite/Codename must "
                          f"name {suite} (another suite's signed index served in its place?)")
    if info.valid_until is not None and now > info.valid_until:
        raise DebianError(f"{suite}'s InRelease expired: Valid-Until {info.valid_until.isoformat()} is before now "
                          f"({now.isoformat()}); a replay of an old index, or a stale mirror")
    ahead_s = (info.date - now).total_seconds()
    if ahead_s > RELEASE_FUTURE_SKEW_S:
        raise DebianError(f"{suite}'s InRelease is dated {info.date.isoformat()}, {ahead_s:.0f} s ahead of this machine's "
                          f"clock (at most {RELEASE_FUTURE_SKEW_S} s allowed): check the clock")
    if previous is not None and info.date < previous:
        raise DebianError(f"{suite}'s InRelease is dated {info.date.isoformat()}, older than the one verified here "
                          f"before ({previous.isoformat()}): a replay of an old signed index, or a stale mirror")


def _previous_date(path: Path) -> dt.datetime | None:
    """The ``Date`` of the InRelease verified here before (bbrlab's own cache), or None."""
    try:
        return release_info(path.read_text(errors="replace")).date
    except (OSError, DebianError):
        return None


def verify_release(inrelease: Path, suite: str, *, keyring: Path = KEYRING, now: dt.datetime | None = None,
                   previous: dt.datetime | None = None) -> str:
    """The signed text of ``inrelease`` once its signature verifies against ``keyring`` (``gpgv``) and its
    fields pass :func:`check_release` for ``suite`` at ``now`` (default: this machine's clock)."""
    check_keyring(keyring)
    p = run_group(["gpgv", "--keyring", str(keyring), "--output", "-", str(inrelease)],
                  capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise DebianError(f"the signature of {suite}'s InRelease does not verify: {p.stderr.strip()[-400:]}")
    check_release(release_info(p.stdout), suite, now=now or dt.datetime.now(dt.UTC), previous=previous)
    return p.stdout


def _verified_release(suite: str, folder: Path, keyring: Path = KEYRING) -> str:
    """Download ``InRelease`` and return its signed text, checked by :func:`verify_release`; it replaces the
    one kept in ``folder`` only once it passed."""
    check_keyring(keyring)  # before anything is downloaded
    kept = folder / "InRelease"
    fetched = _fetch(f"{MIRROR}/dists/{suite}/InRelease", folder / "InRelease.fetched")
    try:
        text = verify_release(fetched, suite, keyring=keyring, previous=_previous_date(kept))
    except BaseException:
        fetched.unlink(missing_ok=True)
        raise
    os.replace(fetched, kept)
    return text


def index_sha256(release_text: str, member: str = INDEX_MEMBER) -> str:
    """The SHA-256 a (signed) Release text lists for ``member``."""
    in_sha256 = False
    for line in release_text.splitlines():
        if not line.startswith(" "):
            in_sha256 = line.strip() == "SHA256:"
            continue
        fields = line.split()
        if in_sha256 and len(fields) == 3 and fields[2] == member:
            return fields[0]
    raise DebianError(f"the Release file lists no SHA256 for {member}")


def parse_packages(text: str, suite: str, prefix: str = "linux-") -> dict[str, list[DebPackage]]:
    """Paragraphs of a ``Packages`` file whose name starts with ``prefix``, by package name."""
    out: dict[str, list[DebPackage]] = {}
    for para in text.split("\n\n"):
        if not para.startswith(f"Package: {prefix}"):
            continue
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): ?(.*)$", para, re.M))
        try:
            pkg = DebPackage(fields["Package"], fields["Version"], fields["Filename"], fields["SHA256"],
                             int(fields["Size"]), suite, fields.get("Depends", ""))
        except KeyError:
            continue
        out.setdefault(pkg.name, []).append(pkg)
    return out


def depends(pkg: DebPackage) -> list[tuple[str, str]]:
    """``[(name, version constraint text), ...]`` of a package's Depends (first of each alternative)."""
    out = []
    for item in pkg.depends.split(","):
        first = item.split("|")[0].strip()
        m = re.match(r"^(\S+)\s*(?:\(([^)]*)\))?", first)
        if m:
            out.append((m.group(1), (m.group(2) or "").strip()))
    return out


def suite_index(suite: str, keyring: Path = KEYRING) -> dict[str, list[DebPackage]]:
    """The suite's kernel packages from its verified ``Packages.xz`` (downloaded now; ``keyring``: Debian's
    archive keyring, refused before any download when missing)."""
    folder = debian_dir() / "dists" / suite
    release = _verified_release(suite, folder, keyring)
    want = index_sha256(release)
    packages = _fetch(f"{MIRROR}/dists/{suite}/{INDEX_MEMBER}", folder / "Packages.xz")
    got = sha256_file(packages)
    if got != want:
        raise DebianError(f"{suite}'s {INDEX_MEMBER} has sha256 {got}, its signed Release says {want}")
    return parse_packages(lzma.decompress(packages.read_bytes()).decode("utf-8", "replace"), suite)


def _one(index: dict[str, list[DebPackage]], name: str, version: str | None, suite: str) -> DebPackage:
    found = index.get(name, [])
    if version is not None:
        found = [p for p in found if p.version == version]
    if not found:
        raise DebianError(f"{suite} has no package {name}" + (f" version {version}" if version else ""))
    return found[-1]


# -- resolving a kernel name ----------------------------------------------------------------------
def _pinned_path(name: str) -> Path:
    return debian_dir() / "kernels" / f"{name}.json"


def pinned_release(name: str) -> str | None:
    """The release kernel ``name`` is pinned to, or None when it was never resolved here."""
    path = _pinned_path(name)
    return json.loads(path.read_text()).get("release") if path.is_file() else None


def resolve_kernel_set(name: str, refresh: bool = False) -> KernelSet:
    """The packages kernel ``name`` (a key of :data:`SUITE_KERNELS`) stands for, pinned once resolved."""
    if name not in SUITE_KERNELS:
        raise DebianError(f"unknown Debian kernel {name!r}: one of {sorted(SUITE_KERNELS)}")
    pinned = _pinned_path(name)
    if pinned.is_file() and not refresh:
        return KernelSet.from_dict(json.loads(pinned.read_text()))
    spec = SUITE_KERNELS[name]
    index = suite_index(spec.suite)
    meta = _one(index, f"linux-image-{ARCH}", None, spec.suite)
    image_dep = [(n, v) for n, v in depends(meta) if n.startswith("linux-image-")]
    if not image_dep:
        raise DebianError(f"{spec.suite}'s linux-image-{ARCH} {meta.version} names no kernel image package")
    image_name, constraint = image_dep[0]
    version = constraint.removeprefix("=").strip()
    image = _one(index, image_name, version, spec.suite)
    release = image_name.removeprefix("linux-image-")
    headers = _one(index, f"linux-headers-{release}", version, spec.suite)
    extra = []
    for dep, _ in depends(headers):
        if dep.startswith("linux-headers-") and dep.endswith("-common"):
            extra.append(_one(index, dep, version, spec.suite))
        elif dep.startswith("linux-kbuild-"):
            extra.append(_one(index, dep, version, spec.suite))
    source = _one(index, f"linux-source-{spec.series}", version, spec.suite)
    kset = KernelSet(name, spec.suite, release, image, (headers, *extra), source)
    fd, tmp = cachefiles.work_file(pinned.parent, pinned.name)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(kset.to_dict(), indent=2) + "\n")
        os.replace(tmp, pinned)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return kset


# -- packages on disk -----------------------------------------------------------------------------
def download(pkg: DebPackage) -> Path:
    """The ``.deb`` in the cache (downloaded and checked against the index's SHA-256 if missing)."""
    dest = debian_dir() / "pool" / f"{pkg.key}_{Path(pkg.filename).name.rsplit('_', 1)[-1]}"
    if dest.is_file() and sha256_file(dest) == pkg.sha256:
        cachefiles.mark_used(dest)
        return dest
    _fetch(f"{MIRROR}/{pkg.filename}", dest)
    got = sha256_file(dest)
    if got != pkg.sha256:
        dest.unlink(missing_ok=True)
        raise DebianError(f"{pkg.filename}: sha256 {got}, the signed index says {pkg.sha256}")
    return dest


def unpack(deb: Path, key: str | None = None) -> Path:
    """``dpkg-deb -x`` a package once into ``unpacked/<key>/`` (key: the package's own name_version)."""
    key = key or deb.name.rsplit("_", 1)[0]
    dest = debian_dir() / "unpacked" / key
    if dest.is_dir():
        cachefiles.mark_used(dest)
        return dest
    with interruptible():
        return _unpack_into(deb, dest)


def _unpack_into(deb: Path, dest: Path) -> Path:
    tmp = cachefiles.work_dir(dest.parent, dest.name)
    try:
        p = run_group(["dpkg-deb", "-x", str(deb), str(tmp)], capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise DebianError(f"dpkg-deb -x {deb} failed: {p.stderr.strip()[-400:]}")
        try:
            os.rename(tmp, dest)
        except OSError:  # another process finished first: keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def deb_fields(deb: Path) -> dict[str, str]:
    """The control fields of a ``.deb`` (``dpkg-deb -f``)."""
    p = run_group(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise DebianError(f"{deb} is not a Debian package: {p.stderr.strip()[-300:]}")
    return dict(re.findall(r"^([A-Za-z0-9-]+): ?(.*)$", p.stdout, re.M))


def file_key(path: Path) -> str:
    """A short content hash for naming cache entries of user-supplied files."""
    return hashlib.sha256(sha256_file(path).encode()).hexdigest()[:16]


def headers_tree(kset: KernelSet) -> Path:
    """The kernel's build headers (``.../usr/src/linux-headers-<release>``), usable from the cache.

    The flavour, common and kbuild packages are unpacked into one folder (their relative symlinks
    point at each other), and the flavour Makefile's absolute ``include /usr/src/...`` is pointed
    at that folder, so ``make -C <it> M=<module> modules`` works without installing anything.
    """
    dest = debian_dir() / "unpacked" / f"headers_{kset.image.key}"
    tree = dest / "usr" / "src" / f"linux-headers-{kset.release}"
    if (tree / "Makefile").is_file():
        cachefiles.mark_used(dest)
        return tree
    debs = [download(pkg) for pkg in kset.headers]
    with interruptible():
        return _unpack_headers(kset, debs, dest, tree)


def _unpack_headers(kset: KernelSet, debs: list[Path], dest: Path, tree: Path) -> Path:
    tmp = cachefiles.work_dir(dest.parent, dest.name)
    try:
        for deb in debs:
            p = run_group(["dpkg-deb", "-x", str(deb), str(tmp)], capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise DebianError(f"dpkg-deb -x {deb} failed: {p.stderr.strip()[-400:]}")
        makefile = tmp / "usr" / "src" / f"linux-headers-{kset.release}" / "Makefile"
        if not makefile.is_file():
            raise DebianError(f"the headers of {kset.release} have no {makefile.name}")
        makefile.write_text(re.sub(r"^include /usr/src/", f"include {dest}/usr/src/", makefile.read_text(),
                                   flags=re.M))
        try:
            os.rename(tmp, dest)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tree


def source_tarball(kset: KernelSet) -> Path:
    """Debian's ``linux-source-<series>.tar.xz`` of this kernel (its ``tcp_bbr.c`` is patched for bbr2b)."""
    root = unpack(download(kset.source), kset.source.key)
    found = sorted((root / "usr" / "src").glob("linux-source-*.tar.*"))
    if not found:
        raise DebianError(f"{kset.source.name} {kset.source.version} holds no usr/src/linux-source-*.tar.*")
    return found[0]
