"""A worker's files handed to its driver by path when both run on one machine (issue 35 item 5).

A Dask worker sends each attempt's files back inside its :class:`~bbrlab.campaign.attempt.Finished`: pickled
through the scheduler, up to :data:`~bbrlab.campaign.distributed.MAX_OUTCOME_BYTES`, held whole in three
processes on the way. A worker on the driver's machine (the local testbeds of ``bbrlab campaign run --testbeds``)
need not send them: it writes the attempt straight into the campaign's own private ``.tmp/`` and names that
directory in the outcome; the driver checks it (:func:`check`) and commits it by a rename, as the one-process
loop commits its own staging directory. Workers on other machines (a lab) send bytes as before.

The driver trusts the directory only as far as it can check it: its name is the one this attempt's worker had
to use, it sits in the campaign's ``.tmp/`` (0700, the driver's own), it is a real directory of the driver's
user that nobody else may write, and it holds only regular files with plain names within the size bounds.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from functools import lru_cache
from pathlib import Path

from bbrlab.core import owners
from bbrlab.core.errors import BbrlabError
from bbrlab.run import record as rec


class RefusedStaging(BbrlabError):
    """A staged directory a worker named is not one the driver may commit."""


@lru_cache(maxsize=1)
def machine_key() -> str:
    """This machine, boot and user: the machine and boot ids the contention ledger names owners by
    (:mod:`bbrlab.core.owners`; two containers or a reboot differ) and the effective uid (a worker of another
    user could write into the campaign, but the driver would refuse what it wrote)."""
    try:
        boot = owners.boot_id()
    except OSError:
        boot = ""
    return "/".join([owners.machine_id(), boot, str(os.geteuid())])


def same_machine(driver_key: str | None) -> bool:
    """Whether a driver whose :func:`machine_key` is ``driver_key`` runs on this machine and boot, as this user."""
    return bool(driver_key) and "" not in driver_key.split("/") and driver_key == machine_key()


def _name(run_id: str, attempt: int, pid: int) -> str:
    return f"{run_id}.a{attempt}.w{pid}"


def stage(campaign_dir: str | Path, run_id: str, attempt: int) -> Path:
    """A fresh directory in the campaign's ``.tmp/`` for this worker's attempt, made as the one-process loop
    makes its own (:func:`bbrlab.run.record.fresh_dir`), so a run's directory has one mode whichever way it came."""
    return rec.fresh_dir(rec.private_tmp_dir(Path(campaign_dir)) / _name(run_id, attempt, os.getpid()))


def discard(path: Path) -> None:
    """Remove a staged directory this worker made (an attempt its driver stopped or that ended in error)."""
    shutil.rmtree(path, ignore_errors=True)


def check(staged: str, campaign_dir: str | Path, run_id: str, attempt: int, *, name_re: re.Pattern,
          max_files: int, max_file_bytes: int, max_total_bytes: int) -> Path:
    """The directory ``staged`` as the driver may commit it for attempt ``attempt`` of ``run_id``, or
    :class:`RefusedStaging` saying why not. Returns the path the driver itself computed (never the text it got)."""
    tmp = rec.private_tmp_dir(Path(campaign_dir))
    m = re.fullmatch(re.escape(f"{run_id}.a{attempt}.w") + r"(\d{1,10})", Path(str(staged)).name)
    if m is None or Path(str(staged)) != tmp / Path(str(staged)).name:
        raise RefusedStaging(f"{str(staged)[:200]!r} is not this attempt's directory in {tmp}")
    path = tmp / _name(run_id, attempt, int(m.group(1)))
    try:
        st = os.lstat(path)
    except OSError as e:
        raise RefusedStaging(f"{path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        raise RefusedStaging(f"{path} is not a directory of this user that only it may write")
    entries = list(os.scandir(path))
    if len(entries) > max_files:
        raise RefusedStaging(f"{path} holds {len(entries)} entries, more than {max_files}")
    total = 0
    for entry in entries:
        est = entry.stat(follow_symlinks=False)
        if not name_re.fullmatch(entry.name) or entry.name == rec.RECORD_FILE:
            raise RefusedStaging(f"{path} holds {entry.name[:80]!r}, not a plain file name")
        if not stat.S_ISREG(est.st_mode) or est.st_nlink != 1 or est.st_uid != os.geteuid():
            raise RefusedStaging(f"{path}/{entry.name} is not a regular file of this user (a link?)")
        if est.st_size > max_file_bytes:
            raise RefusedStaging(f"{path}/{entry.name} is {est.st_size} bytes, more than {max_file_bytes}")
        total += est.st_size
    if total > max_total_bytes:
        raise RefusedStaging(f"{path} holds {total} bytes, more than {max_total_bytes}")
    return path
