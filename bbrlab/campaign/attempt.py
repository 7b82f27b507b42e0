"""One attempt of one planned run: what the campaign loop asks an executor to run (:class:`Attempt`), the one
way to run it (:func:`run_attempt`), and what comes back (:class:`Finished`), whichever executor ran it.

Both executors run an attempt through :func:`run_attempt`: :class:`bbrlab.campaign.loop.InProcess` in this
process, and a Dask testbed worker in its task (:func:`bbrlab.campaign.worker.run_on_worker`), which sends the
:class:`Finished` back to the driver pickled. Everything in both classes therefore pickles (a
:class:`~bbrlab.scenario.scenario.Scenario`, a :class:`~bbrlab.run.blockboot.BlockBoot`, paths, plain values); the
driver trusts nothing of what a worker sends before :func:`bbrlab.campaign.distributed.check_outcome`.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.run import record as rec
from bbrlab.run.blockboot import BlockBoot
from bbrlab.run.runmeta import failure_reason, of_error
from bbrlab.scenario.scenario import Scenario

from . import watchdog
from .sameness import MixedTestbed

#: The status of an attempt whose run its campaign's driver stopped (a Dask worker's; never committed).
STOPPED = "stopped"

#: A run function: ``run_fn(scenario, staging_dir, *, run_id, attempt) -> metadata`` writes the run's files into
#: ``staging_dir`` and returns the record's ``metadata``; it raises when the run fails (the exception may carry
#: the metadata measured so far, see :mod:`bbrlab.run.runmeta`). With blocks it also gets ``block``.
RunFunction = Callable[..., dict]


@dataclass(frozen=True)
class Attempt:
    """One attempt of one planned run: what an executor is asked to run."""

    run_id: str
    attempt: int  # 1, 2, ... numbered across processes (``failed/<run_id>.a<N>``)
    scenario: Scenario
    order: int  # the run's place in the plan (0 first): executors run lower places first
    block: BlockBoot | None = None  # the run's block when the spec has blocks (a fresh boot per block)


@dataclass
class Finished:
    """What running one attempt gives back, for the loop to commit: the one result type of every executor.

    The run's files are either in ``staging`` (a directory on the driver's machine: this process's, or one a
    worker there handed over by path) or in ``files`` (a worker elsewhere sent them). A Dask worker fills in
    where it ran (``testbed``, ``worker_host``, ``cpus``) and its campaign's ``token``; ``testbed`` also names
    the testbed on the progress line. ``wall_s`` is the attempt's wall time when this process ran it."""

    attempt: Attempt
    status: str  # ok | failed | stopped (STOPPED: a worker's run its driver stopped, never committed)
    reason: str | None
    metadata: dict
    started_at: str
    ended_at: str
    staging: Path | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    testbed: str | None = None
    worker_host: str | None = None
    cpus: list[int] | None = None  # the worker testbed's CPU partition, None when it has none
    token: str | None = None  # the campaign's (CampaignContext.token): the driver accepts only its own
    wall_s: float | None = None


def run_attempt(run_fn: RunFunction, attempt: Attempt, staging: Path, *, bound_s: float | None = None,
                campaign_dir: Path | None = None) -> Finished:
    """Run ``attempt`` with ``run_fn`` into ``staging`` and say how it went; the one way an attempt is run.

    Any exception of the run is its failure (the reason says where it was raised; the metadata is what it
    measured), except an interruption, which propagates. With ``bound_s`` the attempt is ended as a failed one
    past that many seconds, with every thread's stack (:func:`bbrlab.campaign.watchdog.bounded`; in this
    process's main thread only). With ``campaign_dir`` (this process writes the campaign directory, and
    ``staging`` lies in it) what ends the campaign rather than the attempt propagates too, ``staging`` removed:
    :class:`~bbrlab.campaign.sameness.MixedTestbed`, and a full disk as :class:`~bbrlab.run.record.DiskFull`.
    Without it (a Dask worker) every other exception is the attempt's failure, for the driver to record."""
    started = rec.now_iso()
    try:
        with watchdog.bounded(bound_s, staging) if bound_s is not None else contextlib.nullcontext():
            block = {} if attempt.block is None else {"block": attempt.block}
            metadata = run_fn(attempt.scenario, staging, run_id=attempt.run_id, attempt=attempt.attempt, **block)
        status, reason = "ok", None
    except watchdog.AttemptHung as e:  # the run's context managers restored the testbed on the way out
        status, reason, metadata = "failed", str(e), {"hang": {"bound_s": round(e.bound_s, 1)}}
    except Exception as e:  # noqa: BLE001 - any failure of one run is recorded, the campaign goes on
        if campaign_dir is not None and isinstance(e, MixedTestbed):
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if campaign_dir is not None and rec.no_space(e):  # not the run's failure: nothing more can be recorded
            raise rec.disk_full(campaign_dir, attempt.run_id, staging) from e
        status, reason, metadata = "failed", failure_reason(e), of_error(e)
    except BaseException:  # an interruption: the attempt is not counted, and nothing of it stays behind
        if campaign_dir is not None:  # (a notebook's kernel lives on: it would look running)
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return Finished(attempt, status, reason, metadata, started, rec.now_iso(), staging=staging)
