"""The campaign loop, the one for every way a campaign runs: run (or resume) every planned run of a campaign
directory, each until it succeeds or its attempts are used up, and stop after too many runs in a row fail.

:func:`drive` is the loop; an :class:`Executor` runs the attempts it submits. Two executors exist:
:class:`InProcess` (one testbed, driven from this process; :func:`run_campaign`) and
:class:`bbrlab.campaign.distributed.DaskExecutor` (several testbeds, one Dask worker each). Whatever the
executor, the loop alone decides which attempt comes next and alone writes the campaign directory
(:func:`commit_finished`).

The spec is :mod:`bbrlab.campaign.spec`, the directory (plan, prepare, status) :mod:`bbrlab.campaign.directory`,
the one-testbed checks :mod:`bbrlab.campaign.sameness`.

Crash safety: the campaign directory holds ``spec.yaml`` and ``plan.json`` (the execution order). A
run counts once its directory is renamed into ``runs/`` (:mod:`bbrlab.run.record`); resuming skips those,
clears ``.tmp/`` and retries failed runs until ``max_attempts``. A ``.lock`` file (flock) keeps two
processes from working on the same directory; the kernel releases it when a process dies, even by
SIGKILL.

One campaign, one set of testbeds: a campaign resumed on another testbed, accelerator, sender vCPU count or
sender kernel than its records ran on is refused before its first run (:func:`check_same_testbed`), and a run
whose sender turns out to run another kernel than the campaign's earlier runs of that kernel is not recorded,
unless ``options.allow_mixed`` (``--allow-mixed``); then every record made says so (``metadata.mixed``).
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from bbrlab.core.errors import BbrlabError
from bbrlab.core.signals import checkpoint, interruptible
from bbrlab.run import record as rec
from bbrlab.scenario.scenario import Scenario
from bbrlab.testbed.lock import open_lock_file, set_activity

from . import hostguard, watchdog
from .attempt import Attempt, Finished, RunFunction, run_attempt
from .blocks import BlockBoots
from .directory import Planned, check_out_dir, prepare, status
from .options import DEFAULT_OPTIONS, CampaignOptions
from .sameness import MIXED_OPTION, MixedTestbed, check_run_testbed, check_same_testbed, mixed_marker
from .search import make_gate
from .spec import CampaignSpec


def announcing(run_fn: RunFunction, testbed_name: str, spec: CampaignSpec, out_dir: str | Path) -> RunFunction:
    """``run_fn``, telling the testbed's lock what it is running before each attempt, so that
    ``bbrlab testbed status`` can say "campaign demo, run 12/48 <run_id>" without touching the testbed.

    Call the result while holding the testbed's lock (:func:`bbrlab.testbed.lock.set_activity`)."""
    planned = len(spec.plan())  # a CampaignSpec or a CalibrationSpec (the Planned protocol)
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
    fd = open_lock_file(Path(out_dir) / ".lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BbrlabError(f"another bbrlab process is running the campaign in {out_dir}") from None
        yield
    finally:
        os.close(fd)


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


# -- what the loop hands an executor and gets back: an Attempt, a Finished (bbrlab.campaign.attempt) ----------

class Executor(Protocol):
    """Runs attempts; the loop (:func:`drive`) decides which, and commits what comes back.

    ``submit`` queues an attempt; ``finished`` yields each submitted attempt once it has run (attempts
    submitted while it yields are run too), until none is left; ``close`` drops what has not run and
    leaves the testbeds restored. An interruption (:class:`~bbrlab.core.signals.Interrupted`) or
    :class:`MixedTestbed` raised by ``finished`` ends the campaign; any other failure of a run must come
    back as a failed :class:`Finished`."""

    def submit(self, attempt: Attempt) -> None:
        """Queue ``attempt`` to be run."""

    def finished(self) -> Iterator[Finished]:
        """Yield a :class:`Finished` for each submitted attempt once it has run, until none is left."""

    def close(self) -> None:
        """Drop the attempts not run yet and leave every testbed restored."""


class InProcess:
    """The executor of one testbed driven from this process: ``run_fn`` runs each attempt here, one at a
    time, the lowest place in the plan first, so a failed attempt is retried before the runs after it."""

    def __init__(self, run_fn: RunFunction, out_dir: str | Path,
                 bound_s: Callable[[Scenario], float] = watchdog.attempt_bound_s):
        self.run_fn, self.out, self.bound_s = run_fn, Path(out_dir), bound_s
        self._queue: list[tuple[int, int, Attempt]] = []
        self._last_end: float | None = None  # when the previous attempt's run function returned

    def submit(self, attempt: Attempt) -> None:
        """Queue ``attempt``."""
        heapq.heappush(self._queue, (attempt.order, attempt.attempt, attempt))

    def finished(self) -> Iterator[Finished]:
        """Run the queued attempts in order, yielding each as it ends."""
        while self._queue:
            yield self.run(heapq.heappop(self._queue)[2])

    def run(self, attempt: Attempt) -> Finished:
        """Run one attempt into a fresh staging directory (:func:`bbrlab.campaign.attempt.run_attempt`: any
        exception of the run is its failure, except an interruption, :class:`MixedTestbed` and a full disk, which
        propagate). An attempt still running at its bound (``bound_s`` of its scenario) is ended as a failed one
        with every thread's stack (:func:`bbrlab.campaign.watchdog.bounded`). The metadata's ``timing`` gains the
        attempt's wall time here (``attempt_wall_s``) and the seconds since the previous attempt ended
        (``between_s``: its commit and the loop's bookkeeping)."""
        t0 = time.monotonic()
        between_s = None if self._last_end is None else round(t0 - self._last_end, 3)
        finished = run_attempt(self.run_fn, attempt, rec.staging_dir(self.out, attempt.run_id),
                               bound_s=self.bound_s(attempt.scenario), campaign_dir=self.out)
        self._last_end = end = time.monotonic()
        timing = {**finished.metadata.get("timing", {}), "attempt_wall_s": round(end - t0, 3)}
        finished.metadata = {**finished.metadata,
                             "timing": timing | ({} if between_s is None else {"between_s": between_s})}
        finished.wall_s = end - t0
        return finished

    def close(self) -> None:
        """Drop the attempts not run (the testbed is restored by each run's own context managers)."""
        self._queue.clear()


def commit_finished(out: Path, campaign: str, finished: Finished, mixed: dict | None = None) -> dict:
    """Write one finished attempt into the campaign directory, atomically, and return its record: ok into
    ``runs/``, failed into ``failed/``. With ``mixed`` (:func:`check_same_testbed`'s return) the record carries
    ``metadata.mixed``. The one place where a campaign's record is made: typed
    (:func:`~bbrlab.run.record.record_of_run`; a run whose metadata does not type is kept as a failed attempt,
    its reason naming the key), its JSON returned. No room to write it is
    :class:`~bbrlab.run.record.DiskFull` (the attempt removed; nothing of it in ``runs/`` or ``failed/``)."""
    staging = None
    try:
        staging = finished.staging or rec.staging_dir(out, finished.attempt.run_id)
        for name, data in finished.files.items():
            rec.write_file(staging / name, data)
        return _commit(out, campaign, finished, staging, mixed)
    except OSError as e:
        if rec.no_space(e):
            raise rec.disk_full(out, finished.attempt.run_id, staging) from e
        raise


def _commit(out: Path, campaign: str, finished: Finished, staging: Path, mixed: dict | None) -> dict:
    metadata = dict(finished.metadata)
    if mixed is not None:
        metadata["mixed"] = mixed_marker(mixed)
    record = rec.record_of_run(staging, run_id=finished.attempt.run_id, campaign=campaign, status=finished.status,
                               reason=finished.reason, attempt=finished.attempt.attempt,
                               started_at=finished.started_at, ended_at=finished.ended_at,
                               scenario=finished.attempt.scenario, metadata=metadata)
    rec.commit(staging, out, record)
    return record.to_dict()


def _check_kernel(out: Path, finished: Finished, mixed: dict | None, seen: dict) -> None:
    """Refuse (:class:`MixedTestbed`, nothing recorded) an ok run whose sender kernel differs from the
    campaign's earlier runs on its testbed, unless ``mixed`` (then the difference goes into it)."""
    a = finished.attempt
    difference = check_run_testbed(out, a.scenario, finished.metadata, seen, a.run_id)
    if difference and mixed is None:
        raise MixedTestbed("--testbed", (finished.metadata.get("testbed") or {}).get("name"),
                           f"the testbed this campaign ran on: {difference}. Boot the sender into that kernel, "
                           f"use another --out, or pass {MIXED_OPTION} to mix them (the records then say so)")
    if difference and difference not in mixed["differences"]:
        mixed["differences"].append(difference)


# -- the loop --------------------------------------------------------------------------------------------

def drive(spec: Planned, out_dir: str | Path, executor: Executor, *, options: CampaignOptions = DEFAULT_OPTIONS,
          on_run: Callable[[dict], None] | None = None, testbeds: list[dict] | None = None) -> dict:
    """The campaign loop, for every executor: run (or resume) every planned run not yet in ``runs/``, each until
    it succeeds or its attempts are used up; return :func:`status` at the end.

    Under the directory's lock: the directory is checked (another campaign's is refused before its records are
    read), the testbeds the runs go to (``testbeds``, each ``Testbed.describe()``) are checked against those
    the records ran on (:func:`check_same_testbed`; refused unless ``options.allow_mixed``, and then every record
    made carries ``metadata.mixed``), the plan is written or repaired, half-written attempts are cleared. Then
    each remaining run is submitted in plan order; a failed attempt is submitted again until ``max_attempts``
    (``options.retry_failed`` grants runs whose attempts are used up as many more). ``options.progress`` shows a
    progress bar; ``on_run`` gets each run's record as it is committed. An ok run whose sender kernel
    differs from the campaign's earlier runs is refused as :class:`MixedTestbed` (nothing recorded). An ok run
    whose host was busier outside the testbed than the spec's ``host_guard`` allows is recorded as a failed
    attempt "host busy" and submitted again after the runs queued (:mod:`bbrlab.campaign.hostguard`).

    With adaptive repetitions (``spec.adaptive``) or a threshold search (``spec.search``) a run is submitted only
    once the stopping rule or the search wants it (:class:`bbrlab.campaign.repetitions.Gate`,
    :class:`bbrlab.campaign.search.SearchGate`): each settled run may open more runs or drop the rest, and
    ``decisions.json`` is rewritten; the decisions follow from the committed runs alone.

    With blocks (``spec.blocks`` > 1) each attempt carries its :class:`~bbrlab.run.blockboot.BlockBoot`: its block
    and the sender boot ids the block's committed runs ran on (:class:`bbrlab.campaign.blocks.BlockBoots`), from
    which the run function boots the testbed afresh for a new block, as it would have without the interruption.

    SIGINT, SIGTERM and SIGHUP end the campaign with :class:`bbrlab.core.signals.Interrupted` once the
    executor has restored its testbeds (:meth:`Executor.close`); a run not committed then is run again on
    resume. After ``options.max_consecutive_failures`` runs in a row fail every attempt the campaign stops with
    :class:`CampaignAborted`. A full disk ends it with :class:`~bbrlab.run.record.DiskFull`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _drive(spec, out, executor, options, on_run, testbeds)
    except OSError as e:  # the plan, decisions.json, a staging directory: the campaign cannot go on
        if rec.no_space(e):
            raise rec.disk_full(out) from e
        raise


def _drive(spec: Planned, out: Path, executor: Executor, options: CampaignOptions,
           on_run: Callable[[dict], None] | None, testbeds: list[dict] | None) -> dict:
    with directory_lock(out), interruptible():
        check_out_dir(spec, out)
        mixed = check_same_testbed(out, list(testbeds or []), allow_mixed=options.allow_mixed,
                                   kernel_dimension=bool(getattr(spec, "kernels", ())),
                                   vcpus_dimension=bool(getattr(spec, "sender_vcpus", ())))
        plan = prepare(spec, out)
        rec.clear_tmp(out)
        runs = [(r.run_id, r.scenario) for r in plan.runs]
        used = {run_id: len(rec.failed_attempts(out, run_id)) for run_id, _ in runs if not rec.is_complete(out, run_id)}
        last = {run_id: n + spec.max_attempts if options.retry_failed else spec.max_attempts for run_id, n in used.items()}
        done: set[str] = set()  # committed ok in this process (``used`` holds the runs not complete at the start)
        gate = make_gate(getattr(spec, "adaptive", None), getattr(spec, "search", None), runs, out,
                         settled=lambda run_id: run_id not in used or run_id in done or used[run_id] >= last[run_id])
        gate.write(out)
        order_of = {run_id: i for i, (run_id, _) in enumerate(runs)}
        place = getattr(gate, "place", order_of.__getitem__)  # a search's own order (bbrlab.campaign.interleave)
        submitted: set[str] = set()
        boots = BlockBoots(spec, out, runs)
        guard = hostguard.effective(getattr(spec, "host_guard", None))
        # a host-busy attempt goes again after the runs queued behind it; in a blocked campaign, at its block's
        # end, so that the block keeps its one boot
        block_end: dict[int, int] = {}
        if boots.blocks > 1:
            for run_id, scenario in runs:
                block = spec.block_of(scenario.repetition)
                block_end[block] = max(block_end.get(block, 0), order_of[run_id])

        def submit_open(run_ids) -> None:
            for run_id in sorted(run_ids, key=place):
                if run_id in used and used[run_id] < last[run_id] and run_id not in submitted and gate.is_open(run_id):
                    submitted.add(run_id)
                    scenario = plan.runs[order_of[run_id]].scenario
                    executor.submit(Attempt(run_id, used[run_id] + 1, scenario, place(run_id),
                                            boots.request(scenario)))

        open_todo = [run_id for run_id, _ in runs if run_id in used and used[run_id] < last[run_id]]
        bar = _progress_bar(len(runs) - gate.skipped(), len(runs) - len(open_todo), spec.name, enabled=options.progress)
        streak, seen = FailureStreak(options.max_consecutive_failures), {}
        try:
            submit_open(open_todo)
            for finished in executor.finished():
                a = finished.attempt
                if finished.status == "ok":
                    _check_kernel(out, finished, mixed, seen)
                    finished = hostguard.judged(finished, guard)
                if hasattr(gate, "record_of"):  # a search's run records its place in the order
                    finished.metadata = {**finished.metadata, **gate.record_of(a.run_id)}
                record = commit_finished(out, spec.name, finished, mixed)
                checkpoint()  # a Ctrl-C whose exception Python dropped ends the campaign here, the run kept
                used[a.run_id] = a.attempt
                boots.add(a.scenario, record)
                if record["status"] == "ok":
                    done.add(a.run_id)
                if record["status"] != "ok" and a.attempt < last[a.run_id]:
                    place_again = a.order
                    if hostguard.is_host_busy(record["reason"]):  # after the queued runs (of its block)
                        place_again = (block_end[spec.block_of(a.scenario.repetition)] if block_end
                                       else a.order + len(runs))
                    executor.submit(Attempt(a.run_id, a.attempt + 1, a.scenario, place_again,
                                            boots.request(a.scenario)))
                    continue
                if gate.rule is not None:  # the run is settled: its point's decision may open or drop runs
                    submit_open(gate.settle(a.run_id))
                    gate.write(out)
                    bar.total = len(runs) - gate.skipped()
                bar.set_postfix_str(_postfix(finished))
                bar.update(1)
                if on_run:
                    on_run(record)
                streak.add(record)
        finally:
            try:
                executor.close()
            finally:
                with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                    bar.close()
    return status(out)


def _postfix(finished: Finished) -> str:
    text = f"{finished.attempt.run_id} {finished.status}"
    if finished.wall_s is not None:
        text += f" {finished.wall_s:.1f}s"
    return text + (f" on {finished.testbed}" if finished.testbed else "")


def _progress_bar(total: int, initial: int, name: str, *, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="run", disable=not enabled, dynamic_ncols=True)


def run_campaign(spec: Planned, out_dir: str | Path, run_fn: RunFunction, *,
                 options: CampaignOptions = DEFAULT_OPTIONS, on_run: Callable[[dict], None] | None = None,
                 testbed: dict | None = None) -> dict:
    """Run (or resume) ``spec`` into ``out_dir`` on one testbed from this process: :func:`drive` with the
    :class:`InProcess` executor of ``run_fn``. ``testbed`` is the testbed the runs go to
    (``Testbed.describe()``); see :func:`drive` for the guarantees."""
    return drive(spec, out_dir, InProcess(run_fn, out_dir), options=options, on_run=on_run,
                 testbeds=[testbed] if testbed else [])
