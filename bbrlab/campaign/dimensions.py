"""The campaign spec's dimensions (#37), each declared once: the lists a spec crosses into its grid.

A :class:`Dimension` says everything the rest of the house needs of one list key: its values' type and unit,
its default (None: the key is required), the check of one value on its own, where a value lands in the
scenario (``link.rtt_ms``), the fragment of the run id that shows it (:data:`bbrlab.scenario.scenario.RUN_ID_FRAGMENTS`;
None: the id's hash alone), its column in the ``runs`` table, whether it belongs to the run identity
(:data:`bbrlab.analysis.runkey.RUN_KEY`, what the fidelity claims and figures group by) and whether
``spec.yaml`` leaves it out at its default (so directories made before it existed keep matching their spec).

:data:`DIMENSIONS` is in the grid's nesting order, outermost first; the contention's dimensions are one block
of it, crossed model by model (:meth:`bbrlab.campaign.spec.CampaignSpec.contentions`). From it the spec takes its
list keys, their defaults, the check of each key on its own, the keys it leaves out at their defaults and the
grid; values are checked in this order too. Adding a dimension is one entry here, the field of the same name in
:class:`~bbrlab.campaign.spec.CampaignSpec` (its default read from here) and whatever the scenario does with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bbrlab.core.errors import ValidationError
from bbrlab.scenario.competition import check_sender_qdisc
from bbrlab.scenario.contention_models import CFS_DEFAULT_PERIOD_MS, CFS_QUOTA_MIN_MS, DEFAULT_CREDIT_S
from bbrlab.scenario.cpumodels import (
    DEFAULT_MODEL,
    BurstParams,
    CfsParams,
    CreditParams,
    cfs_burst,
    cfs_quota,
    credit,
)
from bbrlab.scenario.linksizing import BufferBelowMinimum
from bbrlab.scenario.scenario import Contention, IperfParams, Link, check_cca, check_sender_vcpus
from bbrlab.scenario.workloads import DEFAULT_WORKLOAD, params_type

from .spec_models import check_model_name
from .spec_values import kernel_name, number, rename_field

#: The most values one list may give.
MAX_VALUES = 1000
#: The parts of a scenario a value can land in (``Scenario`` itself for its own fields).
PARTS = ("scenario", "flow", "contention", "link")


@dataclass(frozen=True)
class Dimension:
    """One list key of a campaign spec, crossed into the grid (see the module docstring).

    ``check`` takes one value and raises :class:`ValidationError` if it is not allowed on its own (the error is
    renamed ``key[i]``); what holds only together with other keys is :mod:`bbrlab.campaign.spec_combinations`'.
    ``lands_in`` is ``part.field`` (:data:`PARTS`); ``sets`` gives further fields of that part a value sets
    (a loss's model). ``type`` is each value's: ``str`` (a list of names), ``int`` (whole numbers) or ``float``.
    """

    key: str
    type: type
    unit: str
    default: tuple | None
    check: Callable[[object], object]
    lands_in: str
    id_fragment: str | None
    column: str
    identity: bool
    omitted_default: bool = False
    doc: str = ""
    sets: Callable[[object], dict] | None = None

    @property
    def part(self) -> str:
        """The scenario's part the value lands in: ``link``, ``flow``, ``contention`` or ``scenario``."""
        return self.lands_in.split(".", 1)[0]

    @property
    def field(self) -> str:
        """The field of :attr:`part` the value sets."""
        return self.lands_in.split(".", 1)[1]

    @property
    def required(self) -> bool:
        """Whether a spec must give the key (it has no default)."""
        return self.default is None

    def checked(self, value: object) -> tuple:
        """``value`` (the spec's list) as a tuple, each element checked and named ``key[i]`` in an error; a
        non-list, an empty list, more than :data:`MAX_VALUES` values or a value listed twice are refused."""
        if not isinstance(value, list) or not value:
            raise ValidationError(self.key, value, "a non-empty list, e.g. [1, 10, 20]")
        if len(value) > MAX_VALUES:
            raise ValidationError(self.key, f"{len(value)} values", f"at most {MAX_VALUES} values")
        for i, v in enumerate(value):
            if self.type is not str:
                number(f"{self.key}[{i}]", v, integer=self.type is int)
            try:
                self.check(v)
            except ValidationError as e:
                raise rename_field(e, f"{self.key}[{i}]") from None
        if len(set(value)) != len(value):
            raise ValidationError(self.key, value, "distinct values (a value listed twice would run twice)")
        return tuple(value)

    def fields(self, value: object) -> dict:
        """The fields of :attr:`part` that ``value`` sets: :attr:`field` and any :attr:`sets` gives."""
        return {self.field: value, **(self.sets(value) if self.sets else {})}


def _share_in_range(value: object) -> None:
    """A share on its own: 0 < share <= 100 (whether its period is possible depends on the timeslice)."""
    if not 0 < value <= 100:
        raise ValidationError("contention.cpu_share_pct", value, "0 < cpu_share_pct <= 100 %")


def _buffer_alone(value: object) -> None:
    """A buffer on its own: more than 0 BDP. How small and how large it may be depends on the rate x RTT it
    meets (two frames at least; 1000 BDP or the authors' queue at most), which the links' check names."""
    if not value > 0:
        raise ValidationError("link.buffer_bdp", value, "0 < buffer_bdp (its bounds depend on the rate x RTT, "
                              "checked with them)")


def _floor_later(probe: Callable[[object], object]) -> Callable[[object], object]:
    """``probe`` of one value, leaving a buffer below two frames to the links' check: whether a buffer is large
    enough depends on the rate x RTT it meets, which that check names."""
    def checked(value: object) -> None:
        try:
            probe(value)
        except BufferBelowMinimum:
            pass
    return checked


def _loss_model(value: object) -> dict:
    """A loss above 0 is uniform random loss."""
    return {"loss_model": "uniform" if value else "none"}


#: Every dimension, in the grid's nesting order (outermost first).
DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("kernels", str, "", (), kernel_name, "scenario.kernel", "kernel", "kernel", True, omitted_default=True,
              doc="the sender's kernels (debian-6.1, debian-5.10, debian-6.12 or a kernel's path); empty: whatever "
                  "the sender runs"),
    Dimension("sender_vcpus", int, "vCPUs", (), check_sender_vcpus, "scenario.sender_vcpus", "vcpus", "sender_vcpus",
              True, omitted_default=True,
              doc="the sender VM's vCPUs, 1 to 8 (the local testbed reboots the sender once per kernel and count); "
                  "empty: whatever the sender has"),
    Dimension("workloads", str, "", (DEFAULT_WORKLOAD,), lambda v: params_type(v).name, "flow.workload",
              "workload", "workload", True, omitted_default=True,
              doc="iperf3 (bulk transfer of duration_s) and/or rsync (a file over SSH)"),
    Dimension("ccas", str, "", None, lambda v: check_cca(v, "flow.cca"), "flow.cca", "cca", "cca", True,
              doc="the congestion controls"),
    Dimension("contention_models", str, "", (DEFAULT_MODEL,), check_model_name, "contention.model", "contention",
              "contention_mode", True, omitted_default=True,
              doc="deadline, cfs-quota, cfs-burst, credit, competing-load, none (docs/contention.md)"),
    Dimension("timeslices_ms", float, "ms", None, lambda v: Contention(v, 100), "contention.timeslice_ms",
              "contention", "timeslice_ms", True, doc="deadline's runtime per period"),
    Dimension("cpu_shares_pct", float, "%", None, _share_in_range, "contention.cpu_share_pct", "contention",
              "cpu_share_pct", True, doc="the vCPUs' share of a CPU; 100 = no policy"),
    Dimension("cfs_periods_ms", float, "ms", (CFS_DEFAULT_PERIOD_MS,),
              lambda v: Contention(1, 100, cfs_quota.MODEL.name, CfsParams(v)), "contention.period_ms",
              "contention", "cfs_period_ms", True, omitted_default=True,
              doc="cfs-quota, cfs-burst: quota = share x period, 1 to 1000 ms"),
    Dimension("cfs_bursts_ms", float, "ms", (CFS_QUOTA_MIN_MS,),
              lambda v: Contention(1, 100, cfs_burst.MODEL.name, BurstParams(burst_ms=v)), "contention.burst_ms",
              "contention", "cfs_burst_ms", True, omitted_default=True,
              doc="cfs-burst: the burst per vCPU, 0 < burst <= quota"),
    Dimension("credits_s", float, "CPU-s", (DEFAULT_CREDIT_S,),
              lambda v: Contention(1, 100, credit.MODEL.name, CreditParams(credit_s=v)), "contention.credit_s",
              "contention", "credit_s", True, omitted_default=True,
              doc="credit: the balance at the start, CPU-seconds (0 to 3600)"),
    Dimension("credit_shares_pct", float, "%", (), _share_in_range, "contention.cpu_share_pct", "contention",
              "cpu_share_pct", True, omitted_default=True,
              doc="credit: its baselines instead of cpu_shares_pct; empty: cpu_shares_pct"),
    Dimension("rtts_ms", float, "ms", None, _floor_later(lambda v: Link(rtt_ms=v, rate_mbit=100)), "link.rtt_ms",
              "rtt", "rtt_ms", True, doc="the round-trip time"),
    Dimension("rates_mbit", float, "Mbit/s", None, _floor_later(lambda v: Link(rtt_ms=10, rate_mbit=v)),
              "link.rate_mbit", "rate", "rate_mbit", True, doc="the bottleneck's rate"),
    Dimension("buffers_bdp", float, "BDP", (1.0,), _buffer_alone, "link.buffer_bdp", None, "buffer_bdp", True,
              doc="the buffer asked (up to 1000, or to the authors' queue where more)"),
    Dimension("queues", str, "", ("bbrlab",), lambda v: Link(rtt_ms=10, rate_mbit=100, queue=v), "link.queue",
              "queue", "queue_mode", True, omitted_default=True,
              doc="the emulator's qdisc tree: bbrlab (netem -> tbf) and/or authors (tbf -> netem; docs/link.md)"),
    Dimension("losses_pct", float, "%", (0.0,),
              lambda v: Link(rtt_ms=10, rate_mbit=100, loss_pct=v, **_loss_model(v)), "link.loss_pct", None,
              "loss_pct", True, doc="> 0 means uniform random loss (at most 50)", sets=_loss_model),
    Dimension("streams", int, "", (1,), lambda v: IperfParams(streams=v), "flow.streams", None, "streams", True,
              doc="parallel connections of the run's own flow"),
    Dimension("sender_qdiscs", str, "", ("default",), check_sender_qdisc, "scenario.sender_qdisc", "competition",
              "sender_qdisc", True, omitted_default=True,
              doc="default and/or fq: the root qdisc of the sender's experiment interface (pacing)"),
)

#: Each dimension by its key.
BY_KEY: dict[str, Dimension] = {d.key: d for d in DIMENSIONS}


def default_of(key: str) -> tuple:
    """The default of dimension ``key`` (for :class:`~bbrlab.campaign.spec.CampaignSpec`'s field of that name)."""
    return BY_KEY[key].default


def identity_columns() -> tuple[str, ...]:
    """The ``runs`` columns of the dimensions in the run identity, each once, in the table's order."""
    return tuple(dict.fromkeys(d.column for d in DIMENSIONS if d.identity))
