"""Typed parameters of one run: the link, the CPU contention, the flow.

All values carry their unit in their name. Every constructor validates, so a ``Scenario``
that exists is one the testbed can run; errors name the field and the allowed range.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from bbrlab.core.errors import ValidationError

from . import competition, cpumodels, knobs
from .competition import CCA_NAME, DEFAULT_SENDER_QDISC, ExtraFlow
from .contention_models import load_threads
from .cpumodels import DEFAULT_MODEL, ContentionModel, ContentionParams
from .link import Link
from .ranges import check_range
from .workloads import (  # noqa: F401 - the workloads' parameters, re-exported where Flow is
    DEFAULT_FILE_MB,
    DEFAULT_TRANSFER_TIMEOUT_S,
    DEFAULT_WORKLOAD,
    MAX_FILE_MB,
    WORKLOADS,
    IperfParams,
    RsyncParams,
    WorkloadParams,
    is_params,
    params_of,
)


def check_cca(name: object, field_name: str = "cca") -> str:
    """A congestion control name: lowercase identifier of at most 15 characters."""
    if not isinstance(name, str) or not CCA_NAME.fullmatch(name):
        raise ValidationError(field_name, name, "a congestion control name: [a-z][a-z0-9_]{0,14}, e.g. cubic, bbr, bbr2b")
    return name


#: The most vCPUs a sender VM may have (the local testbed's ``--sender-vcpus`` and the spec's ``sender_vcpus``).
MAX_SENDER_VCPUS = 8


def check_sender_vcpus(value: object, field_name: str = "sender_vcpus") -> int:
    """``value`` when it is a whole number of vCPUs from 1 to :data:`MAX_SENDER_VCPUS`; else raises
    :class:`ValidationError` naming ``field_name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SENDER_VCPUS:
        raise ValidationError(field_name, value, f"a whole number of vCPUs from 1 to {MAX_SENDER_VCPUS}")
    return value


def _check_contention_ranges(timeslice_ms, share_pct) -> None:
    check_range("contention.timeslice_ms", timeslice_ms, 0, 1000, lo_open=True, unit="ms")
    check_range("contention.cpu_share_pct", share_pct, 0, 100, lo_open=True, unit="%")


@dataclass(frozen=True)
class Contention:
    """CPU contention on the sender's vCPU threads, by ``model`` (:mod:`bbrlab.scenario.cpumodels`, one module each)
    with ``params``, that model's own parameters (its ``params_type``; None: the model's defaults).

    ``deadline`` (default): SCHED_DEADLINE, runtime = timeslice, period = timeslice / share, and deadline =
    runtime (``deadline_mode`` constrained, the default and the paper's) or = period (implicit).
    ``cfs-quota``: a CFS quota of share x ``period_ms`` (default 100 ms) per period; ``cfs-burst``: the same and
    a burst of ``burst_ms``; ``credit``: full CPU while a balance of ``credit_s`` CPU-seconds lasts, then the
    share as baseline quota. ``competing-load``: :attr:`load_threads` equal-weight busy threads on the vCPU's
    CPU. ``none``: nothing (share 100). ``timeslice_ms`` is used by ``deadline`` only. A share of 100 % means no
    policy. A record keeps the parameters flat beside the share (:meth:`to_dict`, :meth:`from_dict`), and
    ``model`` only when not deadline and ``deadline_mode`` only when implicit, so deadline run ids are as before."""

    timeslice_ms: float
    cpu_share_pct: float
    model: str = DEFAULT_MODEL
    params: ContentionParams | None = None  # None: the model's defaults, put in its place when made

    def __post_init__(self):
        _check_contention_ranges(self.timeslice_ms, self.cpu_share_pct)
        kind = cpumodels.model(self.model)
        if self.params is None:
            object.__setattr__(self, "params", cpumodels.params_of(kind, {}))
        elif type(self.params) is not kind.params_type:
            raise ValidationError("contention.params", self.params, f"a {kind.params_type.__name__} with model {kind.name}")
        kind.validate(self.cpu_share_pct, self.timeslice_ms, self.params)

    def validate(self) -> None:
        """Check the timeslice (ms), the CPU share (%) and the model's parameters with them (for deadline, that
        the period they give is one the kernel takes)."""
        _check_contention_ranges(self.timeslice_ms, self.cpu_share_pct)
        self.kind.validate(self.cpu_share_pct, self.timeslice_ms, self.params)

    @classmethod
    def from_dict(cls, d: dict) -> Contention:
        """A contention from :meth:`to_dict`'s flat fields (a record's, a plan's); a parameter of another model
        than ``model`` is a :class:`ValidationError` naming it."""
        rest = {k: v for k, v in d.items() if k not in ("timeslice_ms", "cpu_share_pct", "model")}
        _check_contention_ranges(d.get("timeslice_ms"), d.get("cpu_share_pct"))
        kind = cpumodels.model(d.get("model", DEFAULT_MODEL))
        return cls(d["timeslice_ms"], d["cpu_share_pct"], kind.name, cpumodels.params_of(kind, rest))

    def to_dict(self) -> dict:
        """The contention as recorded (and hashed into run ids): ``model`` only when not deadline, then the
        model's parameters, flat (deadline's ``deadline_mode`` only when implicit)."""
        d = {"timeslice_ms": self.timeslice_ms, "cpu_share_pct": self.cpu_share_pct, "model": self.model}
        if self.model == DEFAULT_MODEL:
            del d["model"]
        return {**d, **cpumodels.params_dict(self.params)}

    @property
    def kind(self) -> ContentionModel:
        """The model (:data:`bbrlab.scenario.cpumodels.MODELS`): its checks and what it is."""
        return cpumodels.MODELS[self.model]

    @property
    def unlimited(self) -> bool:
        """A share of 100 % or more (model none always has it): no contention is applied."""
        return self.cpu_share_pct >= 100

    @property
    def load_threads(self) -> int:
        """competing-load's equal-weight busy threads for this share (0 for the other models)."""
        return load_threads(self.cpu_share_pct) if self.kind.adds_load else 0

    @property
    def id_tag(self) -> str:
        """The contention in a run id: ``ts1ms-sh25`` (deadline, as always; ``ts1ms-implicit-sh25``), ``cfs100ms-sh25``,
        ``cfs100ms-burst5ms-sh25``, ``credit30s-cfs100ms-sh25``, ``load-sh25``, ``none-sh100``."""
        share = "100" if self.cpu_share_pct >= 100 else f"{self.cpu_share_pct:g}"
        return f"{self.kind.id_head(self.timeslice_ms, self.params)}-sh{share}"

    @property
    def runtime_ns(self) -> int:
        """SCHED_DEADLINE's runtime: the timeslice, in nanoseconds."""
        return int(round(self.timeslice_ms * 1e6))

    @property
    def deadline_mode(self) -> str | None:
        """deadline's mode: constrained (deadline = runtime) or implicit (deadline = period); None for the other
        models."""
        return getattr(self.params, "deadline_mode", None)

    @property
    def deadline_ns(self) -> int:
        """SCHED_DEADLINE's deadline, in nanoseconds: the runtime (constrained: the vCPU's timeslice must run within
        it), or the period (implicit: the runtime is a budget for anywhere in the period)."""
        return self.period_ns if self.deadline_mode == "implicit" else self.runtime_ns

    @property
    def period_ns(self) -> int:
        """SCHED_DEADLINE's period: the timeslice divided by the share, in nanoseconds."""
        return int(round(self.timeslice_ms * 1e6 * 100.0 / self.cpu_share_pct))

    @property
    def bandwidth(self) -> float:
        """runtime / period as a fraction (what admission control counts)."""
        return 0.0 if self.unlimited else self.runtime_ns / self.period_ns


#: Whether a flow's run traces the sender's vCPU threads on the host (auto: when it is sampled).
VCPU_TRACE = ("auto", "on", "off")
from .sampling_limits import (  # noqa: E402,F401 - re-exported: the limits belong with the Flow they check
    DEFAULT_SAMPLER,
    MAX_SAMPLE_RECORDS,
    SAMPLE_RECORD_BYTES,
    SAMPLER_MAX_PORTS,
    SAMPLERS,
    bottleneck_interval_ms,
    check_bottleneck_ms,
    check_sampling_load,
    sampled_records,
)


@dataclass(frozen=True)
class Flow:
    """What the (contended) sender sends to the receiver: the workload, its parameters, its congestion control.

    ``params`` is the workload's parameters object (:mod:`bbrlab.scenario.workloads`): :class:`IperfParams`
    (the default: a bulk transfer of ``duration_s`` over ``streams`` connections) or :class:`RsyncParams` (one
    incompressible file of ``file_mb`` copied over one SSH connection, ended after ``transfer_timeout_s``; see
    :mod:`bbrlab.run.transfer`). :meth:`to_dict` writes them in the flat form records have always had, and
    :meth:`of` builds a flow from it.

    ``sample_ms``: sample the data sockets every that many ms with ``sampler`` (None: unsampled). Records
    written before the samplers had a choice say ``sample_ss_ms`` (the ss loop): :meth:`from_dict` reads them,
    and :meth:`to_dict` writes unsampled and ss-sampled flows in that same form, so their run ids do not change.
    ``bottleneck_ms``: sample the emulator's bottleneck queue every that many ms (0: never; "auto", left out
    of :meth:`to_dict`: every 5 ms in a sampled run, never in an unsampled one).
    ``vcpu_trace``: trace the vCPU threads on the host (:mod:`bbrlab.sampling.vcputrace`); auto = when sampled.
    """

    cca: str
    params: WorkloadParams = IperfParams()
    sample_ms: int | None = None
    sampler: str = DEFAULT_SAMPLER
    vcpu_trace: str = "auto"
    bottleneck_ms: int | str = "auto"

    def __post_init__(self):
        self.validate()
        if self.sample_ms is None:  # the sampler of an unsampled flow means nothing: one form for equality
            object.__setattr__(self, "sampler", DEFAULT_SAMPLER)

    @classmethod
    def of(cls, cca: str, *, workload: str = DEFAULT_WORKLOAD, sample_ms: int | None = None,
           sampler: str = DEFAULT_SAMPLER, vcpu_trace: str = "auto", bottleneck_ms: int | str = "auto",
           **workload_fields) -> Flow:
        """A flow from the flat fields of a record (or a spec): ``workload`` names the parameters type, and the
        workload's own fields (``duration_s``, ``file_mb``, ...) go into it (:func:`params_of`)."""
        return cls(cca, params_of(workload, **workload_fields), sample_ms, sampler, vcpu_trace, bottleneck_ms)

    @property
    def workload(self) -> str:
        """The workload's name (``iperf3``, ``rsync``): the key of its parameters and of its runner."""
        return self.params.name

    def validate(self) -> None:
        """Check the CCA name, the workload's parameters, the sampling and the tracing."""
        check_cca(self.cca, "flow.cca")
        if not is_params(self.params):
            raise ValidationError("flow.params", self.params,
                                  f"the parameters of one of {', '.join(WORKLOADS)} (bbrlab.scenario.workloads)")
        if self.sample_ms is not None:
            if not isinstance(self.sample_ms, int) or isinstance(self.sample_ms, bool):
                raise ValidationError("flow.sample_ms", self.sample_ms, "a whole number of ms from 1 to 10000")
            check_range("flow.sample_ms", self.sample_ms, 1, 10_000, unit="ms")
        if self.sampler not in SAMPLERS:
            raise ValidationError("flow.sampler", self.sampler, f"one of {', '.join(SAMPLERS)}")
        if self.vcpu_trace not in VCPU_TRACE:
            raise ValidationError("flow.vcpu_trace", self.vcpu_trace, f"one of {', '.join(VCPU_TRACE)}")
        check_bottleneck_ms(self.bottleneck_ms)
        if self.sample_ms is not None:
            span_field, span_s = self.params.sampled_span
            check_sampling_load(self.sample_ms, self.params.connections, span_s, self.sampler,
                                fields=("flow.sample_ms", "flow.streams", span_field))

    @property
    def bottleneck_interval_ms(self) -> int | None:
        """Every how many ms the run samples the emulator's bottleneck queue (None: it does not)."""
        return bottleneck_interval_ms(self.bottleneck_ms, self.sample_ms)

    def to_dict(self) -> dict:
        """The flow as recorded, its run id as before later options existed: the workload's fields flat
        (iperf3 without a ``workload`` key), unsampled or ss-sampled with ``sample_ss_ms``, ``vcpu_trace`` only
        when not auto, ``bottleneck_ms`` only when not auto."""
        d = {"cca": self.cca, **self.params.record_fields(), "sample_ms": self.sample_ms, "sampler": self.sampler,
             "vcpu_trace": self.vcpu_trace, "bottleneck_ms": self.bottleneck_ms}
        d = {k: d[k] for k in sorted(d, key=_RECORD_ORDER.index)}  # the keys in the order records always had
        if self.vcpu_trace == "auto":
            del d["vcpu_trace"]
        if self.bottleneck_ms == "auto":
            del d["bottleneck_ms"]
        if self.sample_ms is None or self.sampler == "ss":
            d["sample_ss_ms"] = d.pop("sample_ms")
            del d["sampler"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Flow:
        """A flow from :meth:`to_dict`'s form, or from a record made before the samplers had a choice."""
        d = dict(d)
        legacy = d.pop("sample_ss_ms", None)
        if legacy is not None:
            if d.get("sample_ms") is not None:
                raise ValidationError("flow.sample_ss_ms", legacy, "absent when flow.sample_ms is given")
            d["sample_ms"], d["sampler"] = legacy, "ss"
        return cls.of(**d)


#: The order of a flow record's keys (as :func:`dataclasses.asdict` gave them when the flow had them all as fields).
_RECORD_ORDER = ("cca", "duration_s", "streams", "sample_ms", "sampler", "workload", "file_mb", "transfer_timeout_s",
                 "vcpu_trace", "bottleneck_ms")


SCENARIO_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Scenario:
    """One run: link x contention x flow x repetition index; the sender's qdisc and flows beside the flow
    (:mod:`bbrlab.scenario.competition`); the module parameters of the flow's CCA and the sender's sysctls the run
    sets (:mod:`bbrlab.scenario.knobs`: ``(name, value)`` pairs, given as a mapping or as pairs)."""

    link: Link
    contention: Contention
    flow: Flow
    repetition: int = 0
    #: The sender's kernel (``debian-6.1``, ``debian-5.10``, ``debian-6.12`` or a kernel's path: see
    #: :mod:`bbrlab.kernel.sender`); None: whatever the testbed's sender runs.
    kernel: str | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    sender_qdisc: str = DEFAULT_SENDER_QDISC
    flows: tuple[ExtraFlow, ...] = ()
    #: The module parameters of the flow's CCA set for the run (its module: bbrlab.run.senderknobs); () none.
    cca_params: knobs.Assignment = ()
    #: The sender's sysctls set for the run (:data:`bbrlab.scenario.knobs.SENDER_SYSCTLS`); () none.
    sender_sysctls: knobs.Assignment = ()
    #: The sender VM's vCPUs (1 to :data:`MAX_SENDER_VCPUS`); None: whatever the testbed's sender has.
    sender_vcpus: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "flows", competition.extra_flows(self.flows))
        object.__setattr__(self, "cca_params", knobs.assignment(self.cca_params, "cca_params", knobs.check_param))
        object.__setattr__(self, "sender_sysctls", knobs.assignment(self.sender_sysctls, "sender_sysctls",
                                                                    knobs.check_sysctl))
        competition.scenario_extras(self.sender_qdisc, self.flows, self.flow)
        if self.sender_vcpus is not None:
            check_sender_vcpus(self.sender_vcpus)
        k = self.kernel
        if k is not None and (not isinstance(k, str) or not k.strip() or len(k) > 4096
                              or any(c in k for c in "\n\r\0")):
            raise ValidationError("kernel", k, "a sender kernel: debian-6.1, debian-5.10, debian-6.12 or a path")

    def to_dict(self) -> dict:
        """The scenario as recorded in ``record.json`` and ``plan.json`` (and hashed into its run id), with its schema version."""
        d = {
            "schema": SCENARIO_SCHEMA_VERSION,
            "link": self.link.to_dict(),
            "contention": self.contention.to_dict(),
            "flow": self.flow.to_dict(),
            "repetition": self.repetition, **competition.scenario_dict(self.sender_qdisc, self.flows),
        }
        if self.kernel is not None:  # absent otherwise, so runs planned before kernels keep their ids
            d["kernel"] = self.kernel
        for name in ("cca_params", "sender_sysctls"):  # likewise: absent when none is set
            if getattr(self, name):
                d[name] = knobs.as_dict(getattr(self, name))
        if self.sender_vcpus is not None:  # likewise for runs planned before the vCPU count was a dimension
            d["sender_vcpus"] = self.sender_vcpus
        return d

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Where nested in a typed record (``record.json``'s ``scenario``), read by :meth:`from_record` and
        written by :meth:`to_dict` (:func:`bbrlab.core.recordjson.own_layout`): the JSON records hold, key for key."""
        from bbrlab.core.recordjson import own_layout

        return own_layout(cls, read=cls.from_record)

    @classmethod
    def from_dict(cls, d: dict, *, link: Callable[..., Link] = Link) -> Scenario:
        """A scenario from :meth:`to_dict`'s output (``record.json``'s ``scenario``, a plan's run); ``link`` builds
        its link from the fields (:meth:`from_record` passes :meth:`Link.recorded`)."""
        return cls(link(**d["link"]), Contention.from_dict(d["contention"]), Flow.from_dict(d["flow"]), d.get("repetition", 0),
                   d.get("kernel"), sender_qdisc=d.get("sender_qdisc", DEFAULT_SENDER_QDISC), flows=d.get("flows") or (),
                   cca_params=d.get("cca_params") or (), sender_sysctls=d.get("sender_sysctls") or (),
                   sender_vcpus=d.get("sender_vcpus"))

    @classmethod
    def from_record(cls, d: dict) -> Scenario:
        """The scenario a run record says the run had (:meth:`from_dict`, its link by :meth:`Link.recorded`: a
        buffer below the queue floor of a record made before the floor reads as recorded)."""
        return cls.from_dict(d, link=Link.recorded)

    @property
    def kernel_tag(self) -> str:
        """The kernel as a run-id prefix (``debian-5.10-``; a path: its last part), empty without one."""
        if self.kernel is None:
            return ""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.kernel.rstrip("/").rsplit("/", 1)[-1]) + "-"

    @property
    def vcpus_tag(self) -> str:
        """The vCPU count as a run-id fragment (``2vcpu-``), empty without one."""
        return "" if self.sender_vcpus is None else f"{self.sender_vcpus}vcpu-"

    @property
    def run_id(self) -> str:
        """Stable id: readable prefix (:data:`RUN_ID_FRAGMENTS`, in order) + the repetition + a hash of every
        parameter and the repetition. The authors' queue tree and the emulator's offloads on add ``-qauthors`` and
        ``-offloads`` after the rate, then ``-fq`` and the extra flows (``-and-cubic-comp3s``); module parameters
        follow the CCA (``bbr2b-deficit_gain512-``) and sysctls come last (``-limit_output_bytes262144``); the
        defaults add nothing, so those ids are as before."""
        d = self.to_dict()
        digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
        prefix = "".join(fragment(self) for fragment in RUN_ID_FRAGMENTS.values())
        return f"{prefix}-r{self.repetition:02d}-{digest}"


#: The readable fragments of a run id, in their order, by name (each with its separators): the spec's dimensions
#: name theirs (``bbrlab.campaign.dimensions``); a value no fragment shows is in the id's hash alone.
RUN_ID_FRAGMENTS: dict[str, Callable[[Scenario], str]] = {
    "kernel": lambda s: s.kernel_tag,
    "vcpus": lambda s: s.vcpus_tag,
    "workload": lambda s: s.flow.params.id_prefix,
    "cca": lambda s: f"{s.flow.cca}-",
    "cca_params": lambda s: knobs.params_tag(s.cca_params),
    "contention": lambda s: f"{s.contention.id_tag}-",
    "rtt": lambda s: f"rtt{s.link.rtt_ms:g}ms-",
    "rate": lambda s: "unshaped" if s.link.rate_mbit is None else f"{s.link.rate_mbit:g}mbit",
    "queue": lambda s: "-qauthors" if s.link.queue == "authors" else "",
    "emulator_offloads": lambda s: "-offloads" if s.link.emulator_offloads == "on" else "",
    "competition": lambda s: competition.id_tags(s.sender_qdisc, s.flows),
    "sysctls": lambda s: knobs.sysctls_tag(s.sender_sysctls),
}
