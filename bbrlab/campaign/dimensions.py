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

Most dimensions are lists of scalars. A *mapping* dimension (``named`` set: ``sender_sysctls``, ``cca_params``)
gives named lists instead, ``{name: [values]}``; the spec holds them as :data:`NamedLists` and each grid point
takes one assignment of them, a tuple of ``(name, value)`` pairs (:func:`assignments`: several names cross too).
A mapping dimension ``keyed_by`` another one names its lists ``<value>.<name>`` and crosses each value of that
dimension with that value's lists alone: ``cca_params`` crosses bbr2b's runs with bbr2b's parameters and leaves
the runs of the other CCAs one point each.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from bbrlab.core.errors import ValidationError
from bbrlab.kernel.params import param_limit
from bbrlab.scenario import knobs
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
from bbrlab.scenario.cpumodels.deadline import DEFAULT_DEADLINE_MODE, check_deadline_mode
from bbrlab.scenario.linksizing import BufferBelowMinimum
from bbrlab.scenario.scenario import Contention, IperfParams, Link, check_cca, check_sender_vcpus
from bbrlab.scenario.workloads import DEFAULT_WORKLOAD, params_type

from .spec_models import check_model_name
from .spec_values import kernel_name, number, rename_field

#: The most values one list may give.
MAX_VALUES = 1000
#: The parts of a scenario a value can land in (``Scenario`` itself for its own fields).
PARTS = ("scenario", "flow", "contention", "link")
#: A mapping dimension's value as the spec holds it: each name with its values, the names in order.
NamedLists = tuple[tuple[str, tuple], ...]


def assignments(lists: NamedLists) -> list[tuple[tuple[str, object], ...]]:
    """Every combination of one value of each named list, as ``(name, value)`` pairs in the lists' order; one
    empty assignment for no lists."""
    names = [name for name, _ in lists]
    return [tuple(zip(names, combo, strict=True)) for combo in itertools.product(*(values for _, values in lists))]


@dataclass(frozen=True)
class Dimension:
    """One list key of a campaign spec, crossed into the grid (see the module docstring).

    ``check`` takes one value and raises :class:`ValidationError` if it is not allowed on its own (the error is
    renamed ``key[i]``); what holds only together with other keys is :mod:`bbrlab.campaign.spec_combinations`'.
    ``lands_in`` is ``part.field`` (:data:`PARTS`); ``sets`` gives further fields of that part a value sets
    (a loss's model). ``type`` is each value's: ``str`` (a list of names), ``int`` (whole numbers) or ``float``.
    A mapping dimension (see the module docstring) has ``named``, which reads and checks the spec's mapping into
    :data:`NamedLists` (its errors name ``key.name[i]``), ``spec_value``, which writes them back as the spec
    gives them, ``schema``, its JSON Schema, and, crossed with another dimension's values, ``keyed_by``.
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
    named: Callable[[object], NamedLists] | None = None
    spec_value: Callable[[NamedLists], object] | None = None
    schema: dict | None = dataclasses.field(default=None, compare=False)  # compared by key, hashed without it
    keyed_by: str | None = None

    @property
    def mapping(self) -> bool:
        """Whether the spec gives named lists (``{name: [values]}``) rather than one list."""
        return self.named is not None

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
        non-list, an empty list, more than :data:`MAX_VALUES` values or a value listed twice are refused. A
        mapping dimension's value: its :data:`NamedLists` (:attr:`named`)."""
        if self.named is not None:
            return self.named(value)
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

    def stored(self, value: tuple) -> object:
        """The spec's field ``value`` as ``spec.yaml`` writes it: a list, or a mapping dimension's mapping."""
        return self.spec_value(value) if self.spec_value is not None else list(value)

    def axis(self, value: tuple, key_value: object = None) -> list:
        """The values the grid crosses: the list's, or a mapping dimension's :func:`assignments` (keyed: those of
        the lists named ``<key_value>.<name>``, the names without their head)."""
        if self.named is None:
            return list(value)
        if self.keyed_by is not None:
            head = f"{key_value}."
            value = tuple((name[len(head):], values) for name, values in value if name.startswith(head))
        return assignments(value)


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


def _lists(field_name: str, value: object, check: Callable[[str, object, str], object]) -> NamedLists:
    """A mapping of names to lists (``{name: [values]}``) as :data:`NamedLists`: each list as a dimension's
    (non-empty, at most :data:`MAX_VALUES` values, each once), each value checked by ``check(name, value,
    field_name)``; an error names ``field_name.name[i]``."""
    if not isinstance(value, dict):
        raise ValidationError(field_name, value, "a mapping of names to lists of whole numbers, e.g. {name: [1, 2]}")
    out = []
    for name, values in value.items():
        where = f"{field_name}.{name}"
        if not isinstance(values, list) or not values or len(values) > MAX_VALUES:
            raise ValidationError(where, values, f"a non-empty list of at most {MAX_VALUES} whole numbers, e.g. [1, 2]")
        for i, v in enumerate(values):
            try:
                check(name, v, field_name)
            except ValidationError as e:
                raise rename_field(e, f"{where}[{i}]") from None
        if len(set(values)) != len(values):
            raise ValidationError(where, values, "distinct values (a value listed twice would run twice)")
        out.append((str(name), tuple(values)))
    return tuple(sorted(out))


def _lists_schema() -> dict:
    """The JSON Schema of named lists of whole numbers."""
    return {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                                                       "maxItems": MAX_VALUES, "uniqueItems": True}}


def _module_param(name: str, value: object, field_name: str) -> int:
    """A module parameter's value: a whole number from 0 to its bound (:func:`bbrlab.kernel.params.param_limit`)."""
    knobs.check_param(name, value, field_name)
    if value > param_limit(name):
        raise ValidationError(f"{field_name}.{name}", value, f"a whole number, 0 <= {name} <= {param_limit(name)} "
                              "(bbrlab.kernel.params)")
    return value


def _cca_params(value: object) -> NamedLists:
    """``cca_params`` (``{cca: {param: [values]}}``) as :data:`NamedLists` named ``<cca>.<param>``."""
    if not isinstance(value, dict):
        raise ValidationError("cca_params", value, "a mapping of CCAs to their module's parameters, e.g. "
                              "{bbr2b: {deficit_gain: [512, 739]}}")
    out: list = []
    for cca, params in value.items():
        check_cca(cca, f"cca_params.{cca}")
        if not isinstance(params, dict) or not params:
            raise ValidationError(f"cca_params.{cca}", params, "a mapping of its module's parameters to lists of "
                                  "whole numbers, e.g. {deficit_gain: [512, 739]}")
        out += [(f"{cca}.{name}", values) for name, values in _lists(f"cca_params.{cca}", params, _module_param)]
    return tuple(sorted(out))


def _cca_params_value(lists: NamedLists) -> dict:
    """``cca_params`` as the spec gives it: ``{cca: {param: [values]}}``."""
    out: dict = {}
    for name, values in lists:
        cca, _, param = name.partition(".")
        out.setdefault(cca, {})[param] = list(values)
    return out


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
    Dimension("cca_params", int, "", (), lambda v: v, "scenario.cca_params", "cca_params", "cca_params", True,
              omitted_default=True, named=_cca_params, spec_value=_cca_params_value,
              schema={"type": "object", "additionalProperties": _lists_schema()}, keyed_by="ccas",
              doc="module parameters per CCA, e.g. {bbr2b: {deficit_gain: [512, 739]}}: set for that CCA's runs "
                  "alone and restored after each"),
    Dimension("contention_models", str, "", (DEFAULT_MODEL,), check_model_name, "contention.model", "contention",
              "contention_mode", True, omitted_default=True,
              doc="deadline, cfs-quota, cfs-burst, credit, competing-load, none (docs/contention.md)"),
    Dimension("timeslices_ms", float, "ms", None, lambda v: Contention(v, 100), "contention.timeslice_ms",
              "contention", "timeslice_ms", True, doc="deadline's runtime per period"),
    Dimension("deadline_modes", str, "", (DEFAULT_DEADLINE_MODE,), check_deadline_mode, "contention.deadline_mode",
              "contention", "deadline_mode", True, omitted_default=True,
              doc="deadline: constrained (deadline = runtime, the paper's) and/or implicit (deadline = period: the "
                  "runtime is a budget for anywhere in the period; docs/contention.md)"),
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
    Dimension("sender_sysctls", int, "", (), lambda v: v, "scenario.sender_sysctls", "sysctls", "sender_sysctls",
              True, omitted_default=True, named=lambda v: _lists("sender_sysctls", v, knobs.check_sysctl),
              spec_value=lambda lists: {name: list(values) for name, values in lists}, schema=_lists_schema(),
              doc="sysctls set in the sender for the run and restored after it, each with its values, e.g. "
                  "{net.ipv4.tcp_limit_output_bytes: [262144, 1048576]} (bbrlab.scenario.knobs.SENDER_SYSCTLS)"),
)

#: Each dimension by its key.
BY_KEY: dict[str, Dimension] = {d.key: d for d in DIMENSIONS}


def default_of(key: str) -> tuple:
    """The default of dimension ``key`` (for :class:`~bbrlab.campaign.spec.CampaignSpec`'s field of that name)."""
    return BY_KEY[key].default


def identity_columns() -> tuple[str, ...]:
    """The ``runs`` columns of the dimensions in the run identity, each once, in the table's order."""
    return tuple(dict.fromkeys(d.column for d in DIMENSIONS if d.identity))
