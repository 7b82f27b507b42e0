"""A campaign spec's contention models (#28): the contention of one model at one share, the check of every
model's values with every share, and of the deadline pairs against the live admission limits.
:class:`~bbrlab.campaign.spec.CampaignSpec` builds its grid with :func:`contention_of` and checks it with
:func:`check_contentions`; the pre-flight calls :func:`check_admission`."""

from __future__ import annotations

import itertools

from bbrlab.core.errors import ValidationError
from bbrlab.scenario import cpumodels
from bbrlab.scenario.scenario import Contention


def check_model_name(value: object) -> None:
    """A model's name (its values are checked with the shares)."""
    cpumodels.model(value)


def contention_of(model: str, share: float, values: list) -> Contention:
    """The contention of ``model`` at ``share`` with its own values (``CampaignSpec.model_lists``' order; the
    model's :meth:`~bbrlab.scenario.cpumodels.base.ContentionModel.grid_point` makes its timeslice and parameters)."""
    timeslice_ms, params = cpumodels.MODELS[model].grid_point(share, values)
    return Contention(timeslice_ms, share, model, params)


def check_contentions(spec) -> None:
    """Each model's values with each share (deadline's period, a quota of at least 1 ms, a burst within the
    quota, enough competing threads); an error names the keys and indexes, e.g. ``cpu_shares_pct[1] with
    cfs_periods_ms[0] and cfs_bursts_ms[0]``."""
    for model in spec.contention_models:
        if cpumodels.MODELS[model].fixed_share_pct is not None:
            continue
        lists = spec.model_lists(model)
        keyed = [list(enumerate(values)) for _, values in lists]
        shares_key = "credit_shares_pct" if spec.shares_of(model) is spec.credit_shares_pct else "cpu_shares_pct"
        for j, share in enumerate(spec.shares_of(model)):
            for combo in itertools.product(*keyed):
                try:
                    contention_of(model, share, [v for _, v in combo])
                except ValidationError as e:
                    # the lists of numbers: a list of names (deadline's modes) is checked alone, never with a share
                    named = [(key, i, v) for (key, _), (i, v) in zip(lists, combo, strict=True) if not isinstance(v, str)]
                    where = " and ".join(f"{key}[{i}]" for key, i, _ in named)
                    value = (share, *(v for _, _, v in named)) if named else share
                    raise ValidationError(f"{shares_key}[{j}] with {where or model}", value, e.allowed) from None


def check_admission(spec, limits, n_threads: int) -> None:
    """Refuse the spec if the host that runs the sender's vCPUs can never admit one of its
    timeslice x share pairs for ``n_threads`` vCPU threads (``limits``: its
    :class:`~bbrlab.contention.limits.KernelLimits`, read live). Checked before a campaign starts."""
    from bbrlab.contention.limits import check_fits

    if not any(cpumodels.MODELS[m].uses_timeslice for m in spec.contention_models):
        return  # the other models ask nothing of SCHED_DEADLINE's admission control
    for i, ts in enumerate(spec.timeslices_ms):
        for j, share in enumerate(spec.cpu_shares_pct):
            try:
                check_fits(Contention(ts, share), limits, n_threads)
            except ValidationError as e:
                raise ValidationError(f"cpu_shares_pct[{j}] with timeslices_ms[{i}]", (share, ts),
                                      f"{e.allowed} (the sender's hypervisor host, {n_threads} vCPU thread(s))") from None
