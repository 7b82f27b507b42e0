"""Campaigns over several testbeds at once, on Dask distributed: the driver's side.

One Dask worker owns one testbed for the whole campaign (:mod:`bbrlab.campaign.worker`: the plugin that
takes its lock, keeps one :class:`~bbrlab.run.runner.Runner` so the link stays set between runs, and restores
the testbed when the worker closes). Each worker offers one unit of the resource :data:`RESOURCE`, and
every run is submitted asking for one unit, so a testbed runs one run at a time.

The driver (the ``bbrlab campaign run`` process) stays the single source of truth: it alone writes the
campaign directory. A worker runs a scenario into a temporary directory of its own and returns the
files and the record's metadata; the driver runs the one campaign loop (:func:`bbrlab.campaign.loop.drive`)
with a :class:`DaskExecutor`, which commits them atomically, retries failed attempts, and stops after too
many consecutive failures, exactly as for one testbed. A worker lost mid-run (killed, machine gone) loses nothing: Dask runs that task
again on another worker, and only a returned result is committed. A driver killed at any moment resumes
with ``campaign run`` as always (completed runs are in ``runs/``; nothing else counts). A driver that
stops (Ctrl-C, SIGTERM, SIGHUP, or the campaign's end) first has every worker finish its campaign:
the run in flight is interrupted and restores the testbed, the link comes off
(:meth:`~bbrlab.campaign.worker.TestbedPlugin.finish`).

Runs are submitted in plan order with decreasing priority, so each worker takes the next planned run
when it is free and the blocked-random order is kept as far as several testbeds allow.

Trust. A local cluster (:func:`local_cluster`) listens on 127.0.0.1 only and speaks mutual TLS with a
certificate made for this campaign (:mod:`bbrlab.campaign.tls`), so no other machine and no other local user
can send its root workers code. What a worker sends back is still checked (:func:`check_outcome`): the
driver accepts an outcome only for the attempt it submitted, with plain file names and bounded sizes;
anything else, and any error of a task (a worker killed too often, a worker without bbrlab's testbed
plugin, an exception), becomes a failed attempt with the reason, never a crash of the campaign.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from distributed import Nanny, SpecCluster

from bbrlab.core import recordjson
from bbrlab.core.errors import BbrlabError
from bbrlab.run import record as rec
from bbrlab.run.campaignadded import WorkerPlace
from bbrlab.scenario.scenario import MAX_SAMPLE_RECORDS, Scenario
from bbrlab.testbed import isolation

from . import handoff, watchdog
from . import tls as tlsconf
from .attempt import STOPPED, Attempt, Finished
from .loop import commit_finished, drive
from .options import DEFAULT_OPTIONS, CampaignOptions
from .spec import CampaignSpec
from .worker import (
    PLUGIN_NAME,
    RESOURCE,
    CampaignContext,
    NotATestbedWorker,
    TestbedPlugin,
    finish_on_worker,
    run_on_worker,
    started_topic,
)

__all__ = ["RESOURCE", "PLUGIN_NAME", "Finished", "TestbedPlugin", "run_on_worker", "commit_outcome",
           "run_campaign_distributed", "DaskExecutor", "finish_workers", "local_cluster", "TestbedNanny", "testbed_workers",
           "wait_for_workers", "quiet_logs", "check_outcome", "RefusedOutcome", "TestbedCluster", "transport_of"]

#: Seconds a closing worker gets to restore its testbed before its Nanny kills it (Dask's default is 5 s,
#: too short to stop a run and clear a testbed over SSH).
CLOSE_TIMEOUT_S = 180.0
#: The only address a local cluster's processes listen on (scheduler, nannies, workers, dashboard).
LOOPBACK = "127.0.0.1"
#: How often the driver looks for an attempt past its bound (:mod:`bbrlab.campaign.watchdog`), and how long
#: it waits for a result between two looks.
WATCH_INTERVAL_S = 1.0
WATCH_POLL_S = 0.05
#: The file of a hung attempt's record with every thread's stack of its worker.
HANG_STACKS_FILE = "hang-stacks.txt"

#: Bounds on what a worker may send back for one attempt. The largest file a valid run can make is the
#: socket-sample log, at most :data:`~bbrlab.scenario.scenario.MAX_SAMPLE_RECORDS` records of under 1 KiB each (about
#: 700 B measured, docs/sampling.md); the bounds admit that log and keep a rogue or broken worker from filling
#: the driver's disk or memory.
SAMPLE_RECORD_MAX_BYTES = 1024
MAX_FILE_BYTES = MAX_SAMPLE_RECORDS * SAMPLE_RECORD_MAX_BYTES
MAX_OUTCOME_BYTES = MAX_FILE_BYTES + 64 * 2**20  # all files and the metadata together
MAX_FILES = 64
MAX_NAME_CHARS = 128
#: A file name in an outcome: a plain name (no directory, no '..', no leading dot, no NUL, no space).
FILE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")


#: Dask configuration every testbed worker runs with, whatever the machine's says. Dask's statistical profiler
#: (``sys._current_frames()`` every 10 ms in the worker's main thread) deadlocks a Python 3.11 process that
#: starts threads, as a run does for every command (CPython gh-106883, dask/distributed#8616): a task thread
#: stuck in ``Thread.start()`` for good, and with it the testbed (issue 35, tests/system/test_worker_deadlock.py).
WORKER_CONFIG = {"distributed": {"worker": {"profile": {"enabled": False}}}}


class TestbedNanny(Nanny):
    """A Nanny that gives its worker :data:`CLOSE_TIMEOUT_S` to close: the plugin's teardown restores the
    testbed, and a worker killed half-way through would leave it as it was. Its worker runs with
    :data:`WORKER_CONFIG` over the configuration given (no statistical profiler)."""

    def __init__(self, *args, config: dict | None = None, **kwargs):
        import dask.config

        # Nanny lays ``config`` over this process's configuration key by key (not deeply): give it all of it.
        whole = dask.config.merge(dask.config.config, config or {}, WORKER_CONFIG)
        super().__init__(*args, config=whole, **kwargs)

    async def close(self, timeout: float = CLOSE_TIMEOUT_S, reason: str = "nanny-close"):
        """Close the nanny and its worker, giving the worker ``timeout`` seconds (default
        :data:`CLOSE_TIMEOUT_S`) to restore its testbed."""
        return await super().close(timeout=timeout, reason=reason)


class RefusedOutcome(BbrlabError):
    """What a worker sent back is not an outcome of the attempt the driver submitted, or breaks a bound."""


def check_outcome(outcome, run_id: str, attempt: int, token: str, out: str | Path | None = None) -> None:
    """Accept ``outcome`` (what a worker's task returned) only as the :class:`~bbrlab.campaign.attempt.Finished`
    of the attempt the driver submitted: attempt ``attempt`` of ``run_id`` in the campaign of ``token``, with
    plain file names (:data:`FILE_NAME_RE`, at most :data:`MAX_NAME_CHARS`) and bounded sizes (:data:`MAX_FILES`,
    :data:`MAX_FILE_BYTES` each, :data:`MAX_OUTCOME_BYTES` in all). Files handed by path (``staging``, a worker
    on this machine) are checked in place in the campaign ``out`` (:func:`bbrlab.campaign.handoff.check`);
    ``staging`` is then set to the path the driver computed. The attempt it carries is not trusted beyond its run
    id and number: the driver commits its own (:func:`finished_of`). Raises :class:`RefusedOutcome` saying what
    is wrong."""
    if not isinstance(outcome, Finished):
        raise RefusedOutcome(f"the task returned a {type(outcome).__name__}, not a bbrlab Finished")
    named = ((outcome.attempt.run_id, outcome.attempt.attempt) if isinstance(outcome.attempt, Attempt)
             else (None, None))
    if (*named, outcome.token) != (run_id, attempt, token):
        raise RefusedOutcome(f"it names run {_short(named[0])!r} attempt {_short(named[1])} of campaign "
                             f"token {_short(outcome.token)!r}; this task was attempt {attempt} of {run_id!r}")
    if outcome.status not in ("ok", "failed", STOPPED):
        raise RefusedOutcome(f"status {_short(outcome.status)!r} is not ok, failed or {STOPPED}")
    for field in ("reason", "started_at", "ended_at", "testbed", "worker_host"):
        value = getattr(outcome, field)
        if not (value is None and field == "reason") and not (isinstance(value, str) and len(value) <= 4096):
            raise RefusedOutcome(f"its {field} is not a text of at most 4096 characters")
    if outcome.wall_s is not None:
        raise RefusedOutcome("it names a wall time, which only the driver measures")
    if outcome.cpus is not None and not (isinstance(outcome.cpus, list)
                                         and all(isinstance(c, int) for c in outcome.cpus)):
        raise RefusedOutcome("its cpus are not a list of CPU numbers")
    if not isinstance(outcome.metadata, dict):
        raise RefusedOutcome("its metadata is not a mapping")
    try:
        total = len(json.dumps(outcome.metadata))
    except (TypeError, ValueError) as e:
        raise RefusedOutcome(f"its metadata is not JSON: {e}") from None
    if not isinstance(outcome.files, dict) or len(outcome.files) > MAX_FILES:
        raise RefusedOutcome(f"its files are not a mapping of at most {MAX_FILES} files")
    for name, data in outcome.files.items():
        if not (isinstance(name, str) and len(name) <= MAX_NAME_CHARS and FILE_NAME_RE.fullmatch(name)
                and name != rec.RECORD_FILE):
            raise RefusedOutcome(f"file name {_short(name)!r} is not a plain name (letters, digits, '._+-', not "
                                 f"starting with '.', at most {MAX_NAME_CHARS} characters, not {rec.RECORD_FILE})")
        if not isinstance(data, bytes) or len(data) > MAX_FILE_BYTES:
            raise RefusedOutcome(f"file {name!r} is not bytes of at most {MAX_FILE_BYTES // 2**20} MiB")
        total += len(data)
    if total > MAX_OUTCOME_BYTES:
        raise RefusedOutcome(f"its files and metadata are {total} bytes, more than {MAX_OUTCOME_BYTES // 2**20} MiB")
    if outcome.staging is not None:
        if outcome.files or out is None or not isinstance(outcome.staging, Path):
            raise RefusedOutcome("it names a staged directory beside files, or where this driver takes none")
        try:
            outcome.staging = handoff.check(str(outcome.staging), out, run_id, attempt, name_re=FILE_NAME_RE,
                                            max_files=MAX_FILES, max_file_bytes=MAX_FILE_BYTES,
                                            max_total_bytes=MAX_OUTCOME_BYTES - total)
        except handoff.RefusedStaging as e:
            raise RefusedOutcome(str(e)) from None


def _short(value, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def failed_outcome(attempt: Attempt, token: str, reason: str) -> Finished:
    """A failed attempt the driver records itself: the task raised, or what came back was refused."""
    now = rec.now_iso()
    return Finished(attempt, "failed", reason, {}, now, now, token=token)


def receive(client, future, attempt: Attempt, token: str, out: str | Path | None = None) -> Finished:
    """What the task of ``future`` (``attempt``) returned, checked (:func:`check_outcome`); a task that raised or
    returned something refused gives a failed attempt with the reason. A worker without the testbed plugin
    that took the task loses the testbed resource on the scheduler, so it gets no more runs."""
    try:
        outcome = future.result()
    except Exception as e:  # noqa: BLE001 - KilledWorker, a foreign worker, any task error: a failed attempt
        if isinstance(e, NotATestbedWorker):
            withdraw_resource(client, e.address)
        reason = f"the task failed: {type(e).__name__}: {_short(e, 1000)}"
        return failed_outcome(attempt, token, reason)
    try:
        check_outcome(outcome, attempt.run_id, attempt.attempt, token, out)
    except RefusedOutcome as e:
        return failed_outcome(attempt, token, f"the outcome was refused: {e}")
    return outcome


def withdraw_resource(client, address: str) -> None:
    """Tell the scheduler that the worker at ``address`` has no testbed (the resource set to 0): it takes
    no more runs. Said on stderr; a scheduler that refuses is reported, not fatal."""
    try:
        client.run_on_scheduler(_withdraw_on_scheduler, address)
        _warn(f"the worker at {address} has the {RESOURCE} resource but no bbrlab testbed plugin (a plain dask "
              "worker?); it gets no more runs of this campaign")
    except Exception as e:  # noqa: BLE001 - the failed attempt is recorded anyway
        _warn(f"the worker at {address} has no bbrlab testbed plugin and could not be withdrawn: {e}")


def _withdraw_on_scheduler(address: str, dask_scheduler=None) -> bool:
    if address not in dask_scheduler.workers:
        return False
    dask_scheduler.add_resources(worker=address, resources={RESOURCE: 0})
    return True


def _warn(message: str) -> None:
    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
        print(f"bbrlab: warning: {message}", file=sys.stderr)


def transport_of(client) -> str:
    """How the driver talks to the cluster, as the records say it (``metadata.worker.transport``)."""
    address = str(getattr(client.scheduler, "address", "") or "")
    if address.startswith("tls://"):
        return tlsconf.TRANSPORT_TLS
    if address.startswith("tcp://"):
        return tlsconf.TRANSPORT_INSECURE
    return address.split("://", 1)[0] or "unknown"


def finished_of(outcome: Finished, attempt: Attempt, transport: str | None = None) -> Finished:
    """A checked worker result as the loop commits it: the driver's own ``attempt`` (not the one that came
    back), its files, and its metadata with where it ran (``metadata.worker``: testbed, host, CPUs, and
    ``transport`` when given: :class:`~bbrlab.run.campaignadded.WorkerPlace`)."""
    metadata = dict(outcome.metadata)
    metadata["worker"] = recordjson.to_json(WorkerPlace(outcome.testbed, outcome.worker_host, outcome.cpus, transport))
    return replace(outcome, attempt=attempt, metadata=metadata, files=dict(outcome.files))


def commit_outcome(out: Path, spec: CampaignSpec, scenario: Scenario, outcome: Finished,
                   *, transport: str | None = None, mixed: dict | None = None) -> dict:
    """Write a worker's result into the campaign directory, atomically, as the loop does
    (:func:`bbrlab.campaign.loop.commit_finished`). The result must have passed :func:`check_outcome`."""
    attempt = Attempt(outcome.attempt.run_id, outcome.attempt.attempt, scenario, 0)
    return commit_finished(Path(out), spec.name, finished_of(outcome, attempt, transport), mixed)


class DaskExecutor:
    """The executor of a campaign over the testbed workers of Dask ``client``: each attempt is a task asking
    for one unit of :data:`RESOURCE`, so a testbed runs one run at a time, with priority by its place in
    the plan, so each worker takes the next planned run when it is free. What comes back is checked
    (:func:`receive`); a task's error or a refused outcome is a failed attempt; a run this driver stopped
    is dropped. ``close`` cancels what has not run and has every worker finish the campaign
    (:func:`finish_workers`)."""

    def __init__(self, client, context: CampaignContext, *, keep_link: bool = False,
                 bound_s: Callable[[Scenario], float] = watchdog.attempt_bound_s):
        from distributed import as_completed

        self.client, self.context, self.keep_link, self.bound_s = client, context, keep_link, bound_s
        self.transport = transport_of(client)
        self._pending = as_completed()
        self._submitted: dict = {}  # future key -> Attempt: the only results the driver accepts
        self._futures: dict = {}  # future key -> Future, while submitted
        self._started: dict = {}  # future key -> monotonic time its worker said it started (announce_start)
        self._next_watch = 0.0
        self._topic = started_topic(context.token)
        client.subscribe_topic(self._topic, self._on_started)

    def _on_started(self, event) -> None:
        """A worker's :func:`~bbrlab.campaign.worker.announce_start` (in the client's event loop thread)."""
        _, msg = event
        key = msg.get("key") if isinstance(msg, dict) else None
        if isinstance(key, str):  # a task Dask ran again elsewhere (its worker lost) starts its clock again
            self._started[key] = time.monotonic()

    def submit(self, attempt: Attempt) -> None:
        """Send ``attempt`` to whichever testbed worker is free."""
        token = self.context.token
        future = self.client.submit(
            run_on_worker, attempt, self.context, resources={RESOURCE: 1}, priority=-attempt.order, pure=False,
            key=f"bbrlab-{self.context.campaign}-{attempt.run_id}-a{attempt.attempt}-{token[:8]}")
        self._submitted[future.key] = attempt
        self._futures[future.key] = future
        self._pending.add(future)

    def finished(self) -> Iterator[Finished]:
        """Each submitted attempt as its task ends, checked; one that runs past its bound (``bound_s`` of its
        scenario, from when the scheduler first shows it running) ends as a failed attempt (:meth:`_overdue`)."""
        while not self._pending.is_empty():
            if not self._pending.has_ready():
                yield from self._overdue()
                time.sleep(WATCH_POLL_S)
                continue
            future = next(self._pending)
            attempt = self._submitted.pop(future.key, None)
            self._futures.pop(future.key, None)
            self._started.pop(future.key, None)
            if attempt is None:  # abandoned as hung: recorded already
                continue
            outcome = receive(self.client, future, attempt, self.context.token, self.context.out)
            if outcome.status == STOPPED:  # stopped by this driver's own finish: nothing to commit
                continue
            yield finished_of(outcome, attempt, self.transport)

    def _overdue(self) -> Iterator[Finished]:
        """The attempts running past their bound, each ended (:meth:`_abandon`); looks every
        :data:`WATCH_INTERVAL_S`."""
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_INTERVAL_S
        for key, since in list(self._started.items()):
            attempt = self._submitted.get(key)
            if attempt is None:
                self._started.pop(key, None)
            elif now - since > self.bound_s(attempt.scenario):
                yield self._abandon(key, now - since)

    def _abandon(self, key: str, ran_s: float) -> Finished:
        """End the hung attempt ``key``: the scheduler names the worker running it, its task is cancelled (Dask
        does not run it again), that worker's Nanny dumps the worker's stacks and kills it
        (:func:`bbrlab.campaign.watchdog.dump_and_kill`; the Nanny's new worker restores the testbed), and the
        attempt is a failed one carrying the stacks."""
        attempt = self._submitted.pop(key)
        self._started.pop(key, None)
        bound = self.bound_s(attempt.scenario)
        try:
            worker = self.client.run_on_scheduler(_processing_on, key)
            self.client.cancel([self._futures.pop(key)])
            result = RuntimeError("the scheduler shows it running nowhere") if worker is None else \
                self.client.run(watchdog.dump_and_kill, workers=[worker], nanny=True, on_error="return")[worker]
        except Exception as e:  # noqa: BLE001 - the attempt is recorded failed whatever the Nanny says
            worker, result = None, e
        killed = isinstance(result, dict)
        stacks = result.get("stacks", "") if killed else ""
        reason = (f"hung: the attempt ran {ran_s:.1f} s, past its bound of {bound:.0f} s; "
                  + (f"its worker (pid {result.get('pid')}) was killed and restarted, its stacks are in "
                     f"{HANG_STACKS_FILE}" if killed else f"its worker could not be killed: {_short(result, 500)}"))
        _warn(f"{attempt.run_id} attempt {attempt.attempt} {reason}")
        metadata = {"hang": {"bound_s": round(bound, 1), "ran_s": round(ran_s, 2), "worker": worker,
                             "killed_pid": result.get("pid") if killed else None,
                             "stacks_file": HANG_STACKS_FILE if stacks else None}}
        now = rec.now_iso()
        return Finished(attempt, "failed", reason, metadata, now, now,
                        files={HANG_STACKS_FILE: stacks.encode()} if stacks else {})

    def close(self) -> None:
        """Cancel the tasks not run; every worker stops its run in flight and restores its testbed."""
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(self._topic)
        try:
            self.client.cancel(list(self._pending.futures))
        finally:
            finish_workers(self.client, self.context.token, keep_link=self.keep_link)


def _processing_on(key: str, dask_scheduler=None) -> str | None:
    """``run_on_scheduler`` target: the address of the worker running task ``key`` (None: none)."""
    task = dask_scheduler.tasks.get(key)
    return task.processing_on.address if task is not None and task.processing_on is not None else None


def run_campaign_distributed(spec: CampaignSpec, out_dir: str | Path, client, *,
                             options: CampaignOptions = DEFAULT_OPTIONS,
                             on_run: Callable[[dict], None] | None = None, calibrations: dict | None = None,
                             testbeds: list[dict] | None = None,
                             bound_s: Callable[[Scenario], float] = watchdog.attempt_bound_s) -> dict:
    """Run (or resume) ``spec`` into ``out_dir`` on the testbed workers of Dask ``client``: the campaign loop
    (:func:`bbrlab.campaign.loop.drive`) with a :class:`DaskExecutor`, so the same guarantees and return value
    as one testbed; runs go to whichever testbed worker is free.

    ``calibrations`` maps each testbed's name to ``(Calibration, source)``
    (:func:`bbrlab.campaign.preflight.calibrations_for`); empty or None: the records carry no CPU ceiling.
    ``testbeds`` are the workers' testbeds (each ``Testbed.describe()``), checked against those the records
    ran on unless ``options.allow_mixed``. At the end, also when interrupted, every worker finishes the
    campaign: a run in flight is stopped and restored, and unless ``options.keep_link`` the link comes off each
    emulator. Each
    record's ``metadata.worker.transport`` says whether the cluster spoke TLS (:func:`transport_of`). An
    attempt still running ``bound_s(scenario)`` seconds after it started is ended as a hung, failed attempt
    (:mod:`bbrlab.campaign.watchdog`). Raises :class:`BbrlabError` when the cluster has no testbed worker.
    """
    if not testbed_workers(client):
        raise BbrlabError(f"the Dask cluster has no worker with the '{RESOURCE}' resource: start one per testbed "
                          "(bbrlab worker --testbed NAME|FILE --scheduler ADDRESS)")
    out = Path(out_dir)
    context = CampaignContext(token=uuid.uuid4().hex, campaign=spec.name, out=str(out.resolve()),
                              planned=spec.runs, calibrations=dict(calibrations or {}),
                              machine=handoff.machine_key())
    executor = DaskExecutor(client, context, keep_link=options.keep_link, bound_s=bound_s)
    return drive(spec, out, executor, options=options, on_run=on_run, testbeds=testbeds)


def finish_workers(client, token: str, *, keep_link: bool = False) -> list[dict]:
    """Have every testbed worker finish campaign ``token``: its run in flight stopped (restoring the
    testbed), what it may have left cleared, the link taken off unless ``keep_link``. A worker that cannot
    is reported on stderr (its own teardown restores it when it closes)."""
    addresses = list(testbed_workers(client))
    if not addresses:
        return []
    results = client.run(finish_on_worker, token, keep_link, workers=addresses, on_error="return")
    done = []
    for address, result in results.items():
        if isinstance(result, BaseException):
            with contextlib.suppress(OSError):
                print(f"bbrlab: warning: the worker at {address} could not restore its testbed: {result}",
                      file=sys.stderr)
        else:
            done.append(result)
    return done


class TestbedCluster(SpecCluster):
    """The local cluster of one campaign: a :class:`SpecCluster` that removes its TLS files (a private
    temporary directory) when it closes."""

    __test__ = False  # not a pytest test class

    def __init__(self, *args, tls_dir: Path, **kwargs):
        self.tls_dir = Path(tls_dir)
        super().__init__(*args, **kwargs)

    async def _close(self):
        try:
            await super()._close()
        finally:
            shutil.rmtree(self.tls_dir, ignore_errors=True)


def local_cluster(testbeds: list[str], *, run_function: Callable | None = None, dashboard: bool = False,
                  isolate: bool | None = None, cpus: dict[str, list[int]] | None = None) -> TestbedCluster:
    """A Dask cluster on this machine with one single-threaded worker process per testbed (a
    :class:`TestbedNanny` each, so a worker that dies is noticed, restarted, and its task runs again).

    Every process of it (scheduler, nannies, workers, and the dashboard when ``dashboard``) listens on
    127.0.0.1 only, and speaks mutual TLS with a CA and certificate made for this cluster alone
    (:func:`bbrlab.campaign.tls.campaign_files`, in a private temporary directory removed when the cluster
    closes); ``cluster.security`` is what a client needs (``Client(cluster)`` takes it).

    ``isolate`` (default: when more than one local testbed and no ``run_function``) gives each local testbed
    an exclusive CPU partition (:mod:`bbrlab.testbed.isolation`), from ``cpus`` when given (a plan made
    beforehand, :func:`bbrlab.testbed.isolation.plan`); it raises before any worker starts when the
    machine cannot isolate that many.
    """

    from distributed import Scheduler

    quiet_logs()
    if len(set(testbeds)) != len(testbeds):
        raise BbrlabError(f"each testbed can be given once: {testbeds}")
    local = [t for t in testbeds if _is_local_name(t)]
    if isolate is None:
        isolate = run_function is None and len(local) > 1
    if not isolate:
        cpus = {}
    elif cpus is None:
        cpus = isolation.plan(local)
    tls_dir = tlsconf.campaign_dir()  # 0700, this user's only; leftovers of killed campaigns swept
    try:
        security = tlsconf.security(tlsconf.campaign_files(tls_dir))
        on_loopback = {"host": LOOPBACK, "protocol": "tls", "security": security}
        workers = {
            f"testbed-{i}-{name}": {"cls": TestbedNanny, "options": {
                **on_loopback, "nthreads": 1, "resources": {RESOURCE: 1}, "name": f"testbed-{i}-{name}",
                "dashboard": False, "dashboard_address": f"{LOOPBACK}:0",
                "plugins": {TestbedPlugin(name, run_function, cpus.get(name))}}}
            for i, name in enumerate(testbeds)
        }
        scheduler = {"cls": Scheduler, "options": {**on_loopback, "dashboard": bool(dashboard),
                                                   "dashboard_address": f"{LOOPBACK}:0"}}
        return TestbedCluster(workers=workers, scheduler=scheduler, silence_logs=40, name="bbrlab",
                              security=security, tls_dir=tls_dir)
    except BaseException:
        shutil.rmtree(tls_dir, ignore_errors=True)
        raise


def _is_local_name(ref: str) -> bool:
    """A local testbed's name (not a lab's testbed file)."""
    return "/" not in ref and not ref.endswith((".yaml", ".yml")) and not Path(ref).is_file()


def quiet_logs() -> None:
    """Dask logs every connection at INFO; a campaign prints its own progress, so only warnings pass (here and,
    through the environment, in the worker processes this one starts)."""
    import logging
    import os

    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    logging.getLogger("distributed").setLevel(logging.WARNING)


def testbed_workers(client) -> dict[str, dict]:
    """The cluster's workers that offer the testbed resource: ``{address: worker info}``."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return {addr: w for addr, w in info.items() if w.get("resources", {}).get(RESOURCE)}


def wait_for_workers(client, n: int, timeout_s: float = 120.0) -> None:
    """Block until ``n`` testbed workers are connected (their plugins set up), or raise."""
    deadline = time.monotonic() + timeout_s
    while len(testbed_workers(client)) < n:
        if time.monotonic() > deadline:
            raise BbrlabError(f"only {len(testbed_workers(client))} of {n} testbed workers joined within "
                              f"{timeout_s:.0f} s")
        time.sleep(0.2)
