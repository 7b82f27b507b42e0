"""What every contention model provides on the scenario's side (:class:`ContentionModel`), the empty parameters
of the models that take none (:class:`NoParams`), and the number check they share.

A model here is data and checks only: the standard library and :mod:`bbrlab.core` (the scenario validates a
contention without importing :mod:`bbrlab.contention`, which holds how each model is applied).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from bbrlab.core.errors import ValidationError

#: The timeslice recorded for models that do not use one (competing-load, none), so their run ids are stable [ms].
UNUSED_TIMESLICE_MS = 1.0


def omitted_at_default(default: Any) -> Any:
    """A parameter's dataclass field that a record leaves out at ``default`` (a parameter added after runs were
    recorded without it: their JSON and run ids stay as they were; :func:`bbrlab.scenario.cpumodels.params_dict`)."""
    return dataclasses.field(default=default, metadata={"omitted_at_default": True})


@dataclass(frozen=True)
class NoParams:
    """The parameters of a model that has none of its own (deadline, competing-load, none): the timeslice and
    the share, which every contention carries, are all it needs."""


class ContentionModel(Protocol):
    """One contention model as a scenario sees it: its name, its parameters' type and their checks, what it
    puts in a run id and in a campaign spec's grid, and what it is (the flags the other rooms ask instead of
    comparing names). How it is applied, read back, watched, evidenced, restored and recovered is its session's
    (:class:`bbrlab.contention.models.ContentionSession`, one module per model in :mod:`bbrlab.contention`)."""

    #: The name a scenario, a record and a spec give it (``cfs-quota``).
    name: ClassVar[str]
    #: A frozen dataclass of this model's own parameters only (:class:`NoParams` when it has none).
    params_type: ClassVar[type]
    #: SCHED_DEADLINE with the contention's timeslice as its runtime: the one model that uses ``timeslice_ms``
    #: (a calibration keys it by its timeslice, a run checks its threads ran under the deadline policy).
    uses_timeslice: ClassVar[bool]
    #: The vCPU threads in a cgroup of their own under CFS bandwidth control (the model takes ``period_ms``).
    uses_cgroup: ClassVar[bool]
    #: Applied on the machine that runs the testbed only (cgroups, busy loops), not on another hypervisor host.
    local_only: ClassVar[bool]
    #: Busy threads compete with the vCPU thread (:attr:`bbrlab.scenario.scenario.Contention.load_threads`).
    adds_load: ClassVar[bool]
    #: The share this model always runs at (none: 100), or None when a spec crosses it with its shares.
    fixed_share_pct: ClassVar[float | None]
    #: The campaign spec's lists this model crosses with the shares, in :meth:`grid_point`'s order.
    spec_keys: ClassVar[tuple[str, ...]]
    #: The spec's list of shares this model crosses with instead of ``cpu_shares_pct`` when it is given.
    own_shares_key: ClassVar[str | None]

    def validate(self, share_pct: float, timeslice_ms: float, params) -> None:
        """Check the model's parameters with the share and timeslice; each error names the field."""

    def id_head(self, timeslice_ms: float, params) -> str:
        """The run id's tag of this contention before ``-sh<share>`` (``ts1ms``, ``cfs100ms``, ``load``)."""

    def grid_point(self, share_pct: float, values: list) -> tuple[float, object]:
        """``(timeslice_ms, params)`` of a spec's grid point at ``share_pct`` with the values of :attr:`spec_keys`."""


def number(field: str, value: object) -> float:
    """``value`` as a float, or a :class:`ValidationError` on ``field`` (bools and NaN are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValidationError(field, value, "a number")
    return float(value)
