"""Campaign spec checks that hold only across keys: the number of runs, each link of the grid against the
qdiscs' kernel limits, the sampler's load, rsync's single stream and the extra flows
(:func:`check_combinations`, called by :func:`bbrlab.campaign.spec.load_spec` once every key passed on its own)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from bbrlab.core.errors import ValidationError
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario, check_sampling_load
from bbrlab.scenario.workloads import DEFAULT_WORKLOAD, params_type

from .dimensions import DIMENSIONS
from .spec_models import check_contentions

#: At most this many runs per campaign (grid points x repetitions): 100000 runs of 20 s take 25 days.
MAX_RUNS = 100_000
#: The Link fields a combination check can name, and the spec list each comes from.
_LINK_LISTS = {"link.rate_mbit": "rates_mbit", "link.rtt_ms": "rtts_ms", "link.buffer_bdp": "buffers_bdp",
               "link.queue": "queues"}


class CombinedSpec(Protocol):
    """What the checks across keys read of a campaign spec (:class:`bbrlab.campaign.spec.CampaignSpec` has it):
    named here so that this module needs the spec's shape, not the spec module (which calls it)."""

    workloads: Sequence[str]
    streams: Sequence[int]
    ccas: Sequence[str]
    cca_params: Sequence
    flows: Sequence
    sample_ms: int | None
    sampler: str
    duration_s: float
    transfer_timeout_s: float
    rates_mbit: Sequence[float]
    rtts_ms: Sequence[float]
    buffers_bdp: Sequence[float]
    queues: Sequence[str]

    @property
    def runs(self) -> int:
        """Grid points x repetitions."""

    def link(self, rate, rtt, buf, loss, queue: str = "bbrlab") -> Link:
        """The link of one grid point."""

    def flow(self, workload: str, cca: str, streams: int) -> Flow:
        """The flow of one grid point."""

    def workload_params(self, workload: str, streams: int):
        """The parameters of one workload at one stream count, from the spec's keys."""


def check_combinations(spec: CombinedSpec) -> None:
    """What is invalid only together: the number of runs, a deadline period out of the kernel's range
    (timeslice / share), a link beyond the qdiscs' kernel limits (rate x RTT x buffer), rsync over several
    streams."""
    if spec.runs > MAX_RUNS:
        raise ValidationError("grid x repetitions", spec.runs,
                              f"at most {MAX_RUNS} runs (the product of the list lengths x repetitions); "
                              "split the campaign")
    for i, workload in enumerate(spec.workloads):
        only = params_type(workload).fixed.get("streams")  # rsync's one SSH connection
        for j, streams in enumerate(spec.streams if only is not None else ()):
            if streams != only[0]:
                raise ValidationError(f"streams[{j}] with workloads[{i}]", streams,
                                      f"{only[1]}; run other stream counts in an {DEFAULT_WORKLOAD}-only campaign")
    check_contentions(spec)
    _check_links(spec)
    _check_sampling(spec)
    _check_flows(spec)
    _check_keyed(spec)


def _check_keyed(spec: CombinedSpec) -> None:
    """A mapping dimension keyed by another (``cca_params`` by ``ccas``) names only that dimension's values: a
    CCA's parameters with no run of that CCA would never be set."""
    for d in (d for d in DIMENSIONS if d.keyed_by is not None):
        given = getattr(spec, d.keyed_by)
        for head in dict.fromkeys(name.partition(".")[0] for name, _ in getattr(spec, d.key)):
            if head not in given:
                raise ValidationError(f"{d.key}.{head}", head, f"one of {d.keyed_by} ({', '.join(given)}): its "
                                      f"lists apply to the runs of that value alone")


def _check_flows(spec: CombinedSpec) -> None:
    """The extra flows beside each workload's flow 0 (iperf3 only; each starting before flow 0 ends)."""
    if not spec.flows:
        return
    for i, workload in enumerate(spec.workloads):
        try:
            Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), spec.flow(workload, spec.ccas[0], 1),
                     flows=spec.flows)
        except ValidationError as e:
            raise ValidationError(f"{e.field} with duration_s" if params_type(workload).competes else
                                  f"flows with workloads[{i}]", e.value, e.allowed) from None


def _check_sampling(spec: CombinedSpec) -> None:
    """A sampled spec: every stream count within the sampler's port cap, and samples x streams over each
    workload's duration (rsync: its timeout) within :data:`bbrlab.scenario.scenario.MAX_SAMPLE_RECORDS`."""
    if spec.sample_ms is None:
        return
    for j, streams in enumerate(spec.streams):
        for workload in spec.workloads:
            field, seconds = spec.workload_params(workload).sampled_span  # iperf3's duration, rsync's timeout
            check_sampling_load(spec.sample_ms, streams, seconds, spec.sampler,
                                fields=("sample_ms", f"streams[{j}]", field.removeprefix("flow.")))


def _check_links(spec: CombinedSpec) -> None:
    """Every rate x RTT x buffer x queue tree builds a :class:`Link`, which checks the kernel's limits of the
    qdiscs and the buffer's bounds (each loss was checked on its own: loss changes no size or time in the
    qdiscs). The queue tree is named in an error only when the spec lists one besides bbrlab's."""
    keys = ("rates_mbit", "rtts_ms", "buffers_bdp", "queues")
    indexed = [list(enumerate(getattr(spec, key))) for key in keys]
    for (i, rate), (j, rtt), (k, buf), (q, queue) in itertools.product(*indexed):
        try:
            spec.link(rate, rtt, buf, 0, queue)
        except ValidationError as e:
            index = {"rates_mbit": i, "rtts_ms": j, "buffers_bdp": k, "queues": q}
            if spec.queues == ("bbrlab",):
                del index["queues"]
            lead = _LINK_LISTS.get(e.field, "buffers_bdp")
            others = " and ".join(f"{key}[{n}]" for key, n in index.items() if key != lead)
            values = (rate, rtt, buf) if "queues" not in index else (rate, rtt, buf, queue)
            raise ValidationError(f"{lead}[{index[lead]}] with {others}", values, e.allowed) from None
