"""What a campaign adds to a run's metadata after the run (``RunMetadata.added``), as typed records.

The campaign (:mod:`bbrlab.campaign`, a room above this one) writes these keys into the record beside what the
run measured; they are declared here so the run record can read them back typed. Each key is there only
when the campaign added it: a field None here is left out of the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core import recordjson


@dataclass(frozen=True)
class MixedMark:
    """``metadata.mixed`` (``--allow-mixed``): the campaign was let go on across testbeds that differ (``allowed``),
    and how they differ (:func:`bbrlab.campaign.sameness.mixed_marker`)."""

    allowed: bool
    differences: list[str]


@dataclass(frozen=True)
class WorkerPlace:
    """``metadata.worker`` (a campaign over several testbeds): the ``testbed`` whose Dask worker ran the run, that
    worker's ``host``, its CPU partition (``cpus``; None: not isolated) and, when the driver knew it, how it
    talked to the cluster (``transport``; left out otherwise) (:func:`bbrlab.campaign.distributed.finished_of`)."""

    testbed: str | None
    host: str | None
    cpus: list[int] | None
    transport: str | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Its fields, ``transport`` left out while None (:func:`bbrlab.core.recordjson.record_layout`)."""
        return recordjson.record_layout(source, handler)


@dataclass(frozen=True)
class HostGuardVerdict:
    """``metadata.host_guard``: the host guard's limit (``max_other_busy_pct``), what the run measured outside
    the testbed (``other_busy_pct``, % of all the host's CPUs) and whether that was above it (``busy``)
    (:func:`bbrlab.campaign.hostguard.verdict`)."""

    max_other_busy_pct: float
    other_busy_pct: float
    busy: bool


@dataclass(frozen=True)
class SearchPlace:
    """``metadata.search``: a threshold search's run's place in its interleaved order (``position``) and the
    search's ``round`` it belongs to (:meth:`bbrlab.campaign.search.SearchGate.record_of`)."""

    position: int
    round: int


@dataclass(frozen=True)
class CampaignAdded:
    """The keys a campaign adds to a run's metadata, each None (and left out) unless added, in the order the
    campaign adds them: ``hang`` (a hung attempt's failed record), ``worker`` (as the driver takes a worker's
    result), ``host_guard`` (the guard's verdict on an ok run), ``search`` (a search's run) and ``mixed``
    (as the record is written).

    ``hang`` stays a JSON object: a hung attempt ended in this process writes only ``bound_s``
    (:func:`bbrlab.campaign.attempt.run_attempt`), one a Dask driver ended writes ``bound_s``, ``ran_s``,
    ``worker``, ``killed_pid`` and ``stacks_file``, the last three null when unknown
    (:mod:`bbrlab.campaign.distributed`): its keys are sometimes absent, sometimes null, which no field can
    write back as it was (:mod:`bbrlab.core.recordjson`)."""

    hang: dict | None = recordjson.left_out_when_none()
    worker: WorkerPlace | None = recordjson.left_out_when_none()
    host_guard: HostGuardVerdict | None = recordjson.left_out_when_none()
    search: SearchPlace | None = recordjson.left_out_when_none()
    mixed: MixedMark | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The keys added, the others left out (:func:`bbrlab.core.recordjson.record_layout`)."""
        return recordjson.record_layout(source, handler)
