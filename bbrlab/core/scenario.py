"""Typed parameters of one run: the link, the CPU contention, the flow.

All values carry their unit in their name. Every constructor validates, so a ``Scenario``
that exists is one the testbed can run; errors name the field and the allowed range.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Literal

from . import competition
from .competition import CCA_NAME, DEFAULT_SENDER_QDISC, ExtraFlow
from .contention_models import (
    CFS_DEFAULT_PERIOD_MS,
    CFS_MODELS,
    DEFAULT_MODEL,
    check_model,
    load_threads,
    model_id_tag,
)
from .errors import ValidationError
from .linksizing import (  # noqa: F401 - the queue's sizes and checks, re-exported where Link is
    ETHERNET_HEADER_BYTES,
    MAX_BUFFER_BDP,
    MAX_QUEUE_BYTES,
    MIN_QUEUE_FRAMES,
    QUEUE_MODES,
    BufferBelowMinimum,
    buffer_bdp_range,
    check_buffer_ceiling,
    check_kernel_limits,
    check_queue_floor,
)
from .workload_params import (  # noqa: F401 - the workloads' parameters, re-exported where Flow is
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
from .workload_params import check_range as _check_range

# Limits the kernel applies to SCHED_DEADLINE (defaults of sched_deadline_period_{min,max}_us).
DEADLINE_PERIOD_MIN_US = 100
DEADLINE_PERIOD_MAX_US = 4_194_304
DEADLINE_RUNTIME_MIN_NS = 1024
#: Highest loss a link may have: beyond half the packets lost a transfer measures the loss, not the CCA.
MAX_LOSS_PCT = 50

LossModel = Literal["none", "uniform", "gemodel"]
DelaySplit = Literal["symmetric", "forward"]
QueueMode = Literal["bbrlab", "authors"]
EmulatorOffloads = Literal["off", "on"]
#: ``Link.emulator_offloads``: TSO, GSO and GRO on the emulator's two ports all off (bbrlab: netem sees wire
#: packets) or all on (as the authors' emulator script sets them).
EMULATOR_OFFLOADS = ("off", "on")


def check_cca(name: object, field_name: str = "cca") -> str:
    """A congestion control name: lowercase identifier of at most 15 characters."""
    if not isinstance(name, str) or not CCA_NAME.fullmatch(name):
        raise ValidationError(field_name, name, "a congestion control name: [a-z][a-z0-9_]{0,14}, e.g. cubic, bbr, bbr2b")
    return name


@dataclass(frozen=True)
class Link:
    """The emulated bottleneck: delay, rate, buffer and loss, as set on the emulator.

    ``buffer_bdp`` sizes the token bucket's queue in bandwidth-delay products (the paper uses 1);
    ``buffer_bytes`` gives it directly instead. ``rate_mbit=None`` is an *unshaped* link: the delay (and
    loss) only, no token bucket and so no bottleneck queue (both buffers ``None``); build it with
    :meth:`unshaped`. It measures what the sender can carry at all (``bbrlab calibrate``). ``delay_split``: ``symmetric`` puts RTT/2 on each
    direction, ``forward`` puts the whole RTT on the data direction.
    Gilbert-Elliott loss (``gemodel``) takes ``ge_p_pct``, ``ge_r_pct``, ``ge_h_pct``, ``ge_k_pct``
    as netem's ``loss gemodel p r 1-h 1-k``.

    ``queue`` picks the emulator's qdisc tree (docs/link.md): ``bbrlab`` (netem -> tbf; tbf's byte limit, the
    buffer asked, is the bottleneck queue) or ``authors`` (tbf -> netem on both ports as the paper authors'
    emulator built it; tbf's limit is then not in force and netem's 100000 packets are the queue, whatever the
    buffer asked). ``emulator_offloads`` sets TSO, GSO and GRO on the emulator's ports: ``off`` (netem sees wire
    packets) or ``on`` (as the authors' emulator had them). Both are left out of :meth:`to_dict` at their
    defaults, so the run ids of links made before they existed do not change.
    """

    rtt_ms: float
    rate_mbit: float | None
    buffer_bdp: float | None = 1.0
    buffer_bytes: int | None = None
    loss_model: LossModel = "none"
    loss_pct: float = 0.0
    ge_p_pct: float = 0.0
    ge_r_pct: float = 100.0
    ge_h_pct: float = 0.0
    ge_k_pct: float = 100.0
    loss_seed: int | None = None
    jitter_ms: float = 0.0
    delay_split: DelaySplit = "symmetric"
    mtu_bytes: int = 1500
    queue: QueueMode = "bbrlab"
    emulator_offloads: EmulatorOffloads = "off"

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check every field and their combinations; raise :class:`ValidationError` naming the field and its allowed range."""
        _check_range("link.rtt_ms", self.rtt_ms, 0, 10_000, unit="ms")
        if self.rate_mbit is None:
            if self.buffer_bdp is not None or self.buffer_bytes is not None:
                raise ValidationError("link.buffer", (self.buffer_bdp, self.buffer_bytes),
                                      "none when rate_mbit is None (an unshaped link has no bottleneck queue; "
                                      "use Link.unshaped)")
        else:
            _check_range("link.rate_mbit", self.rate_mbit, 0, 100_000, lo_open=True, unit="Mbit/s")
        if self.rate_mbit is not None and (self.buffer_bdp is None) == (self.buffer_bytes is None):
            raise ValidationError("link.buffer", (self.buffer_bdp, self.buffer_bytes),
                                  "exactly one of buffer_bdp or buffer_bytes")
        if self.buffer_bdp is not None:
            if isinstance(self.buffer_bdp, bool) or not isinstance(self.buffer_bdp, int | float):
                raise ValidationError("link.buffer_bdp", self.buffer_bdp, "a number in BDP")
            check_buffer_ceiling(self)  # 0 < buffer_bdp <= the largest this rate x RTT allows
        if self.buffer_bytes is not None:
            _check_range("link.buffer_bytes", self.buffer_bytes, 1, 2**31 - 1, unit="bytes")
        if self.loss_model not in ("none", "uniform", "gemodel"):
            raise ValidationError("link.loss_model", self.loss_model, "one of none, uniform, gemodel")
        _check_range("link.loss_pct", self.loss_pct, 0, MAX_LOSS_PCT, unit="%")
        if self.loss_model == "none" and self.loss_pct:
            raise ValidationError("link.loss_pct", self.loss_pct, "0 when loss_model is none (use uniform)")
        for name in ("ge_p_pct", "ge_r_pct", "ge_h_pct", "ge_k_pct"):
            _check_range(f"link.{name}", getattr(self, name), 0, 100, unit="%")
        if self.loss_seed is not None:
            _check_range("link.loss_seed", self.loss_seed, 0, 2**63 - 1)
        _check_range("link.jitter_ms", self.jitter_ms, 0, 10_000, unit="ms")
        if self.jitter_ms > self.one_way_delays_ms()[0] and self.jitter_ms:
            raise ValidationError("link.jitter_ms", self.jitter_ms, "at most the per-direction delay")
        if self.delay_split not in ("symmetric", "forward"):
            raise ValidationError("link.delay_split", self.delay_split, "symmetric or forward")
        _check_range("link.mtu_bytes", self.mtu_bytes, 576, 65_535, unit="bytes")
        self._check_queue_tree()
        check_kernel_limits(self)
        check_queue_floor(self)

    def _check_queue_tree(self) -> None:
        """``queue`` and ``emulator_offloads`` are known values; the authors' tree needs a rate."""
        if self.queue not in QUEUE_MODES:
            raise ValidationError("link.queue", self.queue, "one of bbrlab (netem -> tbf, tbf's limit is the "
                                  "queue), authors (tbf -> netem as the paper authors built it, netem's 100000 "
                                  "packets are the queue)")
        if self.queue == "authors" and not self.shaped:
            raise ValidationError("link.queue", self.queue, "bbrlab for an unshaped link (the authors' tree is a "
                                  "token bucket with netem below it: give rate_mbit)")
        if self.emulator_offloads not in EMULATOR_OFFLOADS:
            raise ValidationError("link.emulator_offloads", self.emulator_offloads,
                                  "off (TSO, GSO and GRO off on the emulator's ports) or on (all three on, as the "
                                  "authors' emulator had them)")

    def to_dict(self) -> dict:
        """The link as recorded (and hashed into run ids): every field, but ``queue`` and
        ``emulator_offloads`` only when they differ from their defaults."""
        d = asdict(self)
        if self.queue == "bbrlab":
            del d["queue"]
        if self.emulator_offloads == "off":
            del d["emulator_offloads"]
        return d

    @classmethod
    def unshaped(cls, rtt_ms: float, **kwargs) -> Link:
        """A link with ``rtt_ms`` of delay and no rate limit (other fields as keywords, e.g. ``delay_split``)."""
        return cls(rtt_ms=rtt_ms, rate_mbit=None, buffer_bdp=None, buffer_bytes=None, **kwargs)

    # -- derived quantities ----------------------------------------------------------------
    @property
    def shaped(self) -> bool:
        """Whether a token bucket limits the rate (False for :meth:`unshaped` links)."""
        return self.rate_mbit is not None

    @property
    def bdp_bytes(self) -> int | None:
        """Bandwidth-delay product of the configured link in bytes (None when unshaped)."""
        if self.rate_mbit is None:
            return None
        return int(round(self.rate_mbit * 1e6 / 8 * self.rtt_ms / 1e3))

    @property
    def queue_limit_bytes(self) -> int | None:
        """Bottleneck queue in bytes, exactly as asked: ``buffer_bytes``, or ``buffer_bdp x bdp_bytes`` rounded
        to a byte (None when unshaped: there is no bottleneck queue). A queue below :attr:`min_queue_bytes`
        is refused when the link is built, never enlarged behind the researcher's back."""
        if self.rate_mbit is None:
            return None
        if self.buffer_bytes is not None:
            return self.buffer_bytes
        return int(round(self.buffer_bdp * self.bdp_bytes))

    @property
    def frame_bytes(self) -> int:
        """What a full-size packet takes in the bottleneck queue: the MTU plus the Ethernet header."""
        return self.mtu_bytes + ETHERNET_HEADER_BYTES

    @property
    def min_queue_bytes(self) -> int:
        """The smallest bottleneck queue bbrlab sets: :data:`MIN_QUEUE_FRAMES` full-size frames."""
        return MIN_QUEUE_FRAMES * self.frame_bytes

    @property
    def queue_bdp(self) -> float | None:
        """The bottleneck queue in BDP (None when unshaped or when the BDP is 0 bytes)."""
        if not self.shaped or not self.bdp_bytes:
            return None
        return self.queue_limit_bytes / self.bdp_bytes

    def one_way_delays_ms(self) -> tuple[float, float]:
        """(data direction, ack direction) delay in ms."""
        if self.delay_split == "forward":
            return float(self.rtt_ms), 0.0
        return self.rtt_ms / 2, self.rtt_ms / 2

    @property
    def effective_loss_pct(self) -> float:
        """The loss netem applies at random, in percent: ``loss_pct`` for the uniform model, 0 otherwise (Gilbert-Elliott loss has no single figure)."""
        return self.loss_pct if self.loss_model == "uniform" else 0.0


@dataclass(frozen=True)
class Contention:
    """CPU contention on the sender's vCPU threads, by ``model`` (:mod:`bbrlab.core.contention_models`).

    ``deadline`` (default): SCHED_DEADLINE, runtime = deadline = timeslice, period = timeslice / share.
    ``cfs-quota``: a CFS quota of share x ``period_ms`` (default 100 ms) per period; ``cfs-burst``: the same and
    a burst of ``burst_ms``; ``credit``: full CPU while a balance of ``credit_s`` CPU-seconds lasts, then the
    share as baseline quota. ``competing-load``: :attr:`load_threads` equal-weight busy threads on the vCPU's
    CPU. ``none``: nothing (share 100). ``timeslice_ms`` is used by ``deadline`` only. A share of 100 % means no
    policy. ``model`` and the models' own fields are left out of :meth:`to_dict` at their defaults, so deadline
    run ids are as before."""

    timeslice_ms: float
    cpu_share_pct: float
    model: str = DEFAULT_MODEL
    period_ms: float | None = None
    burst_ms: float | None = None
    credit_s: float | None = None

    def __post_init__(self):
        if self.model in CFS_MODELS and self.period_ms is None:
            object.__setattr__(self, "period_ms", CFS_DEFAULT_PERIOD_MS)
        self.validate()

    def validate(self) -> None:
        """Check the timeslice (ms), the CPU share (%) and the model's parameters, and for deadline that the
        period they give is one the kernel takes."""
        _check_range("contention.timeslice_ms", self.timeslice_ms, 0, 1000, lo_open=True, unit="ms")
        _check_range("contention.cpu_share_pct", self.cpu_share_pct, 0, 100, lo_open=True, unit="%")
        check_model(self.model, self.cpu_share_pct, self.timeslice_ms, self.period_ms, self.burst_ms, self.credit_s)
        if self.unlimited or self.model != "deadline":
            return
        if self.runtime_ns < DEADLINE_RUNTIME_MIN_NS:
            raise ValidationError("contention.timeslice_ms", self.timeslice_ms,
                                  f"a runtime of at least {DEADLINE_RUNTIME_MIN_NS} ns (the kernel's minimum)")
        period_us = self.timeslice_ms * 1e3 * 100.0 / self.cpu_share_pct  # float: a tiny share gives inf
        if not DEADLINE_PERIOD_MIN_US <= period_us <= DEADLINE_PERIOD_MAX_US:
            raise ValidationError(
                "contention.cpu_share_pct", self.cpu_share_pct,
                f"a period (timeslice / share) between {DEADLINE_PERIOD_MIN_US} us and "
                f"{DEADLINE_PERIOD_MAX_US} us; {self.timeslice_ms} ms / {self.cpu_share_pct} % "
                f"gives {period_us:.0f} us",
            )

    def to_dict(self) -> dict:
        """The contention as recorded (and hashed into run ids): ``model`` and the models' own fields only
        when not at their defaults (deadline, None)."""
        d = asdict(self)
        if self.model == DEFAULT_MODEL:
            del d["model"]
        return {k: v for k, v in d.items() if v is not None}

    @property
    def unlimited(self) -> bool:
        """A share of 100 % or more (or model none): no contention is applied."""
        return self.cpu_share_pct >= 100 or self.model == "none"

    @property
    def load_threads(self) -> int:
        """competing-load's equal-weight busy threads for this share (0 for the other models)."""
        return load_threads(self.cpu_share_pct) if self.model == "competing-load" else 0

    @property
    def id_tag(self) -> str:
        """The contention in a run id (:func:`~bbrlab.core.contention_models.model_id_tag`): ``ts1ms-sh25``
        (deadline, as always), ``cfs100ms-sh25``, ``load-sh25`` ..."""
        return model_id_tag(self.model, self.timeslice_ms, self.cpu_share_pct, self.period_ms, self.burst_ms,
                            self.credit_s)

    @property
    def runtime_ns(self) -> int:
        """SCHED_DEADLINE's runtime: the timeslice, in nanoseconds."""
        return int(round(self.timeslice_ms * 1e6))

    @property
    def deadline_ns(self) -> int:
        """SCHED_DEADLINE's deadline: equal to the runtime (the vCPU's timeslice must run within it), in nanoseconds."""
        return self.runtime_ns

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

    ``params`` is the workload's parameters object (:mod:`bbrlab.core.workload_params`): :class:`IperfParams`
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
                                  f"the parameters of one of {', '.join(WORKLOADS)} (bbrlab.core.workload_params)")
        if self.sample_ms is not None:
            if not isinstance(self.sample_ms, int) or isinstance(self.sample_ms, bool):
                raise ValidationError("flow.sample_ms", self.sample_ms, "a whole number of ms from 1 to 10000")
            _check_range("flow.sample_ms", self.sample_ms, 1, 10_000, unit="ms")
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
    (:mod:`bbrlab.core.competition`)."""

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

    def __post_init__(self):
        object.__setattr__(self, "flows", competition.extra_flows(self.flows))
        competition.scenario_extras(self.sender_qdisc, self.flows, self.flow)
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
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Scenario:
        """A scenario from :meth:`to_dict`'s output (``record.json``'s ``scenario``, a plan's run)."""
        return cls(Link(**d["link"]), Contention(**d["contention"]), Flow.from_dict(d["flow"]), d.get("repetition", 0),
                   d.get("kernel"), sender_qdisc=d.get("sender_qdisc", DEFAULT_SENDER_QDISC), flows=d.get("flows") or ())

    @property
    def kernel_tag(self) -> str:
        """The kernel as a run-id prefix (``debian-5.10-``; a path: its last part), empty without one."""
        if self.kernel is None:
            return ""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.kernel.rstrip("/").rsplit("/", 1)[-1]) + "-"

    @property
    def run_id(self) -> str:
        """Stable id: readable prefix + hash of every parameter and the repetition. The authors' queue tree and
        the emulator's offloads on add ``-qauthors`` and ``-offloads`` after the rate, then ``-fq`` and the extra
        flows (``-and-cubic-comp3s``); the defaults add nothing, so those ids are as before."""
        d = self.to_dict()
        digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
        c, li, f = self.contention, self.link, self.flow
        rate = "unshaped" if li.rate_mbit is None else f"{li.rate_mbit:g}mbit"
        tree = "".join(tag for tag, on in (("-qauthors", li.queue == "authors"),
                                           ("-offloads", li.emulator_offloads == "on")) if on)
        return (f"{self.kernel_tag}{f.params.id_prefix}{f.cca}-{c.id_tag}-rtt{li.rtt_ms:g}ms-"
                f"{rate}{tree}{competition.id_tags(self.sender_qdisc, self.flows)}-r{self.repetition:02d}-{digest}")
