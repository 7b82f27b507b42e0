"""What a flow's workload is asked to do: one module per workload (``iperf``, ``rsync``), each a frozen
parameters type, found by its name in :data:`PARAMS`.

A :class:`~bbrlab.scenario.scenario.Flow` carries one parameters object (``flow.params``) and no fields of the
other workloads. :data:`PARAMS` maps each workload's name to its type; :mod:`bbrlab.run.workloads` runs them,
keyed by the same names. The flow's record keeps the flat form it always had (``duration_s``, ``streams``;
``workload``, ``file_mb``, ``transfer_timeout_s``): :func:`params_of` reads it, and accepts another
workload's field only at the value it is recorded with or defaulted to (:attr:`WorkloadParams.fixed`).
"""

from __future__ import annotations

from dataclasses import fields

from bbrlab.core.errors import ValidationError

from .base import (  # noqa: F401 - the workloads' defaults, known from here
    DEFAULT_DURATION_S,
    DEFAULT_FILE_MB,
    DEFAULT_TRANSFER_TIMEOUT_S,
    MAX_FILE_MB,
    WorkloadParams,
)
from .iperf import IperfParams
from .rsync import RsyncParams

#: Each workload's parameters type by its name; the first is the default (a record without ``workload``).
PARAMS: dict[str, type] = {p.name: p for p in (IperfParams, RsyncParams)}
DEFAULT_WORKLOAD = next(iter(PARAMS))
#: What a flow can carry: iperf3's bulk transfer, or a file copied with rsync over SSH.
WORKLOADS = tuple(PARAMS)


def params_type(workload: object) -> type:
    """The parameters type of the workload named ``workload``; a :class:`ValidationError` naming
    ``flow.workload`` for any other."""
    if not isinstance(workload, str) or workload not in PARAMS:
        raise ValidationError("flow.workload", workload, f"one of {', '.join(WORKLOADS)}")
    return PARAMS[workload]


def is_params(value: object) -> bool:
    """Whether ``value`` is a parameters object of a registered workload."""
    return PARAMS.get(getattr(value, "name", None)) is type(value)


def params_of(workload: object = DEFAULT_WORKLOAD, **record) -> WorkloadParams:
    """The parameters of ``workload`` from a record's flat fields (:meth:`WorkloadParams.record_fields`'s form),
    each checked; another workload's field is accepted only at its :attr:`~WorkloadParams.fixed` value."""
    cls = params_type(workload)
    own = {f.name for f in fields(cls)}
    unknown = set(record) - own - set(cls.fixed)
    if unknown:
        raise TypeError(f"a flow has no field {sorted(unknown)[0]!r}")
    params = cls(**{k: v for k, v in record.items() if k in own})
    for key, (only, why) in cls.fixed.items():
        value = record.get(key, only)
        if isinstance(value, bool) or value != only:
            raise ValidationError(f"flow.{key}", value, why)
    return params
