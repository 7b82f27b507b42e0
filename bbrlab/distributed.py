"""Campaigns over several testbeds at once, on Dask distributed.

One Dask worker owns one testbed for the whole campaign: a worker plugin (:class:`TestbedPlugin`) takes
the testbed's lock, keeps one :class:`~bbrlab.runner.Runner` (so the link stays set between runs) and,
when the worker closes, restores the testbed. Each worker offers one unit of the resource
:data:`RESOURCE`, and every run is submitted asking for one unit, so a worker runs one run at a time.

The driver (the ``bbrlab campaign run`` process) stays the single source of truth: it alone writes the
campaign directory. A worker runs a scenario into a temporary directory of its own and returns the
files and the record's metadata; the driver commits them atomically (:mod:`bbrlab.record`), retries
failed attempts, and stops after too many consecutive failures, exactly as :func:`bbrlab.campaign.run_campaign`
does for one testbed. A worker lost mid-run (killed, machine gone) loses nothing: Dask runs that task
again on another worker, and only a returned result is committed. A driver killed at any moment resumes
with ``campaign run`` as always (completed runs are in ``runs/``; nothing else counts).

Runs are submitted in plan order with decreasing priority, so each worker takes the next planned run
when it is free and the blocked-random order is kept as far as several testbeds allow.
"""

from __future__ import annotations

import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from distributed import WorkerPlugin

from . import record as rec
from .campaign import CampaignAborted, CampaignSpec, directory_lock, failure_reason, prepare, status
from .errors import BbrlabError
from .scenario import Scenario
from .signals import interruptible

#: The Dask worker resource that stands for "one testbed": each testbed worker has exactly one.
RESOURCE = "bbrlab-testbed"
PLUGIN_NAME = "bbrlab-testbed"


@dataclass
class Outcome:
    """What a worker sends back for one attempt: enough for the driver to commit it."""

    run_id: str
    attempt: int
    status: str  # ok | failed
    reason: str | None
    metadata: dict
    files: dict[str, bytes]
    started_at: str
    ended_at: str
    testbed: str
    worker_host: str


class TestbedPlugin(WorkerPlugin):
    """Worker plugin: the testbed this worker owns, its lock and its :class:`~bbrlab.runner.Runner`.

    ``testbed`` is a local testbed's name or a lab's testbed file, as for ``bbrlab campaign run``.
    ``run_function`` replaces the runner (tests and benchmarks: a run function without a testbed).
    """

    name = PLUGIN_NAME

    def __init__(self, testbed: str, run_function: Callable | None = None, cpus: list[int] | None = None):
        self.testbed_ref = testbed
        self.run_function = run_function
        self.cpus = cpus  # a local testbed's CPU partition (bbrlab.testbed.isolation), None: not isolated
        self.testbed = None
        self.runner = None
        self.partition = None
        self._lock = None

    def setup(self, worker=None) -> None:
        if self.run_function is not None:
            self.runner = self.run_function
            return
        from . import testbed as testbed_mod
        from .recovery import recover
        from .runner import Runner
        from .testbed import isolation

        self.testbed = testbed_mod.load(self.testbed_ref)
        self._lock = testbed_mod.testbed_lock(self.testbed.name, timeout_s=60)
        self._lock.__enter__()
        recover(self.testbed)  # a deadline policy left behind would keep its thread from moving
        if self.cpus is not None and self.testbed.kind == "local":
            pids = [pid for pid in self.testbed.local.qemu_pids.values() if pid]
            self.partition = isolation.isolate_testbed(self.testbed.name, self.cpus, pids)
        self.runner = Runner(self.testbed)

    def teardown(self, worker=None) -> None:
        """Restore the testbed: whatever a run left (a task still running when the worker closes) is cleared."""
        if self.testbed is None:
            return
        from .recovery import recover
        from .testbed import isolation

        self.testbed = self.runner.testbed  # the runner's own, also after it rebooted the sender into a kernel
        try:
            recover(self.testbed)
            self.runner.close()
        finally:
            try:
                if self.partition is not None:
                    isolation.remove(self.partition)
            finally:
                self.testbed.close()
                if self._lock is not None:
                    self._lock.__exit__(None, None, None)

    @property
    def label(self) -> str:
        return self.testbed.name if self.testbed is not None else str(self.testbed_ref)


def run_on_worker(scenario: dict, run_id: str, attempt: int) -> Outcome:
    """The task: one attempt of one run on this worker's testbed (never raises for the run's own failure)."""
    from distributed import get_worker

    from .runmeta import of_error

    plugin: TestbedPlugin = get_worker().plugins[PLUGIN_NAME]
    sc = Scenario.from_dict(scenario)
    started = rec.now_iso()
    with tempfile.TemporaryDirectory(prefix="bbrlab-worker-") as staging:
        try:
            metadata = plugin.runner(sc, Path(staging), run_id=run_id, attempt=attempt)
            status_, reason = "ok", None
        except Exception as e:  # noqa: BLE001 - the reason (with where) travels to the driver, which records it
            metadata, status_, reason = of_error(e), "failed", failure_reason(e)
        files = {p.name: p.read_bytes() for p in Path(staging).iterdir() if p.is_file()}
    return Outcome(run_id, attempt, status_, reason, metadata, files, started, rec.now_iso(), plugin.label,
                   socket.gethostname())


def commit_outcome(out: Path, spec: CampaignSpec, scenario: Scenario, outcome: Outcome) -> dict:
    """Write a worker's outcome into the campaign directory, atomically (the driver's side)."""
    staging = rec.staging_dir(out, outcome.run_id)
    for name, data in outcome.files.items():
        rec.write_file(staging / name, data)
    metadata = dict(outcome.metadata)
    metadata["worker"] = {"testbed": outcome.testbed, "host": outcome.worker_host}
    record = rec.build_record(run_id=outcome.run_id, campaign=spec.name, status=outcome.status,
                              reason=outcome.reason, attempt=outcome.attempt, started_at=outcome.started_at,
                              ended_at=outcome.ended_at, scenario=scenario.to_dict(), metadata=metadata)
    rec.commit(staging, out, record)
    return record


def run_campaign_distributed(spec: CampaignSpec, out_dir: str | Path, client, *, progress: bool = True,
                             retry_failed: bool = False, max_consecutive_failures: int = 5,
                             on_run: Callable[[dict], None] | None = None) -> dict:
    """Run (or resume) ``spec`` into ``out_dir`` on the testbed workers of Dask ``client``.

    The same guarantees and return value as :func:`bbrlab.campaign.run_campaign`; runs go to whichever
    testbed worker is free. Raises :class:`BbrlabError` when the cluster has no testbed worker.
    """
    from distributed import as_completed

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    workers = testbed_workers(client)
    if not workers:
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
        bar = _progress_bar(len(by_id), len(by_id) - len(todo), spec.name, progress)

        def submit(run_id: str):
            attempts[run_id] += 1
            return client.submit(run_on_worker, by_id[run_id].to_dict(), run_id, attempts[run_id],
                                 resources={RESOURCE: 1}, priority=-order[run_id], pure=False,
                                 key=f"bbrlab-{spec.name}-{run_id}-a{attempts[run_id]}")

        pending = as_completed([submit(r) for r in todo])
        failed_in_a_row = 0
        try:
            for future in pending:
                outcome: Outcome = future.result()
                record = commit_outcome(out, spec, by_id[outcome.run_id], outcome)
                if record["status"] != "ok" and attempts[outcome.run_id] < last[outcome.run_id]:
                    pending.add(submit(outcome.run_id))
                    continue
                bar.set_postfix_str(f"{outcome.run_id} {record['status']} on {outcome.testbed}")
                bar.update(1)
                if on_run:
                    on_run(record)
                failed_in_a_row = failed_in_a_row + 1 if record["status"] != "ok" else 0
                if failed_in_a_row >= max_consecutive_failures:
                    raise CampaignAborted(
                        f"{failed_in_a_row} runs in a row failed every attempt; last: {record['reason']}. "
                        "Fix the cause, then run again (add --retry-failed to retry those runs)")
        finally:
            client.cancel(list(pending.futures))
            bar.close()
    return status(out)


def local_cluster(testbeds: list[str], *, run_function: Callable | None = None, dashboard: bool = False,
                  isolate: bool | None = None):
    """A Dask cluster on this machine with one single-threaded worker process per testbed (a Nanny each,
    so a worker that dies is noticed and its task runs again elsewhere).

    ``isolate`` (default: when more than one local testbed and no ``run_function``) gives each local testbed
    an exclusive CPU partition (:mod:`bbrlab.testbed.isolation`); it raises before any worker starts when the
    machine cannot isolate that many.
    """
    from distributed import Nanny, Scheduler, SpecCluster

    from .testbed import isolation

    quiet_logs()
    if len(set(testbeds)) != len(testbeds):
        raise BbrlabError(f"each testbed can be given once: {testbeds}")
    local = [t for t in testbeds if _is_local_name(t)]
    if isolate is None:
        isolate = run_function is None and len(local) > 1
    cpus = isolation.plan(local) if isolate else {}
    workers = {
        f"testbed-{i}-{name}": {"cls": Nanny, "options": {
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
    info = client.scheduler_info()["workers"]
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
