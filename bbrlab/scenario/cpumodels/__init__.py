"""The contention models a scenario can ask for (issue #28), one module each, found by name in :data:`MODELS`.

Each model module holds the model's parameters (a frozen dataclass of its own fields only), their checks, its
run-id tag and the flags other rooms ask (:class:`~.base.ContentionModel`): ``deadline`` (the default),
``cfs-quota``, ``cfs-burst``, ``credit``, ``competing-load``, ``none``. This is the scenario's side, in
:mod:`bbrlab.scenario` so that :class:`~bbrlab.scenario.scenario.Contention` validates without importing
:mod:`bbrlab.contention`; how each model is applied, read back, watched, evidenced, restored and recovered is its
session's, registered under the same names in :data:`bbrlab.contention.models.SESSIONS`. The kernel's limits and
the constants the credit controller shares with a guest stay in :mod:`bbrlab.scenario.contention_models` (a module of
the standard library alone, copied into a guest by tests/system/test_cgroup_v2_guest.py).

A record keeps a contention flat (``period_ms`` beside ``timeslice_ms``): :func:`params_of` turns those flat
fields into a model's parameters, naming a field the model does not take; :func:`params_dict` writes them, leaving
out a parameter added later at its default (deadline's ``deadline_mode``: :func:`~.base.omitted_at_default`).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields

from bbrlab.core.errors import ValidationError

from . import cfs_burst, cfs_quota, competing_load, credit, deadline, none
from .base import UNUSED_TIMESLICE_MS, ContentionModel, NoParams  # noqa: F401 - known from here
from .cfs_burst import BurstParams
from .cfs_quota import CfsParams
from .credit import CreditParams
from .deadline import DeadlineParams

#: A contention's parameters: one of the models' ``params_type`` (tests/unit/scenario/test_contention_models.py
#: checks the union names each of them).
ContentionParams = NoParams | DeadlineParams | CfsParams | BurstParams | CreditParams

#: Every model by name, in the order errors and docs list them.
MODELS: dict[str, ContentionModel] = {m.MODEL.name: m.MODEL for m in (deadline, cfs_quota, cfs_burst, credit,
                                                                        competing_load, none)}
DEFAULT_MODEL = deadline.MODEL.name


def model(name: object, field: str = "contention.model") -> ContentionModel:
    """The model called ``name``; a :class:`ValidationError` on ``field`` listing the models otherwise."""
    if not isinstance(name, str) or name not in MODELS:
        raise ValidationError(field, name, "one of " + ", ".join(MODELS))
    return MODELS[name]


def param_names(m: ContentionModel) -> tuple[str, ...]:
    """The names of ``m``'s own parameters, in their record order."""
    return tuple(f.name for f in fields(m.params_type))


def params_of(m: ContentionModel, given: dict) -> ContentionParams:
    """``m``'s parameters from flat fields (a record's or keywords): a field of another model, or a required one
    missing, is a :class:`ValidationError` naming it."""
    own = param_names(m)
    for name, value in given.items():
        if name not in own and value is not None:
            raise ValidationError(f"contention.{name}", value, _only_with(name))
    required = [f.name for f in fields(m.params_type) if f.default is MISSING and f.default_factory is MISSING]
    for name in required:
        if given.get(name) is None:
            raise ValidationError(f"contention.{name}", None, _only_with(name))
    return m.params_type(**{k: v for k, v in given.items() if k in own and v is not None})


def params_dict(params: ContentionParams) -> dict:
    """A model's parameters as flat record fields, in their declared order; one marked
    :func:`~.base.omitted_at_default` is left out at its default."""
    d = asdict(params)
    for f in fields(params):
        if f.metadata.get("omitted_at_default") and d[f.name] == f.default:
            del d[f.name]
    return d


def _only_with(name: str) -> str:
    """What a parameter of some models allows: which models take it."""
    owners = [m.name for m in MODELS.values() if name in param_names(m)]
    if not owners:
        raise TypeError(f"a contention has no field {name!r}")
    if len(owners) == 1:
        named = any(f.name == name and isinstance(f.default, str) for f in fields(MODELS[owners[0]].params_type))
        return f"{'a name' if named else 'a number'} with model {owners[0]}, none with the others"
    return f"none except for models {', '.join(owners)} (deadline's period is timeslice / share)"
