"""The campaign loop: run (or resume) every planned run of a campaign directory, each until it succeeds or
its attempts are used up, and stop after too many runs in a row fail.

The spec is :mod:`bbrlab.campaign.spec`, the directory (plan, prepare, status) :mod:`bbrlab.campaign.directory`,
the one-testbed checks :mod:`bbrlab.campaign.sameness`.

Crash safety: the campaign directory holds ``spec.yaml`` and ``plan.json`` (the execution order). A
run counts once its directory is renamed into ``runs/`` (:mod:`bbrlab.run.record`); resuming skips those,
clears ``.tmp/`` and retries failed runs until ``max_attempts``. A ``.lock`` file (flock) keeps two
processes from working on the same directory; the kernel releases it when a process dies, even by
SIGKILL.

One campaign, one testbed: a campaign resumed on another testbed, accelerator, sender vCPU count or sender
kernel than its records ran on is refused before its first run (:func:`check_same_testbed`), and a run whose
sender turns out to run another kernel than the campaign's earlier runs of that kernel is not recorded,
unless ``allow_mixed`` (``--allow-mixed``); then every record made says so (``metadata.mixed``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bbrlab.core.errors import BbrlabError
from bbrlab.core.scenario import Scenario
from bbrlab.core.signals import interruptible
from bbrlab.run import record as rec

from .directory import Planned, check_out_dir, prepare, status
from .sameness import MIXED_OPTION, MixedTestbed, check_run_testbed, check_same_testbed, mixed_marker
from .spec import CampaignSpec


def announcing(run_fn: RunFunction, testbed_name: str, spec: CampaignSpec, out_dir: str | Path) -> RunFunction:
    """``run_fn``, telling the testbed's lock what it is running before each attempt, so that
    ``bbrlab testbed status`` can say "campaign demo, run 12/48 <run_id>" without touching the testbed.

    Call the result while holding the testbed's lock (:func:`bbrlab.testbed.lock.set_activity`)."""
    from bbrlab.testbed.lock import set_activity

    planned = spec.runs
    already = len(list((Path(out_dir) / rec.RUNS).glob(f"*/{rec.RECORD_FILE}")))
    started: dict[str, int] = {}

    def run(scenario: Scenario, staging: Path, **kw) -> dict:
        run_id = kw.get("run_id", scenario.run_id)
        index = started.setdefault(run_id, already + len(started) + 1)
        set_activity(testbed_name, "campaign run", campaign=spec.name, out=str(out_dir), run_id=run_id,
                     attempt=kw.get("attempt"), index=index, planned=planned)
        return run_fn(scenario, staging, **kw)

    return run


@contextmanager
def directory_lock(out_dir: Path) -> Iterator[None]:
    """Exclusive lock on the campaign directory; refused at once if another process holds it.

    The lock file is opened without following a symbolic link and created 0600; one that is not a regular
    file of ours is refused (bbrlab.testbed.lock.open_lock_file)."""
    from bbrlab.testbed.lock import open_lock_file

    fd = open_lock_file(Path(out_dir) / ".lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BbrlabError(f"another bbrlab process is running the campaign in {out_dir}") from None
        yield
    finally:
        os.close(fd)


#: A run function: ``run_fn(scenario, staging_dir, *, run_id, attempt) -> metadata`` writes the run's files into
#: ``staging_dir`` and returns the record's ``metadata``; it raises when the run fails (the exception may carry
#: the metadata measured so far, see :mod:`bbrlab.run.runmeta`).
RunFunction = Callable[..., dict]


def failure_reason(error: BaseException) -> str:
    """``Type: message (at file:line in function)``: where it was raised, since some errors (a bare
    EOFError from an SSH channel) carry no message of their own."""
    import traceback

    text = f"{type(error).__name__}: {error}"
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text


def failure_record(run_id: str, campaign: str, scenario: Scenario, attempt: int, started_at: str,
                   error: BaseException) -> dict:
    """The record of a failed attempt: the reason, with where it was raised, and what the run measured."""
    from bbrlab.run.runmeta import of_error

    return rec.build_record(run_id=run_id, campaign=campaign, status="failed", reason=failure_reason(error),
                            attempt=attempt, started_at=started_at, ended_at=rec.now_iso(),
                            scenario=scenario.to_dict(), metadata=of_error(error))



def _guarded(run_fn: RunFunction, out: Path, mixed: dict | None) -> RunFunction:
    """``run_fn``, refusing (:class:`MixedTestbed`, nothing recorded) a run whose sender kernel differs from
    the campaign's, unless ``mixed`` (allowed: the difference goes into ``mixed``)."""
    seen: dict = {}

    def run(scenario: Scenario, staging: Path, **kw) -> dict:
        metadata = run_fn(scenario, staging, **kw)
        difference = check_run_testbed(out, scenario, metadata, seen, kw.get("run_id", scenario.run_id))
        if difference and mixed is None:
            raise MixedTestbed("--testbed", (metadata.get("testbed") or {}).get("name"),
                               f"the testbed this campaign ran on: {difference}. Boot the sender into that kernel, "
                               f"use another --out, or pass {MIXED_OPTION} to mix them (the records then say so)")
        if difference and difference not in mixed["differences"]:
            mixed["differences"].append(difference)
        return metadata

    return run


def execute_run(spec: Planned, out: Path, scenario: Scenario, run_fn: RunFunction, *,
                retry_failed: bool = False, mixed: dict | None = None) -> dict:
    """Run one planned scenario until it succeeds or its attempts are used up; return the last record.

    This is the one place where a run's failure becomes a record. Attempts are numbered across
    processes (``failed/<run_id>.a<N>``); ``retry_failed`` grants a run whose attempts are used up
    ``max_attempts`` more. An interruption (:class:`bbrlab.core.signals.Interrupted`, KeyboardInterrupt) is
    not a failure of the run: nothing is committed, the attempt is not counted, and it propagates; so does
    :class:`MixedTestbed`. With ``mixed`` (:func:`check_same_testbed`'s return) every record made carries it
    as ``metadata.mixed``.
    """
    attempt = len(rec.failed_attempts(out, scenario.run_id))
    last_attempt = attempt + spec.max_attempts if retry_failed else spec.max_attempts
    record: dict = {}
    while attempt < last_attempt:
        attempt += 1
        staging = rec.staging_dir(out, scenario.run_id)
        started = rec.now_iso()
        try:
            metadata = run_fn(scenario, staging, run_id=scenario.run_id, attempt=attempt)
        except MixedTestbed:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of one run is recorded, the campaign goes on
            record = failure_record(scenario.run_id, spec.name, scenario, attempt, started, e)
            if mixed is not None:
                record["metadata"] = {**record["metadata"], "mixed": mixed_marker(mixed)}
        else:
            if mixed is not None:
                metadata = {**metadata, "mixed": mixed_marker(mixed)}
            record = rec.build_record(run_id=scenario.run_id, campaign=spec.name, status="ok", reason=None,
                                      attempt=attempt, started_at=started, ended_at=rec.now_iso(),
                                      scenario=scenario.to_dict(), metadata=metadata)
        rec.commit(staging, out, record)
        if record["status"] == "ok":
            break
    return record


class CampaignAborted(BbrlabError):
    """Several runs in a row failed all their attempts: the testbed, not the scenario, is the likely cause."""


class FailureStreak:
    """Counts the runs in a row that failed every attempt; at ``limit`` the campaign stops
    (:class:`CampaignAborted`), so a testbed outage does not burn the attempts of the whole plan."""

    def __init__(self, limit: int):
        self.limit, self.count = limit, 0

    def add(self, record: dict) -> None:
        """Count one committed run's record (ok ends the streak)."""
        self.count = self.count + 1 if record["status"] != "ok" else 0
        if self.count >= self.limit:
            raise CampaignAborted(
                f"{self.count} runs in a row failed every attempt; last: {record['reason']}. "
                "Fix the cause, then run again (add --retry-failed to retry those runs)")



def run_campaign(spec: Planned, out_dir: str | Path, run_fn: RunFunction, *, progress: bool = True,
                 on_run: Callable[[dict], None] | None = None, retry_failed: bool = False,
                 max_consecutive_failures: int = 5, testbed: dict | None = None, allow_mixed: bool = False) -> dict:
    """Run (or resume) every planned run not yet in ``runs/``; return :func:`status` at the end.

    SIGINT, SIGTERM and SIGHUP end the campaign with :class:`bbrlab.core.signals.Interrupted` once the running
    run's context managers have restored the testbed; that run is not counted and is run again on resume.
    Runs whose attempts are used up are skipped unless ``retry_failed``. After
    ``max_consecutive_failures`` runs in a row fail every attempt, the campaign stops with
    :class:`CampaignAborted` (so a testbed outage does not burn the attempts of the whole plan).

    ``testbed`` is the testbed the runs go to (``Testbed.describe()``): a campaign resumed on another testbed,
    accelerator, vCPU count or sender kernel than its records is refused (:func:`check_same_testbed`), and so
    is, run by run, a sender kernel other than the earlier runs' (not recorded), unless ``allow_mixed``: then
    every record made here carries ``metadata.mixed``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with directory_lock(out), interruptible():
        check_out_dir(spec, out)  # another campaign's directory is refused as such, before its records are read
        mixed = check_same_testbed(out, [testbed] if testbed else [], allow_mixed=allow_mixed,
                                   kernel_dimension=bool(getattr(spec, "kernels", ())))
        run_fn = _guarded(run_fn, out, mixed)
        plan = prepare(spec, out)
        rec.clear_tmp(out)
        todo = [Scenario.from_dict(r["scenario"]) for r in plan["runs"] if not rec.is_complete(out, r["run_id"])]
        if not retry_failed:
            todo = [s for s in todo if len(rec.failed_attempts(out, s.run_id)) < spec.max_attempts]
        total = len(plan["runs"])
        bar = _progress_bar(total, total - len(todo), spec, enabled=progress)
        streak = FailureStreak(max_consecutive_failures)
        try:
            for scenario in todo:
                t0 = time.monotonic()
                record = execute_run(spec, out, scenario, run_fn, retry_failed=retry_failed, mixed=mixed)
                bar.set_postfix_str(f"{scenario.run_id} {record['status']} {time.monotonic() - t0:.1f}s")
                bar.update(1)
                if on_run:
                    on_run(record)
                streak.add(record)
        finally:
            with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                bar.close()
    return status(out)


def _progress_bar(total: int, initial: int, spec: Planned, *, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=spec.name, unit="run", disable=not enabled, dynamic_ncols=True)
