"""One testbed on one Dask worker: the worker plugin that owns it, the task that runs one attempt on it,
and stopping a run in flight when the campaign's driver stops.

A worker offers one unit of the resource :data:`RESOURCE` and every run asks for one, so a testbed runs
one run at a time. :class:`TestbedPlugin` takes the testbed's lock when the worker starts, clears what a
killed predecessor left (:func:`bbrlab.run.recovery.recover`), moves a local testbed into its CPU partition
when it has one (:mod:`bbrlab.testbed.isolation`) and keeps one :class:`~bbrlab.run.runner.Runner` for the
worker's life; when the worker closes it restores the testbed and lets it go.

Stopping. A run executes in the worker's task thread, where no signal arrives. When the driver stops
(Ctrl-C, SIGTERM, SIGHUP, or the campaign's end) it asks each worker to :meth:`~TestbedPlugin.finish`
its campaign: queued runs of that campaign are refused, and the run in flight gets
:class:`StopRequested` raised in its thread (:func:`bbrlab.core.signals.raise_in_thread`), so its context
managers restore the deadline policy, the sampler, the server and the link exactly as a signal does in a
single-testbed campaign; then what may be left is cleared. The run is not recorded (the driver commits
only results it received) and runs again on resume. A worker started by a Nanny (its own process)
ignores SIGINT and SIGHUP: a Ctrl-C in the terminal reaches the whole process group, and the driver,
not each worker on its own, decides how the campaign stops.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from distributed import WorkerPlugin

from bbrlab import testbed as testbed_mod
from bbrlab.core import recordjson
from bbrlab.core.signals import Interrupted, clear_pending, raise_in_thread
from bbrlab.run import record as rec
from bbrlab.run.ceiling import CalibrationMismatch
from bbrlab.run.recovery import recover
from bbrlab.run.runner import Runner
from bbrlab.testbed import hostlock, isolation, target
from bbrlab.testbed.lock import set_activity

from . import handoff
from .attempt import STOPPED, Attempt, Finished, run_attempt
from .preflight import TestbedCheck, check_testbed
from .spec import CampaignSpec
from .watchdog import arm_stack_dump

#: The Dask worker resource that stands for "one testbed": each testbed worker has exactly one.
RESOURCE = "bbrlab-testbed"
PLUGIN_NAME = "bbrlab-testbed"
#: How long :meth:`TestbedPlugin.finish` waits for an interrupted run to restore and end.
STOP_TIMEOUT_S = 60.0
#: How long a worker waits for the scheduler to take an attempt's start (:func:`announce_start`).
ANNOUNCE_TIMEOUT_S = 30.0


class StopRequested(Interrupted):
    """Raised in a worker's running run when the campaign's driver stops it (an :class:`Interrupted`:
    ``except Exception`` does not swallow it and the attempt is not counted)."""

    def __init__(self) -> None:
        BaseException.__init__(self, "stopped by the campaign's driver")
        self.signum = signal.SIGINT


@dataclass(frozen=True)
class CampaignContext:
    """What every task of one driver's campaign carries to the worker that runs it.

    ``token`` is unique per driver process and campaign, so stopping one campaign never touches another's
    run on a shared cluster; ``calibrations`` maps a testbed's name to its calibration and the source text
    a record names (:mod:`bbrlab.run.ceiling`); a testbed missing from a non-empty mapping runs no run.
    """

    token: str
    campaign: str
    out: str
    planned: int
    calibrations: dict = field(default_factory=dict)
    machine: str | None = None  # the driver's machine and boot (handoff.machine_key): a worker there hands files by path


@dataclass
class _Current:
    token: str | None
    thread_id: int


class TestbedPlugin(WorkerPlugin):
    """Worker plugin: the testbed this worker owns, its lock and its :class:`~bbrlab.run.runner.Runner`.

    ``testbed`` is a local testbed's name or a lab's testbed file, as for ``bbrlab campaign run``;
    ``cpus``, a local testbed's CPU partition (None: not isolated). ``run_function`` replaces the runner
    (tests and benchmarks: a run function that needs no testbed).
    """

    name = PLUGIN_NAME
    __test__ = False  # not a pytest test class

    def __init__(self, testbed: str, run_function: Callable | None = None, cpus: list[int] | None = None):
        self.testbed_ref = testbed
        self.run_function = run_function
        self.cpus = cpus
        self.testbed = None
        self.runner = None
        self.partition = None
        self._lock = None
        self._new_state()

    def _new_state(self) -> None:
        self._guard = threading.Lock()  # guards _current and _stopped (held only for moments)
        self._busy = threading.Lock()  # held by the running run, and by finish() while it restores
        self._current: _Current | None = None
        self._stopped: set[str] = set()
        self.leaving = False  # the worker is closing: a run stopped now runs again on another worker

    def __getstate__(self) -> dict:  # the plugin travels to the worker process before setup
        state = dict(self.__dict__)
        for key in ("_guard", "_busy", "_current", "_stopped", "leaving"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._new_state()

    # -- the worker's life ------------------------------------------------------------------------
    def setup(self, worker=None) -> None:
        """Take the testbed when the worker starts: its lock, its state, a lab's host locks; clear what an
        earlier run left, isolate a local testbed in ``cpus``, make its runner. Under a Nanny, SIGINT and
        SIGHUP are ignored (the driver decides) and every thread's stack is dumped on the watchdog's signal
        (:func:`bbrlab.campaign.watchdog.arm_stack_dump`); a failure releases what was taken and propagates."""
        if worker is not None and getattr(worker, "nanny", None) and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGHUP):  # the driver (or bbrlab worker's Nanny) decides
                signal.signal(sig, signal.SIG_IGN)
            arm_stack_dump(worker.local_directory)  # for the driver's watchdog, through the Nanny
        if self.run_function is not None:
            self.runner = self.run_function
            return

        try:  # the testbed's lock first, then its state; a lab's own hosts are locked too (hostlock)
            self._lock = contextlib.ExitStack()
            self._lock.enter_context(testbed_mod.testbed_lock(target.lock_name(self.testbed_ref), timeout_s=60))
            self.testbed = testbed_mod.load(self.testbed_ref)
            self._lock.enter_context(hostlock.holding(self.testbed, activity="bbrlab worker", timeout_s=60))
            recover(self.testbed)  # a deadline policy left behind would keep its thread from moving
            if self.cpus is not None and self.testbed.kind == "local":
                pids = [pid for pid in self.testbed.local.qemu_pids.values() if pid]
                self.partition = isolation.isolate_testbed(self.testbed.name, self.cpus, pids)
            self.runner = Runner(self.testbed)
        except BaseException:
            self._release()
            raise

    def teardown(self, worker=None) -> None:
        """Restore the testbed: a run still in flight is stopped, whatever it left is cleared, the link comes
        off, the partition goes, the lock is released."""
        self.leaving = True
        self.stop(None)
        if self.testbed is None:
            return

        try:
            if self.runner is not None:
                self.testbed = self.runner.testbed  # the runner's own, also after it rebooted the sender
                recover(self.testbed)
                self.runner.close()
        finally:
            self._release()

    def _release(self) -> None:
        try:
            if self.partition is not None:
                isolation.remove(self.partition)
                self.partition = None
        finally:
            try:
                if self.testbed is not None:
                    self.testbed.close()
            finally:
                if self._lock is not None:
                    self._lock.close()
                    self._lock = None

    @property
    def label(self) -> str:
        """The testbed's name for results and progress lines (the ``testbed`` given, until it is loaded)."""
        return self.testbed.name if self.testbed is not None else str(self.testbed_ref)

    # -- one run --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self, context: CampaignContext | None) -> Iterator[None]:
        """The ``with`` block runs one attempt: it holds the testbed and may be stopped by :meth:`stop`
        (raises :class:`StopRequested` at once when the campaign was stopped already)."""
        token = context.token if context else None
        with self._busy:
            try:
                with self._guard:
                    if token is not None and token in self._stopped:
                        raise StopRequested()
                    self._current = _Current(token, threading.get_ident())
                yield
            finally:
                self._leave()

    def _leave(self) -> None:
        """No longer stoppable: forget the run, and drop a stop that was sent but not yet delivered."""
        while True:
            try:
                with self._guard:
                    self._current = None
                    clear_pending()
                return
            except StopRequested:  # delivered on the way out: the run is over anyway
                continue

    def prepared(self, context: CampaignContext | None, run_id: str, attempt: int, index: int | None) -> Callable:
        """The run function for one attempt of ``context``'s campaign: the runner with the campaign's
        calibration for this testbed (raises when the campaign has calibrations but none for it), the run
        announced on the testbed's lock for ``bbrlab testbed status``."""
        if self.testbed is None or context is None:
            return self.runner

        calibrations = context.calibrations or {}
        name = self.runner.testbed.name
        if calibrations and name not in calibrations:
            raise CalibrationMismatch(f"the campaign's calibrations name testbeds {sorted(calibrations)}, not "
                                      f"{name!r} (a worker that joined after the campaign started?)")
        self.runner.calibration, self.runner.calibration_source = calibrations.get(name, (None, None))
        with contextlib.suppress(Exception):  # bbrlab testbed status reads it; no reason to fail a run
            set_activity(name, "campaign run", campaign=context.campaign, out=context.out, run_id=run_id,
                         attempt=attempt, index=index, planned=context.planned, worker=socket.gethostname())
        return self.runner

    # -- stopping -------------------------------------------------------------------------------
    def stop(self, token: str | None, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop campaign ``token`` here (None: whatever runs): its queued runs are refused from now on and its
        run in flight is interrupted; wait until that run has restored and ended. True when one was."""
        with self._guard:
            if token is not None:
                self._stopped.add(token)
            current = self._current
            hit = current is not None and (token is None or current.token == token)
            if hit:
                raise_in_thread(current.thread_id, StopRequested)
        if hit and self._busy.acquire(timeout=timeout_s):
            self._busy.release()
        return hit

    def finish(self, token: str, keep_link: bool = False) -> dict:
        """The end of campaign ``token`` on this worker: stop its run in flight (if any), clear what that run
        may have left, and take the link off the emulator unless ``keep_link``. What was done, for the driver."""
        interrupted = self.stop(token)
        done = {"testbed": self.label, "interrupted": interrupted, "recovered": None, "link_cleared": False}
        if self.testbed is None:
            return done

        if not self._busy.acquire(timeout=STOP_TIMEOUT_S):  # another campaign's run: leave it its link
            return done
        try:
            if interrupted:
                done["recovered"] = recordjson.to_json(recover(self.runner.testbed))  # as the records hold it
            if not keep_link:
                self.runner.close()
                done["link_cleared"] = True
        finally:
            self._busy.release()
        return done


class NotATestbedWorker(RuntimeError):
    """A task of a campaign reached a worker without :class:`TestbedPlugin` (a plain ``dask worker`` that
    offers the resource): it owns no testbed. ``address`` is that worker's."""

    def __init__(self, address: str):
        super().__init__(address)
        self.address = address

    def __str__(self) -> str:
        return (f"the worker at {self.address} offers the {RESOURCE} resource but has no bbrlab testbed plugin "
                "(a plain dask worker, not bbrlab worker): it owns no testbed")


def plugin() -> TestbedPlugin:
    """This worker's :class:`TestbedPlugin` (inside a task or a ``client.run`` function); raises
    :class:`NotATestbedWorker` on a worker without one."""
    from distributed import get_worker

    worker = get_worker()
    found = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(found, TestbedPlugin):
        raise NotATestbedWorker(worker.address)
    return found


def run_on_worker(attempt: Attempt, context: CampaignContext | None = None) -> Finished:
    """The task: ``attempt`` on this worker's testbed (:func:`bbrlab.campaign.attempt.run_attempt`), its
    files sent back in the result or, on the driver's machine, handed over by path. Never raises for the run's
    own failure. A run its driver stopped returns status :data:`STOPPED` (never committed); when the worker
    itself is closing it raises Dask's ``Reschedule`` instead, and the run goes to another testbed."""
    from distributed import Reschedule

    owner = plugin()
    started = rec.now_iso()
    by_path = context is not None and handoff.same_machine(context.machine)
    with _staging(context, attempt.run_id, attempt.attempt, by_path) as staging:
        try:
            with owner.running(context):
                announce_start(context)

                def run_fn(scenario, staging_dir, **kw):  # the calibration's lookup fails the attempt, not the task
                    return owner.prepared(context, attempt.run_id, attempt.attempt, attempt.order + 1)(
                        scenario, staging_dir, **kw)

                finished = run_attempt(run_fn, attempt, staging)
        except StopRequested as e:
            if owner.leaving:  # this worker is closing (bbrlab worker stopped): the run belongs elsewhere
                raise Reschedule() from None
            finished = Finished(attempt, STOPPED, str(e), {}, started, rec.now_iso())  # nothing to commit
            if by_path:
                handoff.discard(staging)
        finished.staging = staging if by_path and finished.status != STOPPED else None
        if not by_path and finished.status != STOPPED:
            finished.files = {p.name: p.read_bytes() for p in staging.iterdir() if p.is_file()}
    finished.started_at, finished.ended_at = started, rec.now_iso()  # the wait for the testbed included
    finished.testbed, finished.worker_host = owner.label, socket.gethostname()
    finished.cpus = list(owner.partition.cpus) if owner.partition is not None else None
    finished.token = context.token if context else None
    return finished


@contextlib.contextmanager
def _staging(context: CampaignContext | None, run_id: str, attempt: int, by_path: bool) -> Iterator[Path]:
    """Where the attempt writes its files: on the driver's machine, a directory in the campaign that the
    driver commits by path (removed here only when the attempt raised past this worker); else a temporary one
    whose files travel in the result."""
    if not by_path:
        with tempfile.TemporaryDirectory(prefix="bbrlab-worker-") as staging:
            yield Path(staging)
        return
    staging = handoff.stage(context.out, run_id, attempt)
    try:
        yield staging
    except BaseException:
        handoff.discard(staging)
        raise


def started_topic(token: str) -> str:
    """The Dask event topic on which the workers of campaign ``token`` say that an attempt started."""
    return f"bbrlab-started-{token}"


def announce_start(context: CampaignContext | None) -> None:
    """Tell the driver (a Dask event, :func:`started_topic`) that this task's attempt now runs on this testbed:
    its bound counts from here (:mod:`bbrlab.campaign.watchdog`). A round trip to the scheduler, so the event
    is out before the run starts (a run that hangs at once may never let the worker send anything again)."""
    if context is None:
        return
    from distributed import get_worker
    from distributed.utils import sync

    worker = get_worker()
    sync(worker.loop, worker.scheduler.log_event, topic=started_topic(context.token),
         msg={"key": worker.get_current_task()}, callback_timeout=ANNOUNCE_TIMEOUT_S)


async def finish_on_worker(token: str, keep_link: bool = False, dask_worker=None) -> dict:
    """``client.run`` target: :meth:`TestbedPlugin.finish` off the worker's event loop (it waits for a run)."""
    import asyncio

    owner = dask_worker.plugins.get(PLUGIN_NAME)
    if owner is None:
        return {"testbed": None}
    return await asyncio.to_thread(owner.finish, token, keep_link)


async def check_on_worker(spec: dict, dask_worker=None) -> dict:
    """``client.run`` target: check campaign ``spec`` against this worker's testbed (nothing changes);
    returns :func:`bbrlab.campaign.preflight.check_testbed`'s description, or raises its error; None on a worker without
    the testbed plugin."""
    import asyncio

    owner = dask_worker.plugins.get(PLUGIN_NAME)
    if not isinstance(owner, TestbedPlugin):
        return None  # a worker without the plugin: it owns no testbed (the driver withdraws it)
    if owner.testbed is None:  # a stand-in run function (tests, benchmarks): nothing to check
        return TestbedCheck(owner.label, "none", socket.gethostname(), {})
    return await asyncio.to_thread(check_testbed, CampaignSpec.from_dict(spec), owner.runner.testbed)
