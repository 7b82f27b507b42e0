"""Campaigns over several testbeds at once, on Dask distributed: the driver's side.

One Dask worker owns one testbed for the whole campaign (:mod:`bbrlab.testbed_worker`: the plugin that
takes its lock, keeps one :class:`~bbrlab.runner.Runner` so the link stays set between runs, and restores
the testbed when the worker closes). Each worker offers one unit of the resource :data:`RESOURCE`, and
every run is submitted asking for one unit, so a testbed runs one run at a time.

The driver (the ``bbrlab campaign run`` process) stays the single source of truth: it alone writes the
campaign directory. A worker runs a scenario into a temporary directory of its own and returns the
files and the record's metadata; the driver commits them atomically (:mod:`bbrlab.record`), retries
failed attempts, and stops after too many consecutive failures, exactly as :func:`bbrlab.campaign.run_campaign`
does for one testbed. A worker lost mid-run (killed, machine gone) loses nothing: Dask runs that task
again on another worker, and only a returned result is committed. A driver killed at any moment resumes
with ``campaign run`` as always (completed runs are in ``runs/``; nothing else counts). A driver that
stops (Ctrl-C, SIGTERM, SIGHUP, or the campaign's end) first has every worker finish its campaign:
the run in flight is interrupted and restores the testbed, the link comes off
(:meth:`~bbrlab.testbed_worker.TestbedPlugin.finish`).

Runs are submitted in plan order with decreasing priority, so each worker takes the next planned run
when it is free and the blocked-random order is kept as far as several testbeds allow.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from distributed import Nanny

from . import record as rec
from .campaign import CampaignSpec, FailureStreak, directory_lock, mixed_marker, prepare, status
from .errors import BbrlabError
from .scenario import Scenario
from .signals import interruptible
from .testbed_worker import (
    PLUGIN_NAME,
    RESOURCE,
    STOPPED,
    CampaignContext,
    Outcome,
    TestbedPlugin,
    finish_on_worker,
    run_on_worker,
)

__all__ = ["RESOURCE", "PLUGIN_NAME", "Outcome", "TestbedPlugin", "run_on_worker", "commit_outcome",
           "run_campaign_distributed", "finish_workers", "local_cluster", "TestbedNanny", "testbed_workers",
           "wait_for_workers", "quiet_logs"]

#: Seconds a closing worker gets to restore its testbed before its Nanny kills it (Dask's default is 5 s,
#: too short to stop a run and clear a testbed over SSH).
CLOSE_TIMEOUT_S = 180.0


class TestbedNanny(Nanny):
    """A Nanny that gives its worker :data:`CLOSE_TIMEOUT_S` to close: the plugin's teardown restores the
    testbed, and a worker killed half-way through would leave it as it was."""

    async def close(self, timeout: float = CLOSE_TIMEOUT_S, reason: str = "nanny-close"):
        return await super().close(timeout=timeout, reason=reason)


def commit_outcome(out: Path, spec: CampaignSpec, scenario: Scenario, outcome: Outcome, mixed: dict | None = None
                   ) -> dict:
    """Write a worker's outcome into the campaign directory, atomically (the driver's side); with ``mixed``
    (:func:`bbrlab.campaign.check_same_testbed`) the record says the campaign was let mix testbeds."""
    staging = rec.staging_dir(out, outcome.run_id)
    for name, data in outcome.files.items():
        rec.write_file(staging / name, data)
    metadata = dict(outcome.metadata)
    metadata["worker"] = {"testbed": outcome.testbed, "host": outcome.worker_host, "cpus": outcome.cpus}
    if mixed is not None:
        metadata["mixed"] = mixed_marker(mixed)
    record = rec.build_record(run_id=outcome.run_id, campaign=spec.name, status=outcome.status,
                              reason=outcome.reason, attempt=outcome.attempt, started_at=outcome.started_at,
                              ended_at=outcome.ended_at, scenario=scenario.to_dict(), metadata=metadata)
    rec.commit(staging, out, record)
    return record


def run_campaign_distributed(spec: CampaignSpec, out_dir: str | Path, client, *, progress: bool = True,
                             retry_failed: bool = False, max_consecutive_failures: int = 5,
                             on_run: Callable[[dict], None] | None = None, calibrations: dict | None = None,
                             keep_link: bool = False, mixed: dict | None = None) -> dict:
    """Run (or resume) ``spec`` into ``out_dir`` on the testbed workers of Dask ``client``.

    The same guarantees and return value as :func:`bbrlab.campaign.run_campaign`; runs go to whichever
    testbed worker is free. ``calibrations`` maps each testbed's name to ``(Calibration, source)``
    (:func:`bbrlab.scaleout.calibrations_for`); empty or None: the records carry no CPU ceiling. At the
    end, also when interrupted, every worker finishes the campaign (:func:`finish_workers`): a run in
    flight is stopped and restored, and unless ``keep_link`` the link comes off each emulator.
    Raises :class:`BbrlabError` when the cluster has no testbed worker.
    """
    from distributed import as_completed

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not testbed_workers(client):
        raise BbrlabError(f"the Dask cluster has no worker with the '{RESOURCE}' resource: start one per testbed "
                          "(bbrlab worker --testbed NAME|FILE --scheduler ADDRESS)")
    with directory_lock(out), interruptible():
        plan = prepare(spec, out)
        rec.clear_tmp(out)
        by_id = {r["run_id"]: Scenario.from_dict(r["scenario"]) for r in plan["runs"]}
        todo = [run_id for run_id in by_id if not rec.is_complete(out, run_id)]
        attempts = {r: len(rec.failed_attempts(out, r)) for r in todo}
        last = {r: attempts[r] + spec.max_attempts if retry_failed else spec.max_attempts for r in todo}
        todo = [r for r in todo if attempts[r] < last[r]]
        order = {run_id: i for i, run_id in enumerate(by_id)}
        context = CampaignContext(token=uuid.uuid4().hex, campaign=spec.name, out=str(out.resolve()),
                                  planned=len(by_id), calibrations=dict(calibrations or {}))
        bar = _progress_bar(len(by_id), len(by_id) - len(todo), spec.name, progress)

        def submit(run_id: str):
            attempts[run_id] += 1
            return client.submit(run_on_worker, by_id[run_id].to_dict(), run_id, attempts[run_id], context,
                                 order[run_id] + 1, resources={RESOURCE: 1}, priority=-order[run_id], pure=False,
                                 key=f"bbrlab-{spec.name}-{run_id}-a{attempts[run_id]}-{context.token[:8]}")

        pending = as_completed()
        streak = FailureStreak(max_consecutive_failures)
        try:
            for run_id in todo:
                pending.add(submit(run_id))
            for future in pending:
                outcome: Outcome = future.result()
                if outcome.status == STOPPED:  # stopped by this driver's own finish: nothing to commit
                    continue
                record = commit_outcome(out, spec, by_id[outcome.run_id], outcome, mixed)
                if record["status"] != "ok" and attempts[outcome.run_id] < last[outcome.run_id]:
                    pending.add(submit(outcome.run_id))
                    continue
                bar.set_postfix_str(f"{outcome.run_id} {record['status']} on {outcome.testbed}")
                bar.update(1)
                if on_run:
                    on_run(record)
                streak.add(record)
        finally:
            try:
                client.cancel(list(pending.futures))
                finish_workers(client, context.token, keep_link=keep_link)
            finally:
                with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                    bar.close()
    return status(out)


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


def local_cluster(testbeds: list[str], *, run_function: Callable | None = None, dashboard: bool = False,
                  isolate: bool | None = None, cpus: dict[str, list[int]] | None = None):
    """A Dask cluster on this machine with one single-threaded worker process per testbed (a
    :class:`TestbedNanny` each, so a worker that dies is noticed, restarted, and its task runs again).

    ``isolate`` (default: when more than one local testbed and no ``run_function``) gives each local testbed
    an exclusive CPU partition (:mod:`bbrlab.testbed.isolation`), from ``cpus`` when given (a plan made
    beforehand, :func:`bbrlab.testbed.isolation.plan`); it raises before any worker starts when the
    machine cannot isolate that many.
    """
    from distributed import Scheduler, SpecCluster

    from .testbed import isolation

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
    workers = {
        f"testbed-{i}-{name}": {"cls": TestbedNanny, "options": {
            "nthreads": 1, "resources": {RESOURCE: 1}, "name": f"testbed-{i}-{name}",
            "plugins": {TestbedPlugin(name, run_function, cpus.get(name))}}}
        for i, name in enumerate(testbeds)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0" if dashboard else None}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40, name="bbrlab")


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


def _progress_bar(total: int, initial: int, name: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="run", disable=not enabled, dynamic_ncols=True)
