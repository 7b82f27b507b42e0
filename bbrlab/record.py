"""The run record (schema ``bbrlab.run/2``, docs/run-record.md) and its crash-safe storage.

A run is written into ``CAMPAIGN/.tmp/<run_id>.<pid>/`` and only then renamed, as a whole directory,
to ``runs/<run_id>`` (status ok) or ``failed/<run_id>.a<N>`` (a failed attempt). Every file is fsynced
before the rename and the parent directory after it, so after a crash (SIGKILL, power loss) a run is
either completely in ``runs/`` or not there at all; ``.tmp/`` leftovers are cleared on resume.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import shutil
from pathlib import Path

from .errors import BbrlabError

RECORD_SCHEMA = "bbrlab.run/2"
#: Earlier schemas readers still accept (bbrlab.run/1: before the typed run metadata of the run recipe).
READABLE_SCHEMAS = ("bbrlab.run/1", RECORD_SCHEMA)
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

    package = Path(__file__).resolve().parent
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
                 started_at: str, ended_at: str, scenario: dict, metadata: dict) -> dict:
    """record.json's content, keys in the documented order."""
    if status not in ("ok", "failed"):
        raise ValueError(f"status must be ok or failed, not {status!r}")
    return {
        "schema": RECORD_SCHEMA,
        "run_id": run_id,
        "campaign": campaign,
        "status": status,
        "reason": reason,
        "attempt": attempt,
        "started_at": started_at,
        "ended_at": ended_at,
        "scenario": scenario,
        "metadata": metadata,
    }


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, text: str | bytes) -> None:
    """Write and fsync one file (inside a staging directory, so no rename is needed for it)."""
    data = text.encode() if isinstance(text, str) else text
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_json_atomic(path: Path, obj: object) -> None:
    """Replace ``path`` with ``obj`` as JSON: temp file, fsync, rename, fsync the directory."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_file(tmp, json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    _fsync_path(path.parent)


def staging_dir(campaign_dir: Path, run_id: str) -> Path:
    """A fresh ``.tmp/<run_id>.<pid>/`` to write one attempt into."""
    d = Path(campaign_dir) / TMP / f"{run_id}.{os.getpid()}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def _fsync_tree(directory: Path) -> None:
    for p in directory.rglob("*"):
        if p.is_file():
            _fsync_path(p)
    _fsync_path(directory)


def commit(staging: Path, campaign_dir: Path, record: dict) -> Path:
    """Write ``record.json`` into ``staging`` and move the directory to its final place.

    Status ok goes to ``runs/<run_id>`` (refused if it already exists: a run is never counted twice);
    a failed attempt goes to ``failed/<run_id>.a<attempt>``.
    """
    campaign_dir = Path(campaign_dir)
    write_file(staging / RECORD_FILE, json.dumps(record, indent=2) + "\n")
    _fsync_tree(staging)
    if record["status"] == "ok":
        parent, name = campaign_dir / RUNS, record["run_id"]
    else:
        parent, name = campaign_dir / FAILED, f"{record['run_id']}.a{record['attempt']}"
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
    with open(Path(run_dir) / RECORD_FILE) as f:
        return json.load(f)
