"""The run record (schema ``bbrlab.run/2``, docs/run-record.md; typed: :mod:`bbrlab.run.runrecord`) and its
crash-safe storage.

A run is written into ``CAMPAIGN/.tmp/<run_id>.<pid>/`` and only then renamed, as a whole directory,
to ``runs/<run_id>`` (status ok) or ``failed/<run_id>.a<N>`` (a failed attempt). Every file is fsynced
before the rename and the parent directory after it, so after a crash (SIGKILL, power loss) a run is
either completely in ``runs/`` or not there at all; ``.tmp/`` leftovers are cleared on resume.

Nothing is written through a symbolic link another user could plant: files are opened with ``O_NOFOLLOW``,
a temporary file is created afresh (``O_EXCL``, mode 0600 while it is written) under a name that is first
cleared, and ``.tmp/`` is a directory of mode 0700 that is refused when it is a link.

A write refused for want of space (``ENOSPC``, or ``EDQUOT`` of a quota) is a :class:`DiskFull` naming the
directory and its free bytes: the attempt being written is removed (it was only ever in ``.tmp/``), every
run committed before stays, and the campaign ends (it resumes once there is room).
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import json
import os
import shutil
import stat
from pathlib import Path

import pydantic

from bbrlab.core.errors import BbrlabError
from bbrlab.scenario.scenario import Scenario

from .runmeta import RunMetadata, failure_reason, of_error
from .runrecord import RunRecord

#: errno values of a write refused for want of room: the file system's (ENOSPC) or the user's quota (EDQUOT).
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(BbrlabError):
    """No room left to write a run into the campaign directory ``directory`` (``free_bytes`` free then, None when
    unknown); the attempt being written, ``run_id``, was removed and runs again on resume."""

    def __init__(self, directory: Path, free_bytes: int | None, run_id: str | None = None):
        self.directory, self.free_bytes, self.run_id = Path(directory), free_bytes, run_id
        free = "unknown" if free_bytes is None else f"{free_bytes} bytes ({free_bytes / 2**20:.1f} MiB)"
        what = f" while writing run {run_id}" if run_id else ""
        super().__init__(f"the file system of the campaign directory {directory} is full{what} (free: {free}): "
                         "the campaign stopped. Every run recorded so far is kept and the run being written was "
                         "discarded; free some space, then run the same command again to resume")

    def __reduce__(self):
        return type(self), (self.directory, self.free_bytes, self.run_id)


def no_space(error: BaseException | None) -> bool:
    """Whether ``error``, or an exception it was raised from, is a write refused for want of room."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS:
            return True
        error = error.__cause__ or error.__context__
    return False


def disk_full(campaign_dir: Path, run_id: str | None = None, staging: Path | None = None) -> DiskFull:
    """The :class:`DiskFull` of ``campaign_dir``, after removing the half-written ``staging`` (which frees its
    room too)."""
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        free = shutil.disk_usage(campaign_dir).free
    except OSError:
        free = None
    return DiskFull(Path(campaign_dir), free, run_id)


RECORD_FILE = "record.json"
RUNS = "runs"
FAILED = "failed"
TMP = ".tmp"


@functools.cache
def git_commit() -> str | None:
    """The short commit of the bbrlab checkout this process runs from, with ``+dirty`` when files under
    ``bbrlab/`` differ from it (None when not a git checkout).

    Read once per process: a commit made while a campaign runs does not change what its records name, since
    the code the process loaded is the code of the first read.
    """
    import subprocess

    package = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        changed = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--untracked-files=no", "--",
                                  "."], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (head + ("+dirty" if changed else "")) or None


def now_iso() -> str:
    """UTC time with milliseconds, e.g. ``2026-11-21T01:02:03.456Z``."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_record(*, run_id: str, campaign: str, status: str, reason: str | None, attempt: int,
                 started_at: str, ended_at: str, scenario: Scenario, metadata: RunMetadata | dict) -> RunRecord:
    """The typed record.json (:class:`~bbrlab.run.runrecord.RunRecord`; its ``to_dict`` is what is written).
    ``metadata`` given as JSON (a run function's return) is typed first: ValueError naming the field that does
    not fit (:func:`record_of_run` keeps such a run as a failed record instead)."""
    if status not in ("ok", "failed"):
        raise ValueError(f"status must be ok or failed, not {status!r}")
    if not isinstance(metadata, RunMetadata):
        metadata = RunMetadata.from_dict(metadata)
    return RunRecord(run_id=run_id, campaign=campaign, status=status, reason=reason, attempt=attempt,
                     started_at=started_at, ended_at=ended_at, scenario=scenario, metadata=metadata)


#: The file a run's metadata is kept in, as the run gave it, when it does not type (:func:`record_of_run`).
UNTYPED_METADATA_FILE = "metadata.untyped.json"


def record_of_run(staging: Path, *, run_id: str, campaign: str, status: str, reason: str | None, attempt: int,
                  started_at: str, ended_at: str, scenario: Scenario, metadata: object) -> RunRecord:
    """The record of a finished run whose metadata came as JSON (``metadata``), its files in ``staging``: as
    :func:`build_record`, and never lost when that metadata does not type.

    Such a run is recorded as a failed attempt, not refused and not written ok: refusing it would lose a
    completed run (a failure mid-campaign loses none), and every record in ``runs/`` reads typed (the analysis
    reads nothing else), so one that does not cannot go there. Its reason names each key that did not type and
    why (after the run's own reason, when it failed too: the host guard's reason stays first); its metadata is
    the keys that type on their own; the metadata as the run gave it is written beside, in
    :data:`UNTYPED_METADATA_FILE`. The campaign then runs the attempt again, as for any failure."""
    envelope = dict(run_id=run_id, campaign=campaign, attempt=attempt, started_at=started_at, ended_at=ended_at,
                    scenario=scenario)
    try:
        return build_record(**envelope, status=status, reason=reason, metadata=metadata)
    except ValueError as e:
        if not isinstance(e, pydantic.ValidationError):
            raise  # the status, not the metadata
    typed, untyped = _typed_keys(metadata)
    write_file(staging / UNTYPED_METADATA_FILE, json.dumps(metadata, indent=2, default=repr) + "\n")
    said = (f"the run's metadata does not type (kept as the run gave it in {UNTYPED_METADATA_FILE}): "
            + "; ".join(untyped.values()))
    return build_record(**envelope, status="failed", reason=f"{reason}; {said}" if reason else said,
                        metadata=typed)


def _typed_keys(metadata: dict) -> tuple[RunMetadata, dict[str, str]]:
    """The metadata of the keys of ``metadata`` that type each on its own (empty when even those do not type
    together), and why each other key does not."""
    if not isinstance(metadata, dict):
        return RunMetadata(), {"metadata": f"not a JSON object but {type(metadata).__name__}"}
    untyped = {}
    for key, value in metadata.items():
        try:
            RunMetadata.from_dict({key: value})
        except pydantic.ValidationError as e:
            untyped[key] = "; ".join(_why(err) for err in e.errors())
    try:
        return RunMetadata.from_dict({k: v for k, v in metadata.items() if k not in untyped}), untyped
    except pydantic.ValidationError as e:
        return RunMetadata(), untyped | {"(together)": "; ".join(_why(err) for err in e.errors())}


def _why(error: dict) -> str:
    place = ".".join(map(str, error["loc"]))
    return f"{place}: {error['msg']}" if place else error["msg"]


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for a moment, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _write_fd(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_file(path: Path, text: str | bytes) -> None:
    """Write and fsync one file (inside a staging directory, so no rename is needed for it); a symbolic
    link at ``path`` is refused, not followed."""
    data = text.encode() if isinstance(text, str) else text
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    _write_fd(fd, data)


def temporary_name(path: Path) -> Path:
    """The name ``path`` is written under before it is renamed into place: ``.<name>.<pid>.tmp``."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace ``path`` with ``text``: a fresh private temporary file (whatever was at its name, a planted
    link too, is removed first, then ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600), fsync, the file's usual
    mode, rename, fsync the directory."""
    path = Path(path)
    data = text.encode() if isinstance(text, str) else text
    tmp = temporary_name(path)
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # private while written; then what any file of the campaign gets
        _write_fd(fd, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_path(path.parent)


def write_json_atomic(path: Path, obj: object) -> None:
    """Replace ``path`` with ``obj`` as JSON (see :func:`write_atomic`)."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def private_tmp_dir(campaign_dir: Path) -> Path:
    """The campaign's ``.tmp/``: created 0700, refused when it is a symbolic link or not ours."""
    tmp = Path(campaign_dir) / TMP
    try:
        tmp.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(tmp)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise BbrlabError(f"{tmp} is not a directory of ours (a symbolic link?): refusing to write runs there; "
                          "move it away")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(tmp, 0o700)
    return tmp


def staging_dir(campaign_dir: Path, run_id: str) -> Path:
    """A fresh ``.tmp/<run_id>.<pid>/`` to write one attempt into."""
    return fresh_dir(private_tmp_dir(campaign_dir) / f"{run_id}.{os.getpid()}")


def fresh_dir(d: Path) -> Path:
    """``d`` made empty: whatever is at its name (a link, a file, an older directory) removed first. Its mode is
    the umask's: it lies in the campaign's 0700 ``.tmp/`` and becomes a run's directory as it is."""
    if d.is_symlink() or d.is_file():
        d.unlink()
    elif d.exists():
        shutil.rmtree(d)
    d.mkdir()
    return d


def _fsync_tree(directory: Path) -> None:
    for p in directory.rglob("*"):
        if p.is_file():
            _fsync_path(p)
    _fsync_path(directory)


def commit(staging: Path, campaign_dir: Path, record: RunRecord) -> Path:
    """Write ``record.json`` (``record.to_dict()``) into ``staging`` and move the directory to its final place.

    Status ok goes to ``runs/<run_id>`` (refused if it already exists: a run is never counted twice);
    a failed attempt goes to ``failed/<run_id>.a<attempt>``.
    """
    campaign_dir = Path(campaign_dir)
    write_file(staging / RECORD_FILE, json.dumps(record.to_dict(), indent=2) + "\n")
    _fsync_tree(staging)
    if record.status == "ok":
        parent, name = campaign_dir / RUNS, record.run_id
    else:
        parent, name = campaign_dir / FAILED, f"{record.run_id}.a{record.attempt}"
    parent.mkdir(exist_ok=True)
    final = parent / name
    if final.exists():
        raise BbrlabError(f"{final} already exists: refusing to overwrite a recorded run")
    os.rename(staging, final)
    _fsync_path(parent)
    return final


def is_complete(campaign_dir: Path, run_id: str) -> bool:
    """A run counts as done when ``runs/<run_id>/record.json`` exists (written before the rename)."""
    return (Path(campaign_dir) / RUNS / run_id / RECORD_FILE).is_file()


def failed_attempts(campaign_dir: Path, run_id: str) -> list[int]:
    """Attempt numbers recorded under ``failed/`` for ``run_id``."""
    out = []
    for p in (Path(campaign_dir) / FAILED).glob(f"{run_id}.a*"):
        tail = p.name[len(run_id) + 2:]
        if tail.isdigit() and (p / RECORD_FILE).is_file():
            out.append(int(tail))
    return sorted(out)


def clear_tmp(campaign_dir: Path, run_ids: list[str] | None = None) -> int:
    """Remove the half-written attempts under ``.tmp/`` that this campaign made; return how many.

    Only ``.tmp/<run_id>.<pid>/`` directories of planned runs (``run_ids``, by default those of the
    directory's ``plan.json``) are touched: anything else there is not the campaign's and stays. Call it
    holding the campaign directory's lock (no other process is writing an attempt then).
    """
    campaign_dir = Path(campaign_dir)
    tmp = campaign_dir / TMP
    if not tmp.is_dir() or tmp.is_symlink():
        return 0
    planned = set(run_ids if run_ids is not None else _planned_run_ids(campaign_dir))
    removed = 0
    for p in tmp.iterdir():
        run_id, _, pid = p.name.rpartition(".")
        if run_id not in planned or not pid.isdigit() or p.is_symlink() or not p.is_dir():
            continue
        shutil.rmtree(p)
        removed += 1
    return removed


def _planned_run_ids(campaign_dir: Path) -> list[str]:
    try:
        plan = json.loads((campaign_dir / "plan.json").read_text())
        return [r["run_id"] for r in plan["runs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # no readable plan: nothing here is known to be the campaign's


def in_progress(campaign_dir: Path) -> list[str]:
    """Run ids being written right now by a live process (``.tmp/<run_id>.<pid>`` with that pid alive)."""
    tmp = Path(campaign_dir) / TMP
    running = []
    for p in tmp.glob("*.*") if tmp.is_dir() else []:
        run_id, _, pid = p.name.rpartition(".")
        if pid.isdigit() and _pid_alive(int(pid)):
            running.append(run_id)
    return running


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_record(run_dir: Path) -> dict:
    """The ``record.json`` of the run directory ``run_dir``, as parsed JSON, as it is on disk (``OSError`` when it
    cannot be read, ``json.JSONDecodeError`` when it is not JSON); typed and upgraded: :func:`load`."""
    with open(Path(run_dir) / RECORD_FILE) as f:
        return json.load(f)


def load(run_dir: Path) -> RunRecord:
    """The ``record.json`` of the run directory ``run_dir``, upgraded and typed (:meth:`RunRecord.load
    <bbrlab.run.runrecord.RunRecord.load>`): ValueError naming the field that does not fit."""
    return RunRecord.load(run_dir)


def failure_record(run_id: str, campaign: str, scenario: Scenario, attempt: int, started_at: str,
                   error: BaseException) -> RunRecord:
    """The record of a failed attempt of ``scenario`` (a :class:`~bbrlab.scenario.scenario.Scenario`): the reason,
    with where it was raised, and what the run measured before it failed (:func:`bbrlab.run.runmeta.of_error`)."""
    return build_record(run_id=run_id, campaign=campaign, status="failed", reason=failure_reason(error),
                        attempt=attempt, started_at=started_at, ended_at=now_iso(),
                        scenario=scenario, metadata=of_error(error))
