"""A campaign spec: its YAML keys, the grid and plan it gives, and every check of its values.

Spec keys (see specs/*.yaml)::

    name: fig4-100mbit          # [A-Za-z0-9._-], used in paths
    testbed: lab.yaml           # optional: a local testbed's name, or a testbed file (relative to
                                # this spec's folder); default: --testbed, else the local testbed up
    sender_vcpus: []            # e.g. [1, 2, 4]: the sender VM's vCPUs (1 to 8; local testbed only), the plan
                                # keeps each count's runs together: one sender boot per count (docs/testbed.md)
    ccas: [cubic, bbr, bbr2b]
    cca_params: {}              # module parameters per CCA, e.g. {bbr2b: {deficit_gain: [512, 739]}}: crossed
                                # with that CCA's runs alone, set before each and restored after it
    timeslices_ms: [1, 10, 20]
    cpu_shares_pct: [10, 25, 40, 55, 70, 100]   # 100 = no deadline policy
    contention_models: [deadline]  # and/or cfs-quota, cfs-burst, credit, competing-load, none
                                # (docs/contention.md); the timeslices cross with deadline only, the periods
                                # with cfs-quota and cfs-burst, the bursts with cfs-burst, the credits with credit
    deadline_modes: [constrained]  # and/or implicit: deadline = runtime (the paper's) or = period (a budget
                                # for anywhere in the period); crossed with deadline's timeslices
    cfs_periods_ms: [100]       # cfs-quota, cfs-burst: quota = share x period, 1 to 1000 ms
    cfs_bursts_ms: [1]          # cfs-burst: the burst per vCPU, 0 < burst <= quota (share x period)
    credits_s: [10]             # credit: the balance at the start, CPU-seconds (0 to 3600); the share is the
                                # baseline, its quota in 100 ms periods
    credit_shares_pct: []       # credit: its baselines instead of cpu_shares_pct, e.g. [5] (a vCPU that uses
                                # less than its baseline never spends its credit)
    rtts_ms: [10, 20, 40]
    rates_mbit: [100]
    buffers_bdp: [1]            # the buffer asked, in BDP (up to 1000, or to the authors' queue where more)
    queues: [bbrlab]            # the emulator's qdisc tree: bbrlab (netem -> tbf, the buffer is the queue)
                                # and/or authors (tbf -> netem as the paper authors built it: netem's
                                # 100000 packets are the queue, whatever the buffer asked; docs/link.md)
    emulator_offloads: off      # TSO/GSO/GRO on the emulator's ports: off, or on as the authors had them
    losses_pct: [0]             # > 0 means uniform random loss (at most 50)
    streams: [1]
    sender_qdiscs: [default]    # and/or fq: the root qdisc of the sender's experiment interface (pacing)
    sender_sysctls: {}          # sysctls set in the sender for each run and restored after it, e.g.
                                # {net.ipv4.tcp_limit_output_bytes: [262144, 1048576]} (docs/sender-knobs.md)
    flows: []                   # flows beside each run's own, e.g. [{cca: cubic, origin: competitor,
                                # start_s: 3, duration_s: 27, streams: 1}] (docs/competition.md)
    workloads: [iperf3]         # iperf3 (bulk transfer of duration_s) and/or rsync (a file over SSH)
    file_mb: 160                # rsync: the file's size in 10^6 bytes
    transfer_timeout_s: 1200    # rsync: a copy still running then is ended and recorded as timed out
    repetitions: 30             # or adaptive: {min: 5, max: 30, precision: 0.025} (a point stops once its
                                # median's interval reaches 95 % within +-2.5 % of the rate; bbrlab.campaign.repetitions)
    search: {target: 0.8}       # instead of cpu_shares_pct and repetitions: a threshold search per curve,
                                # its probes interleaved in rounds ordered by seed
                                # (bbrlab.campaign.search; docs/statistics.md)
    duration_s: 20              # iperf3's test duration
    sample_ms: null             # e.g. 10: sample the data sockets every 10 ms (figures 5, 6, 9, 11)
    sampler: bpf                # bpf (default), netlink or ss; 'sample_ss_ms: N' = sample_ms N with ss
    vcpu_trace: auto            # trace the sender's vCPU threads on the host: on, off, auto (= when sampled)
    bottleneck_ms: auto         # the emulator's queue every 5 ms in sampled runs; 0 off, 1-1000 ms
    order: blocked-random       # or sequential, random
    seed: 1
    blocks: 1                   # split each point's repetitions into this many blocks, each on a fresh boot
                                # of the sender (a divisor of repetitions; docs/statistics.md, "Blocks")
    block_reboot: sender        # what a block boots afresh: sender, or sender+emulator
    max_attempts: 3             # a failing run is tried at most this often
    host_guard: {max_other_busy_pct: 25}  # or off: a run whose host was busier outside the testbed fails as
                                # "host busy" and is tried again later (bbrlab.campaign.hostguard)
    delay_split: symmetric      # RTT/2 each way; 'forward' puts the whole RTT on the data direction
    expect: []                  # what the runs should show, e.g. [{cca: bbr2b, op: ">=", value: 0.8, where:
                                # {cpu_share_pct: ">= 40"}}]: judged by bbrlab check, not part of the campaign's
                                # identity (bbrlab.campaign.expect; docs/expectations.md)

The list keys are declared in :data:`bbrlab.campaign.dimensions.DIMENSIONS`, the others in
:data:`bbrlab.campaign.settings.SETTINGS` (their types, defaults, ranges and meaning; ``bbrlab campaign schema``
prints them as a JSON Schema).

Every value is checked before anything runs; an error names the key and index (``cpu_shares_pct[2]``).
Values are also checked in combination: each timeslice with each share (the deadline period), each
rate x RTT x buffer against the kernel's limits of the qdiscs (tbf's 32-bit byte counts), the number
of runs, and, before a campaign starts, each timeslice x share against the live limits of the host
that runs the sender's vCPUs (:func:`bbrlab.campaign.spec_models.check_admission`). A key given twice is refused, and a file over 1 MiB.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from bbrlab.core.errors import BbrlabError, ValidationError, key_name
from bbrlab.core.yamlfile import read_capped
from bbrlab.scenario.competition import ExtraFlow
from bbrlab.scenario.cpumodels import DEFAULT_MODEL, MODELS
from bbrlab.scenario.cpumodels.base import UNUSED_TIMESLICE_MS
from bbrlab.scenario.scenario import (
    Contention,
    Flow,
    Link,
    RsyncParams,
    Scenario,
    WorkloadParams,
)
from bbrlab.scenario.workloads import params_of, params_type

from .dimensions import DIMENSIONS, Dimension, NamedLists, default_of
from .expect import Expectation, check_against_spec
from .hostguard import HostGuard
from .order import plan_order
from .repetitions import RepetitionRule
from .search import SearchRule
from .settings import BY_KEY as SETTING
from .settings import SETTINGS, read_settings, setting_default
from .spec_combinations import check_combinations
from .spec_models import contention_of
from .spec_values import check_testbed

#: Seconds a run costs beyond its iperf3 duration, for plan estimates before anything is measured.
ESTIMATED_OVERHEAD_S = 2.0
#: Seconds an rsync run costs beyond its copy (the receiver's sshd, keys, the SSH handshake).
ESTIMATED_RSYNC_OVERHEAD_S = 8.0
#: Seconds a block's fresh boot of the sender costs: measured 29.9 and 30.9 s under TCG (boot to SSH, bbr2b and
#: the samplers put back; tests/system/test_blocks_testbed.py), 50 s with the emulator too.
ESTIMATED_BLOCK_BOOT_S = 30.0


@dataclass(frozen=True)
class CampaignSpec:
    """A validated campaign spec. Build with :func:`load_spec` / :meth:`from_dict`.

    Its list fields are the spec's dimensions (:data:`bbrlab.campaign.dimensions.DIMENSIONS`, where their defaults,
    checks, places in the scenario and run identity are declared), its other fields its settings
    (:data:`bbrlab.campaign.settings.SETTINGS`, where their defaults and checks are; ``adaptive`` is read from
    ``repetitions``); the fields' order is the order of the keys in ``spec.yaml`` (:meth:`to_dict`)."""

    name: str
    ccas: tuple[str, ...]
    timeslices_ms: tuple[float, ...]
    cpu_shares_pct: tuple[float, ...]
    rtts_ms: tuple[float, ...]
    rates_mbit: tuple[float, ...]
    testbed: str | None = setting_default("testbed")  # None: the command's --testbed, else the local testbed up
    kernels: tuple[str, ...] = default_of("kernels")  # the sender's kernels (a dimension); empty: whatever the sender runs
    sender_vcpus: tuple[int, ...] = default_of("sender_vcpus")  # the sender's vCPU counts; empty: whatever it has
    cca_params: NamedLists = default_of("cca_params")  # ``<cca>.<param>`` with its values (bbrlab.campaign.dimensions)
    buffers_bdp: tuple[float, ...] = default_of("buffers_bdp")
    queues: tuple[str, ...] = default_of("queues")
    contention_models: tuple[str, ...] = default_of("contention_models")
    deadline_modes: tuple[str, ...] = default_of("deadline_modes")
    cfs_periods_ms: tuple[float, ...] = default_of("cfs_periods_ms")
    cfs_bursts_ms: tuple[float, ...] = default_of("cfs_bursts_ms")
    credits_s: tuple[float, ...] = default_of("credits_s")
    credit_shares_pct: tuple[float, ...] = default_of("credit_shares_pct")  # empty: the credit model crosses with cpu_shares_pct
    emulator_offloads: str = setting_default("emulator_offloads")
    losses_pct: tuple[float, ...] = default_of("losses_pct")
    streams: tuple[int, ...] = default_of("streams")
    sender_qdiscs: tuple[str, ...] = default_of("sender_qdiscs")
    sender_sysctls: NamedLists = default_of("sender_sysctls")
    flows: tuple[ExtraFlow, ...] = setting_default("flows")
    workloads: tuple[str, ...] = default_of("workloads")
    file_mb: float = setting_default("file_mb")
    transfer_timeout_s: float = setting_default("transfer_timeout_s")
    repetitions: int = setting_default("repetitions")
    duration_s: float = setting_default("duration_s")
    sample_ms: int | None = setting_default("sample_ms")
    sampler: str = setting_default("sampler")
    vcpu_trace: str = setting_default("vcpu_trace")
    bottleneck_ms: int | str = setting_default("bottleneck_ms")
    order: str = setting_default("order")
    seed: int = setting_default("seed")
    max_attempts: int = setting_default("max_attempts")
    host_guard: HostGuard | None = setting_default("host_guard")  # None: the default (or BBRLAB_HOST_GUARD), resolved when it runs
    delay_split: str = setting_default("delay_split")
    description: str = setting_default("description")
    blocks: int = setting_default("blocks")  # each point's repetitions in this many blocks (bbrlab.campaign.blocks)
    block_reboot: str = setting_default("block_reboot")
    adaptive: RepetitionRule | None = None  # from ``repetitions: {min, max, precision}``; repetitions is then max
    search: SearchRule | None = setting_default("search")  # a threshold search: cpu_shares_pct is its lattice
    expect: tuple[Expectation, ...] = setting_default("expect")  # judged by bbrlab check; not in the identity

    @classmethod
    def from_dict(cls, data: object, base: Path | None = None) -> CampaignSpec:
        """Validate ``data`` (a loaded spec); a relative testbed file is taken from ``base``."""
        return _validate(data, base)

    def to_dict(self) -> dict:
        """The spec as stored in ``spec.yaml``; the workload and queue-tree keys only when they differ from
        their defaults, so the directory of a campaign made before they existed still matches its spec."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if k != "adaptive"}
        d |= {dim.key: dim.stored(getattr(self, dim.key)) for dim in DIMENSIONS if dim.mapping}
        if self.adaptive is not None:
            d["repetitions"] = self.adaptive.to_dict()
        if self.search is not None:
            d["search"] = self.search.to_dict()
            del d["cpu_shares_pct"], d["repetitions"]
        else:
            del d["search"]
        if self.host_guard is not None:
            d["host_guard"] = self.host_guard.to_value()
        d["expect"] = [e.to_value() for e in self.expect]
        return {k: v for k, v in d.items() if k not in _OMITTED_DEFAULTS or v != _OMITTED_DEFAULTS[k]}

    # -- the grid ----------------------------------------------------------------------------
    def grid(self, kernel: str | None = None, sender_vcpus: int | None = None) -> list[Scenario]:
        """Every parameter combination, repetition 0, nested in the order of
        :data:`~bbrlab.campaign.dimensions.DIMENSIONS` (the contention's block: :meth:`contentions`); with
        ``kernel``, only that kernel's points, with ``sender_vcpus`` only that vCPU count's (the two outermost
        dimensions: each pair is one boot of the sender)."""
        axes = self._axes({"kernels": kernel, "sender_vcpus": sender_vcpus})
        return [self._scenario(dict(zip(axes, point, strict=True)), repetition=0)
                for point in itertools.product(*axes.values())]

    def _axes(self, pinned: dict | None = None, *, contention: bool = True) -> dict[Dimension | tuple | None, list]:
        """The grid's axes, outermost first: each dimension's values (an empty list: one point of its part's
        default, e.g. whatever kernel the sender runs; a dimension ``pinned`` to a value other than None: that value
        alone; a mapping dimension's: its assignments), the contention's dimensions as one axis (key None) of
        :meth:`contentions` (left out without ``contention``), and a dimension with one ``keyed_by`` it as one
        axis of ``(value, assignment)`` pairs (key: both dimensions)."""
        pinned = pinned or {}
        axes: dict[Dimension | tuple | None, list] = {}
        for d in DIMENSIONS:
            if d.part == "contention":
                if None not in axes and contention:
                    axes[None] = self.contentions()
            elif d.keyed_by is None:
                values = [pinned[d.key]] if pinned.get(d.key) is not None else d.axis(getattr(self, d.key))
                axes[d] = values or [None]
                for m in (m for m in DIMENSIONS if m.keyed_by == d.key):
                    axes[(d, m)] = [(v, a) for v in axes.pop(d) for a in m.axis(getattr(self, m.key), v)]
        return axes

    def contentions(self) -> list[Contention]:
        """The contention of every grid point, model by model: deadline's timeslice x mode x share (first, in the
        order specs have always had), cfs-quota's period x share (its ``timeslice_ms`` is the quota, share x
        period), cfs-burst's period x burst x share, credit's credit x share (its quota in the default period),
        competing-load's and none's share alone (their ``timeslice_ms`` is not used: :data:`UNUSED_TIMESLICE_MS`;
        none only at 100 %)."""
        out = []
        for model in self.contention_models:
            if (fixed := MODELS[model].fixed_share_pct) is not None:
                out.append(Contention(UNUSED_TIMESLICE_MS, fixed, model))
                continue
            values = [v for _, v in self.model_lists(model)]
            out += [contention_of(model, share, list(combo)) for combo in itertools.product(*values)
                    for share in self.shares_of(model)]
        return out

    def shares_of(self, model: str) -> tuple[float, ...]:
        """The shares ``model`` crosses with: ``credit_shares_pct`` for credit when given, else ``cpu_shares_pct``."""
        own = MODELS[model].own_shares_key
        return getattr(self, own) if own and getattr(self, own) else self.cpu_shares_pct

    def model_lists(self, model: str) -> list[tuple[str, tuple]]:
        """The spec's own lists of ``model`` (its key and values), crossed with the shares: deadline's timeslices
        and deadline modes, cfs-quota's periods, cfs-burst's periods and bursts, credit's credits; none for competing-load."""
        return [(key, getattr(self, key)) for key in MODELS[model].spec_keys]

    def link(self, rate, rtt, buf, loss, queue: str = "bbrlab") -> Link:
        """The link of one grid point (``queue``: its qdisc tree; the offloads are the spec's)."""
        return self._link_of({"rtt_ms": rtt, "rate_mbit": rate, "buffer_bdp": buf, "loss_model": "uniform" if loss
                              else "none", "loss_pct": loss, "queue": queue})

    def _link_of(self, given: dict) -> Link:
        """The link of the fields ``given`` (the link's dimensions' values), with the spec's own settings."""
        return Link(**given, delay_split=self.delay_split, emulator_offloads=self.emulator_offloads)

    def _scenario(self, point: dict, *, repetition: int) -> Scenario:
        """The scenario of one grid ``point`` (each axis of :meth:`_axes` with its value): each dimension's value
        where it lands (:attr:`Dimension.lands_in`)."""
        parts: dict[str, dict] = {"scenario": {}, "flow": {}, "link": {}}
        for key, value in point.items():
            for d, v in zip(key, value, strict=True) if isinstance(key, tuple) else [(key, value)]:
                if d is not None and v is not None:
                    parts[d.part].update(d.fields(v))
        flow = dict(parts["flow"])
        cca, workload = flow.pop("cca"), flow.pop("workload")
        return Scenario(self._link_of(parts["link"]), point[None],
                        Flow(cca, self._params(workload, flow), self.sample_ms, self.sampler, self.vcpu_trace,
                             self.bottleneck_ms), repetition, flows=self.flows, **parts["scenario"])

    def flow(self, workload: str, cca: str, streams: int) -> Flow:
        """The flow of one grid point: ``workload`` with its parameters (:meth:`workload_params`)."""
        return Flow(cca, self.workload_params(workload, streams), self.sample_ms, self.sampler, self.vcpu_trace,
                    self.bottleneck_ms)

    def workload_params(self, workload: str, streams: int = 1) -> WorkloadParams:
        """The parameters of ``workload`` (found by name, :data:`bbrlab.scenario.workloads.PARAMS`) with
        ``streams``: the spec's keys of the same names (iperf3's ``duration_s``; rsync's ``file_mb`` and
        ``transfer_timeout_s``)."""
        return self._params(workload, {"streams": streams})

    def _params(self, workload: str, given: dict) -> WorkloadParams:
        """``workload``'s parameters: the fields ``given`` (its dimensions' values), the others from the spec's
        keys of the same names."""
        own = {f.name: getattr(self, f.name) for f in fields(params_type(workload)) if f.name not in given}
        return params_of(workload, **given, **own)

    def plan(self) -> list[Scenario]:
        """All runs (grid x repetitions) in execution order, reproducible from ``seed``: block after block, kernel
        after kernel within a block, each as ``order`` says (:func:`bbrlab.campaign.order.plan_order`). Raises
        :class:`ValidationError` if two runs would share a run id (see :func:`check_unique_ids`)."""
        out = plan_order(self)
        check_unique_ids(out)
        return out

    @property
    def boot_groups(self) -> int:
        """How many sender boots one block's runs need: one per kernel x vCPU count (the plan keeps each pair's
        runs together; :func:`bbrlab.campaign.order.plan_order`)."""
        return max(1, len(self.kernels)) * max(1, len(self.sender_vcpus))

    def block_of(self, repetition: int) -> int:
        """The block (0 first) that runs ``repetition``: the repetitions split into ``blocks`` equal runs of
        consecutive repetitions."""
        return repetition // (self.repetitions // self.blocks)

    @property
    def runs(self) -> int:
        """Number of runs: grid points x repetitions (without building them)."""
        lists = math.prod(len(values) for values in self._axes(contention=False).values())
        return lists * self.contention_count * self.repetitions

    @property
    def contention_count(self) -> int:
        """How many contentions :meth:`contentions` makes, without building them."""
        return sum(1 if MODELS[m].fixed_share_pct is not None else math.prod(len(v) for _, v in self.model_lists(m)) * len(self.shares_of(m))
                   for m in self.contention_models)

    def expected_runs(self, spread: float) -> int:
        """The runs the plan is expected to take: all of them with a fixed number of repetitions; with adaptive
        ones, each point's :meth:`RepetitionRule.expected_reps` for runs spread by ``spread`` x the rate."""
        if self.adaptive is None:
            return self.runs
        return self.runs // self.repetitions * self.adaptive.expected_reps(spread)

    def expected_duration_s(self, overhead_s: float = ESTIMATED_OVERHEAD_S) -> float:
        """A plan estimate: iperf3 runs last ``duration_s``; an rsync copy the file's size at the link's
        rate less its loss, at most ``transfer_timeout_s``; each block's boot :data:`ESTIMATED_BLOCK_BOOT_S`."""
        total = 0.0
        for s in self.grid():
            if isinstance(s.flow.params, RsyncParams):
                copy_s = 0.0  # an unshaped link: no rate to estimate the copy from
                if s.link.rate_mbit is not None:
                    rate_bit_s = s.link.rate_mbit * 1e6 * (1 - s.link.effective_loss_pct / 100)
                    copy_s = min(s.flow.params.file_bytes * 8 / rate_bit_s, s.flow.params.transfer_timeout_s)
                total += copy_s + ESTIMATED_RSYNC_OVERHEAD_S
            else:
                total += max([self.duration_s] + [f.start_s + f.duration_s for f in self.flows]) + overhead_s
        boots = self.blocks * self.boot_groups if self.blocks > 1 else 0
        return total * self.repetitions + boots * ESTIMATED_BLOCK_BOOT_S


def check_unique_ids(runs: list[Scenario]) -> None:
    """Refuse a plan in which two different runs would share a run id.

    A run id ends in 40 bits of a hash of the whole scenario, so two scenarios of one campaign can
    collide, rarely; the second would then be taken for done once the first is recorded.
    """
    seen: dict[str, Scenario] = {}
    for s in runs:
        other = seen.setdefault(s.run_id, s)
        if other is not s:
            raise ValidationError(
                "plan", s.run_id, "a distinct run id for every run: two different scenarios of this grid hash "
                f"to the same id ({other.to_dict()} and {s.to_dict()}); change one value slightly")


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

#: The keys a spec must give.
_REQUIRED = (*(s.key for s in SETTINGS if s.required), *(d.key for d in DIMENSIONS if d.required))
#: The keys left out of spec.yaml at their defaults (the workload and queue-tree keys, the contention models'
#: lists, the blocks ...), so a campaign's directory made before they existed still matches its spec.
_OMITTED_DEFAULTS = {**{d.key: d.stored(d.default) for d in DIMENSIONS if d.omitted_default},
                     **{s.key: s.stored_default for s in SETTINGS if s.omitted_default}}


def _validate(data: object, base: Path | None = None) -> CampaignSpec:
    if not isinstance(data, dict):
        raise ValidationError("spec", type(data).__name__, "a mapping of keys such as name, ccas, rtts_ms")
    known = {*(s.key for s in SETTINGS), *(d.key for d in DIMENSIONS)}
    for key in data:
        if key not in known:
            raise ValidationError(key_name(key), data[key], f"a known key: {', '.join(sorted(known))}")
    d = dict(data)
    read: dict[str, object] = {}
    search = _search_shares(d)
    if search is not None:
        read["search"] = search
    for key in _REQUIRED:
        if key not in d:
            raise ValidationError(key, None, "required")
    read_settings(d, read, before_dimensions=True)
    if base is not None and d.get("testbed") is not None:  # a testbed file: from the spec's folder
        read["testbed"] = check_testbed(d["testbed"], base)
    checked = {dim.key: dim.checked(d[dim.key]) for dim in DIMENSIONS if dim.key in d}
    read_settings(d, read, before_dimensions=False)
    if search is not None:  # the spec's seed orders the search's runs (bbrlab.campaign.interleave)
        read["search"] = replace(search, seed=read.get("seed", CampaignSpec.seed))
    spec = CampaignSpec(**checked, **read)
    check_combinations(spec)
    check_against_spec(spec.expect, spec.ccas, _expect_lists(spec))
    return spec


def _expect_lists(spec: CampaignSpec) -> dict[str, tuple]:
    """The values of the ``runs`` columns an expectation's ``where`` is checked against (those the runs record as the
    spec gives them): the link's, the streams, the workloads, the shares (100 % too: an uncontended run's), and the
    timeslices when deadline is the only model (another model's ``timeslice_ms`` is its quota)."""
    lists = {"rtt_ms": spec.rtts_ms, "rate_mbit": spec.rates_mbit, "loss_pct": spec.losses_pct,
             "streams": spec.streams, "workload": spec.workloads,
             "cpu_share_pct": (*spec.cpu_shares_pct, *spec.credit_shares_pct, 100.0)}
    if spec.contention_models == (DEFAULT_MODEL,):
        lists["timeslice_ms"] = spec.timeslices_ms
    return lists


def _search_shares(d: dict) -> SearchRule | None:
    """A threshold search (``search``): its lattice becomes ``cpu_shares_pct`` and its ``max`` the repetitions;
    the spec then gives neither, nor adaptive repetitions, and contends by deadline alone."""
    if "search" not in d:
        return None
    rule = SETTING["search"].read(d["search"])
    for key in ("cpu_shares_pct", "repetitions"):
        if key in d:
            raise ValidationError(key, d[key], "absent in a threshold search (search: sets the shares it probes "
                                  "and their repetitions)")
    models = d.get("contention_models", [DEFAULT_MODEL])
    if models != [DEFAULT_MODEL]:
        raise ValidationError("contention_models", models, "[deadline] in a threshold search (the share searched "
                              "is a deadline reservation's)")
    d["cpu_shares_pct"], d["repetitions"] = rule.shares(), rule.max_reps
    return rule


def spec_from_yaml(text: str, source: str = "<spec>", base: Path | None = None) -> CampaignSpec:
    """Parse and validate a spec's YAML text; a relative testbed file or kernel path is taken from ``base``."""
    from bbrlab.core.yamlfile import load_text

    data = load_text(text, source)
    if base is not None and isinstance(data, dict) and isinstance(data.get("kernels"), list):
        data["kernels"] = [os.path.normpath(os.path.join(base, k)) if isinstance(k, str) and "/" in k
                           and not k.startswith("/") else k for k in data["kernels"]]  # kernel paths: from the spec
    return _validate(data, base)


def load_spec(path: str | Path) -> CampaignSpec:
    """Read and validate a YAML spec file (a relative ``testbed:`` file is taken from its folder)."""
    path = Path(path)
    try:
        text = read_capped(path, "spec", "campaign spec").decode()  # over 1 MiB: refused before it is read
    except (OSError, UnicodeDecodeError) as e:
        raise BbrlabError(f"cannot read campaign spec {path}: {getattr(e, 'strerror', None) or e}") from None
    return spec_from_yaml(text, str(path), path.parent)
