"""Campaigns: a YAML spec -> a validated grid of scenarios -> an ordered plan -> runs that survive crashes.

Spec keys (see specs/*.yaml)::

    name: fig4-100mbit          # [A-Za-z0-9._-], used in paths
    testbed: lab.yaml           # optional: a local testbed's name, or a testbed file (relative to
                                # this spec's folder); default: --testbed, else the local testbed up
    ccas: [cubic, bbr, bbr2b]
    timeslices_ms: [1, 10, 20]
    cpu_shares_pct: [10, 25, 40, 55, 70, 100]   # 100 = no deadline policy
    rtts_ms: [10, 20, 40]
    rates_mbit: [100]
    buffers_bdp: [1]
    losses_pct: [0]             # > 0 means uniform random loss (at most 50)
    streams: [1]
    workloads: [iperf3]         # iperf3 (bulk transfer of duration_s) and/or rsync (a file over SSH)
    file_mb: 160                # rsync: the file's size in 10^6 bytes
    transfer_timeout_s: 1200    # rsync: a copy still running then is ended and recorded as timed out
    repetitions: 30
    duration_s: 20              # iperf3's test duration
    sample_ms: null             # e.g. 10: sample the data sockets every 10 ms (figures 5, 6, 9, 11)
    sampler: bpf                # bpf (default), netlink or ss; 'sample_ss_ms: N' = sample_ms N with ss
    order: blocked-random       # or sequential, random
    seed: 1
    max_attempts: 3             # a failing run is tried at most this often
    delay_split: symmetric      # RTT/2 each way; 'forward' puts the whole RTT on the data direction

Every value is checked before anything runs; an error names the key and index (``cpu_shares_pct[2]``).
Values are also checked in combination: each timeslice with each share (the deadline period), each
rate x RTT x buffer against the kernel's limits of the qdiscs (tbf's 32-bit byte counts), the number
of runs, and, before a campaign starts, each timeslice x share against the live limits of the host
that runs the sender's vCPUs (:func:`check_admission`). A key given twice is refused.

Crash safety: the campaign directory holds ``spec.yaml`` and ``plan.json`` (the execution order). A
run counts once its directory is renamed into ``runs/`` (:mod:`bbrlab.run.record`); resuming skips those,
clears ``.tmp/`` and retries failed runs until ``max_attempts``. A ``.lock`` file (flock) keeps two
processes from working on the same directory; the kernel releases it when a process dies, even by
SIGKILL.

One campaign, one testbed: a campaign resumed on another testbed, accelerator, sender vCPU count or sender
kernel than its records ran on is refused before its first run (:func:`check_same_testbed`), and a run whose
sender turns out to run another kernel than the campaign's earlier runs of that kernel is not recorded,
unless ``allow_mixed`` (``--allow-mixed``); then every record made says so (``metadata.mixed``).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

from bbrlab.core.errors import BbrlabError, ValidationError, key_name
from bbrlab.core.scenario import (
    DEFAULT_FILE_MB,
    DEFAULT_SAMPLER,
    DEFAULT_TRANSFER_TIMEOUT_S,
    BufferBelowMinimum,
    Contention,
    Flow,
    Link,
    Scenario,
    check_cca,
    check_sampling_load,
)
from bbrlab.core.signals import interruptible
from bbrlab.run import record as rec

PLAN_SCHEMA = "bbrlab.plan/1"
ORDERS = ("blocked-random", "sequential", "random")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Seconds a run costs beyond its iperf3 duration, for plan estimates before anything is measured.
ESTIMATED_OVERHEAD_S = 2.0
#: Seconds an rsync run costs beyond its copy (the receiver's sshd, keys, the SSH handshake).
ESTIMATED_RSYNC_OVERHEAD_S = 8.0


@dataclass(frozen=True)
class CampaignSpec:
    """A validated campaign spec. Build with :func:`load_spec` / :meth:`from_dict`."""

    name: str
    ccas: tuple[str, ...]
    timeslices_ms: tuple[float, ...]
    cpu_shares_pct: tuple[float, ...]
    rtts_ms: tuple[float, ...]
    rates_mbit: tuple[float, ...]
    testbed: str | None = None  # None: the command's --testbed, else the local testbed that is up
    kernels: tuple[str, ...] = ()  # the sender's kernels (a dimension); empty: whatever the sender runs
    buffers_bdp: tuple[float, ...] = (1.0,)
    losses_pct: tuple[float, ...] = (0.0,)
    streams: tuple[int, ...] = (1,)
    workloads: tuple[str, ...] = ("iperf3",)
    file_mb: float = DEFAULT_FILE_MB
    transfer_timeout_s: float = DEFAULT_TRANSFER_TIMEOUT_S
    repetitions: int = 30
    duration_s: float = 20.0
    sample_ms: int | None = None
    sampler: str = DEFAULT_SAMPLER
    order: str = "blocked-random"
    seed: int = 1
    max_attempts: int = 3
    delay_split: str = "symmetric"
    description: str = ""

    @classmethod
    def from_dict(cls, data: object, base: Path | None = None) -> CampaignSpec:
        """Validate ``data`` (a loaded spec); a relative testbed file is taken from ``base``."""
        return _validate(data, base)

    def to_dict(self) -> dict:
        """The spec as stored in ``spec.yaml``; the workload keys only when they differ from their defaults,
        so the directory of a campaign made before workloads existed still matches its spec."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        if not d["kernels"]:
            del d["kernels"]  # as in directories made before kernels were a dimension
        return {k: v for k, v in d.items() if k not in _WORKLOAD_DEFAULTS or v != _WORKLOAD_DEFAULTS[k]}

    # -- the grid ----------------------------------------------------------------------------
    def grid(self, kernel: str | None = None) -> list[Scenario]:
        """Every parameter combination, repetition 0, in a fixed nested order; with ``kernel``, only that
        kernel's points (the kernel is the outermost dimension)."""
        kernels = [kernel] if kernel is not None else (list(self.kernels) or [None])
        points = itertools.product(kernels, self.workloads, self.ccas, self.timeslices_ms, self.cpu_shares_pct,
                                   self.rtts_ms, self.rates_mbit, self.buffers_bdp, self.losses_pct, self.streams)
        return [self._scenario(*p, repetition=0) for p in points]

    def link(self, rate, rtt, buf, loss) -> Link:
        """The link of one grid point."""
        return Link(rtt_ms=rtt, rate_mbit=rate, buffer_bdp=buf, loss_model="uniform" if loss else "none",
                    loss_pct=loss, delay_split=self.delay_split)

    def _scenario(self, kernel, workload, cca, ts, share, rtt, rate, buf, loss, streams, *, repetition: int) -> Scenario:
        link = self.link(rate, rtt, buf, loss)
        return Scenario(link, Contention(ts, share), self.flow(workload, cca, streams), repetition, kernel)

    def flow(self, workload: str, cca: str, streams: int) -> Flow:
        """The flow of one grid point: iperf3 with the spec's duration, or rsync with its file and timeout."""
        if workload == "rsync":
            return Flow(cca=cca, streams=streams, sample_ms=self.sample_ms, sampler=self.sampler, workload="rsync",
                        file_mb=self.file_mb, transfer_timeout_s=self.transfer_timeout_s)
        return Flow(cca=cca, duration_s=self.duration_s, streams=streams, sample_ms=self.sample_ms,
                    sampler=self.sampler)

    def plan(self) -> list[Scenario]:
        """All runs (grid x repetitions) in execution order, reproducible from ``seed``.

        With several sender kernels the runs of one kernel stay together (in the order the spec lists
        the kernels), ordered within the block as ``order`` says: the sender boots once per kernel.
        Raises :class:`ValidationError` if two runs would share a run id (see :func:`check_unique_ids`).
        """
        rng = random.Random(self.seed)
        out = [s for kernel in (self.kernels or (None,)) for s in self._ordered(self.grid(kernel), rng)]
        check_unique_ids(out)
        return out

    def _ordered(self, grid: list[Scenario], rng: random.Random) -> list[Scenario]:
        with_rep = [[_with_repetition(s, r) for s in grid] for r in range(self.repetitions)]
        if self.order == "sequential":
            out = [with_rep[r][i] for i in range(len(grid)) for r in range(self.repetitions)]
        elif self.order == "random":
            out = [s for block in with_rep for s in block]
            rng.shuffle(out)
        else:
            out = []
            for block in with_rep:  # blocked-random: each repetition block is its own permutation
                block = list(block)
                rng.shuffle(block)
                out.extend(block)
        return out

    @property
    def runs(self) -> int:
        """Number of runs: grid points x repetitions (without building them)."""
        lists = math.prod(len(getattr(self, key)) for key in (*_LISTS, "workloads"))
        return lists * max(1, len(self.kernels)) * self.repetitions

    def expected_duration_s(self, overhead_s: float = ESTIMATED_OVERHEAD_S) -> float:
        """A plan estimate: iperf3 runs last ``duration_s``; an rsync copy the file's size at the link's
        rate less its loss, at most ``transfer_timeout_s``."""
        total = 0.0
        for s in self.grid():
            if s.flow.workload == "rsync":
                copy_s = 0.0  # an unshaped link: no rate to estimate the copy from
                if s.link.rate_mbit is not None:
                    rate_bit_s = s.link.rate_mbit * 1e6 * (1 - s.link.effective_loss_pct / 100)
                    copy_s = min(s.flow.file_bytes * 8 / rate_bit_s, s.flow.transfer_timeout_s)
                total += copy_s + ESTIMATED_RSYNC_OVERHEAD_S
            else:
                total += self.duration_s + overhead_s
        return total * self.repetitions


def _with_repetition(s: Scenario, r: int) -> Scenario:
    return Scenario(s.link, s.contention, s.flow, r, s.kernel)


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

_LISTS = ("ccas", "timeslices_ms", "cpu_shares_pct", "rtts_ms", "rates_mbit", "buffers_bdp", "losses_pct",
          "streams")
_REQUIRED = ("name", "ccas", "timeslices_ms", "cpu_shares_pct", "rtts_ms", "rates_mbit")
#: At most this many runs per campaign (grid points x repetitions): 100000 runs of 20 s take 25 days.
MAX_RUNS = 100_000
#: The Link fields a combination check can name, and the spec list each comes from.
_LINK_LISTS = {"link.rate_mbit": "rates_mbit", "link.rtt_ms": "rtts_ms", "link.buffer_bdp": "buffers_bdp"}
#: The workload keys and their defaults (left out of spec.yaml when unchanged).
_WORKLOAD_DEFAULTS = {"workloads": ["iperf3"], "file_mb": DEFAULT_FILE_MB,
                      "transfer_timeout_s": DEFAULT_TRANSFER_TIMEOUT_S}


def _number(key: str, value: object, *, integer: bool = False) -> float | int:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValidationError(key, value, "a whole number" if integer else "a number")
    return value


def _list(data: dict, key: str) -> list:
    value = data[key]
    if not isinstance(value, list) or not value:
        raise ValidationError(key, value, "a non-empty list, e.g. [1, 10, 20]")
    if len(value) > 1000:
        raise ValidationError(key, f"{len(value)} values", "at most 1000 values")
    return value


def _rename_field(e: ValidationError, key: str) -> ValidationError:
    return ValidationError(key, e.value, e.allowed)


def _check_each(key: str, values: list, probe: Callable[[object], object]) -> tuple:
    """Validate every element with ``probe`` (which builds the real dataclass) and name ``key[i]``."""
    out = []
    for i, v in enumerate(values):
        if key not in ("ccas", "workloads", "kernels"):
            _number(f"{key}[{i}]", v, integer=key == "streams")
        try:
            probe(v)
        except ValidationError as e:
            raise _rename_field(e, f"{key}[{i}]") from None
        out.append(v)
    if len(set(out)) != len(out):
        raise ValidationError(key, values, "distinct values (a value listed twice would run twice)")
    return tuple(out)


def _share_in_range(value: object) -> None:
    """A share on its own: 0 < share <= 100 (whether its period is possible depends on the timeslice)."""
    if not 0 < value <= 100:
        raise ValidationError("contention.cpu_share_pct", value, "0 < cpu_share_pct <= 100 %")


def _check_testbed(value: object, base: Path | None) -> str | None:
    """``None`` (the default testbed), a local testbed's name, or a testbed file relative to ``base``."""
    from bbrlab.testbed.local.state import NAME_RE

    if value is None:
        return None
    allowed = ("a local testbed's name (a-z first, then a-z, 0-9 or -; at most 12) or a testbed file "
               "(a path containing / or ending in .yaml, relative to the spec's folder)")
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\n\r\0"):
        raise ValidationError("testbed", value, allowed)
    if "/" not in value and not value.endswith((".yaml", ".yml")):
        if not NAME_RE.match(value):
            raise ValidationError("testbed", value, allowed)
        return value
    path = Path(os.path.expanduser(value))
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return os.path.normpath(path)


def _sampling(d: dict) -> dict:
    """``sample_ms`` and ``sampler``; the older ``sample_ss_ms: N`` means ``sample_ms: N, sampler: ss``."""
    out: dict = {}
    if d.get("sample_ss_ms") is not None:
        if d.get("sample_ms") is not None or "sampler" in d:
            raise ValidationError("sample_ss_ms", d["sample_ss_ms"], "absent when sample_ms or sampler is given "
                                  "(sample_ss_ms: N is the older form of sample_ms: N with sampler: ss)")
        d = {"sample_ms": d["sample_ss_ms"], "sampler": "ss"}
        key = "sample_ss_ms"
    else:
        key = "sample_ms"
    if d.get("sample_ms") is not None:
        out["sample_ms"] = _number(key, d["sample_ms"], integer=True)
    if "sampler" in d:
        out["sampler"] = d["sampler"]
    try:
        Flow("cubic", sample_ms=out.get("sample_ms"), sampler=out.get("sampler", DEFAULT_SAMPLER))
    except ValidationError as e:
        raise _rename_field(e, key if e.field.endswith("sample_ms") else e.field.split(".")[-1]) from None
    return out


def _validate(data: object, base: Path | None = None) -> CampaignSpec:
    if not isinstance(data, dict):
        raise ValidationError("spec", type(data).__name__, "a mapping of keys such as name, ccas, rtts_ms")
    known = {f.name for f in fields(CampaignSpec)} | {"sample_ss_ms"}  # the older form of sample_ms + sampler: ss
    for key in data:
        if key not in known:
            raise ValidationError(key_name(key), data[key], f"a known key: {', '.join(sorted(known))}")
    for key in _REQUIRED:
        if key not in data:
            raise ValidationError(key, None, "required")
    d = dict(data)
    name = d["name"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValidationError("name", name, "1-64 characters of A-Z a-z 0-9 . _ - (it names directories)")
    testbed = _check_testbed(d.get("testbed"), base)
    lists = {key: _list(d, key) for key in _LISTS if key in d}
    checked = {
        "ccas": _check_each("ccas", lists["ccas"], lambda v: check_cca(v, "flow.cca")),
        "timeslices_ms": _check_each("timeslices_ms", lists["timeslices_ms"], lambda v: Contention(v, 100)),
        "cpu_shares_pct": _check_each("cpu_shares_pct", lists["cpu_shares_pct"], _share_in_range),
        "rtts_ms": _check_each("rtts_ms", lists["rtts_ms"], _floor_later(lambda v: Link(rtt_ms=v, rate_mbit=100))),
        "rates_mbit": _check_each("rates_mbit", lists["rates_mbit"],
                                  _floor_later(lambda v: Link(rtt_ms=10, rate_mbit=v))),
    }
    if "buffers_bdp" in lists:
        checked["buffers_bdp"] = _check_each(
            "buffers_bdp", lists["buffers_bdp"], _floor_later(lambda v: Link(rtt_ms=10, rate_mbit=100, buffer_bdp=v)))
    if "losses_pct" in lists:
        checked["losses_pct"] = _check_each(
            "losses_pct", lists["losses_pct"],
            lambda v: Link(rtt_ms=10, rate_mbit=100, loss_model="uniform" if v else "none", loss_pct=v))
    if "streams" in lists:
        checked["streams"] = _check_each("streams", lists["streams"], lambda v: Flow("cubic", streams=v))
    if "kernels" in d:
        checked["kernels"] = _check_each("kernels", _list(d, "kernels"), _kernel_name)
    if "workloads" in d:
        checked["workloads"] = _check_each("workloads", _list(d, "workloads"),
                                           lambda v: Flow("cubic", workload=v))
    scalars = _check_scalars(d)
    spec = CampaignSpec(name=name, testbed=testbed, **checked, **scalars)
    _check_combinations(spec)
    return spec


def _floor_later(probe: Callable[[object], object]) -> Callable[[object], object]:
    """``probe`` of one value, leaving a buffer below two frames to :func:`_check_links`: whether a buffer
    is large enough depends on the rate x RTT it meets, which that check names."""
    def checked(value: object) -> None:
        try:
            probe(value)
        except BufferBelowMinimum:
            pass
    return checked


def _kernel_name(value: object) -> str:
    """A sender kernel as a spec names it: a Debian kernel's name, or the path of a kernel directory or
    .deb (checked for real, and downloaded if need be, by ``testbed.check_kernel`` when the campaign starts)."""
    from bbrlab.kernel.sender import KERNEL_NAMES

    if isinstance(value, str) and (value in KERNEL_NAMES or "/" in value or value.endswith(".deb")):
        Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow("cubic"), kernel=value)
        return value
    raise ValidationError("kernel", value, f"one of {', '.join(KERNEL_NAMES)}, or the path of a kernel directory "
                          "or linux-image .deb (with a '/')")


def _check_scalars(d: dict) -> dict:
    out: dict = {}
    if "repetitions" in d:
        out["repetitions"] = _number("repetitions", d["repetitions"], integer=True)
        if not 1 <= out["repetitions"] <= 1000:
            raise ValidationError("repetitions", out["repetitions"], "1 <= repetitions <= 1000")
    if "duration_s" in d:
        out["duration_s"] = _number("duration_s", d["duration_s"])
        try:
            Flow("cubic", duration_s=out["duration_s"])
        except ValidationError as e:
            raise _rename_field(e, "duration_s") from None
    out.update(_sampling(d))
    for key in ("file_mb", "transfer_timeout_s"):
        if key in d:
            out[key] = _number(key, d[key])
            try:
                Flow("cubic", workload="rsync", **{key: out[key]})
            except ValidationError as e:
                raise _rename_field(e, key) from None
    if "order" in d:
        if d["order"] not in ORDERS:
            raise ValidationError("order", d["order"], f"one of {', '.join(ORDERS)}")
        out["order"] = d["order"]
    if "seed" in d:
        out["seed"] = _number("seed", d["seed"], integer=True)
        if not 0 <= out["seed"] < 2**63:
            raise ValidationError("seed", out["seed"], "0 <= seed < 2**63")
    if "max_attempts" in d:
        out["max_attempts"] = _number("max_attempts", d["max_attempts"], integer=True)
        if not 1 <= out["max_attempts"] <= 10:
            raise ValidationError("max_attempts", out["max_attempts"], "1 <= max_attempts <= 10")
    if "delay_split" in d:
        if d["delay_split"] not in ("symmetric", "forward"):
            raise ValidationError("delay_split", d["delay_split"], "symmetric or forward")
        out["delay_split"] = d["delay_split"]
    if "description" in d:
        if not isinstance(d["description"], str):
            raise ValidationError("description", d["description"], "text")
        out["description"] = d["description"]
    return out


def _check_combinations(spec: CampaignSpec) -> None:
    """What is invalid only together: the number of runs, a deadline period out of the kernel's range
    (timeslice / share), a link beyond the qdiscs' kernel limits (rate x RTT x buffer), rsync over several
    streams."""
    if spec.runs > MAX_RUNS:
        raise ValidationError("grid x repetitions", spec.runs,
                              f"at most {MAX_RUNS} runs (the product of the list lengths x repetitions); "
                              "split the campaign")
    if "rsync" in spec.workloads:
        for j, streams in enumerate(spec.streams):
            if streams != 1:
                raise ValidationError(f"streams[{j}] with workloads[{spec.workloads.index('rsync')}]", streams,
                                      "1 for the rsync workload (one SSH connection); run other stream counts "
                                      "in an iperf3-only campaign")
    for i, ts in enumerate(spec.timeslices_ms):
        for j, share in enumerate(spec.cpu_shares_pct):
            try:
                Contention(ts, share)
            except ValidationError as e:
                raise ValidationError(f"cpu_shares_pct[{j}] with timeslices_ms[{i}]", (share, ts), e.allowed) from None
    _check_links(spec)
    _check_sampling(spec)


def _check_sampling(spec: CampaignSpec) -> None:
    """A sampled spec: every stream count within the sampler's port cap, and samples x streams over each
    workload's duration (rsync: its timeout) within :data:`bbrlab.core.scenario.MAX_SAMPLE_RECORDS`."""
    if spec.sample_ms is None:
        return
    durations = {"iperf3": ("duration_s", spec.duration_s), "rsync": ("transfer_timeout_s", spec.transfer_timeout_s)}
    for j, streams in enumerate(spec.streams):
        for workload in spec.workloads:
            key, seconds = durations[workload]
            check_sampling_load(spec.sample_ms, streams, seconds, spec.sampler,
                                fields=("sample_ms", f"streams[{j}]", key))


def _check_links(spec: CampaignSpec) -> None:
    """Every rate x RTT x buffer builds a :class:`Link`, which checks the kernel's limits of the qdiscs
    (each loss was checked on its own: loss changes no size or time in the qdiscs)."""
    indexed = [list(enumerate(getattr(spec, key))) for key in ("rates_mbit", "rtts_ms", "buffers_bdp")]
    for (i, rate), (j, rtt), (k, buf) in itertools.product(*indexed):
        try:
            spec.link(rate, rtt, buf, 0)
        except ValidationError as e:
            index = {"rates_mbit": i, "rtts_ms": j, "buffers_bdp": k}
            lead = _LINK_LISTS.get(e.field, "buffers_bdp")
            others = " and ".join(f"{key}[{n}]" for key, n in index.items() if key != lead)
            raise ValidationError(f"{lead}[{index[lead]}] with {others}", (rate, rtt, buf), e.allowed) from None


def check_admission(spec: CampaignSpec, limits, n_threads: int) -> None:
    """Refuse the spec if the host that runs the sender's vCPUs can never admit one of its
    timeslice x share pairs for ``n_threads`` vCPU threads (``limits``: its
    :class:`~bbrlab.contention.deadline.KernelLimits`, read live). Checked before a campaign starts."""
    from bbrlab.contention.deadline import check_fits

    for i, ts in enumerate(spec.timeslices_ms):
        for j, share in enumerate(spec.cpu_shares_pct):
            try:
                check_fits(Contention(ts, share), limits, n_threads)
            except ValidationError as e:
                raise ValidationError(f"cpu_shares_pct[{j}] with timeslices_ms[{i}]", (share, ts),
                                      f"{e.allowed} (the sender's hypervisor host, {n_threads} vCPU thread(s))") from None


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
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BbrlabError(f"cannot read campaign spec {path}: {getattr(e, 'strerror', None) or e}") from None
    return spec_from_yaml(text, str(path), path.parent)


# ---------------------------------------------------------------------------------------------
# The campaign directory
# ---------------------------------------------------------------------------------------------

class Planned(Protocol):
    """What the campaign directory and the run loop need of a spec: a :class:`CampaignSpec`, or another
    plan of scenarios such as :class:`bbrlab.campaign.calibrate.CalibrationSpec` (whose points are not a full grid).
    ``to_dict()`` is written as ``spec.yaml`` and must hold ``max_attempts``."""

    name: str
    seed: int
    max_attempts: int

    def plan(self) -> list[Scenario]: ...

    def to_dict(self) -> dict: ...


def plan_dict(spec: Planned) -> dict:
    return {
        "schema": PLAN_SCHEMA,
        "campaign": spec.name,
        "seed": spec.seed,
        "runs": [{"run_id": s.run_id, "scenario": s.to_dict()} for s in spec.plan()],
    }


def spec_yaml(spec: Planned) -> str:
    """The ``spec.yaml`` a campaign directory keeps (the validated spec, every key explicit)."""
    import yaml

    return yaml.safe_dump(spec.to_dict(), sort_keys=False)


def check_out_dir(spec: Planned, out_dir: str | Path) -> bool:
    """Whether ``out_dir`` may hold ``spec``'s campaign: True to resume it, False for a new one.

    Reads only; raises :class:`~bbrlab.campaign.directory.OutDirError` saying why not (see
    :mod:`bbrlab.campaign.directory`)."""
    from .directory import check_out_dir as check

    return check(out_dir, spec.to_dict(), spec_yaml(spec), plan_dict(spec))


def prepare(spec: Planned, out_dir: str | Path) -> dict:
    """Create (or re-open and repair) the campaign directory; return the plan.

    A directory holding anything but this campaign is refused before anything is written (no silent
    mixing, nothing of the user's overwritten); on resume, inconsistent leftovers are repaired or
    explained (:func:`bbrlab.campaign.directory.repair`).
    """
    from .directory import PLAN_FILE, SPEC_FILE, repair
    from .directory import check_out_dir as check

    out = Path(out_dir)
    wanted = plan_dict(spec)
    text = spec_yaml(spec)
    resuming = check(out, spec.to_dict(), text, wanted)
    out.mkdir(parents=True, exist_ok=True)
    if not resuming:
        rec.write_atomic(out / SPEC_FILE, text)
        rec.write_json_atomic(out / PLAN_FILE, wanted)
        return wanted
    if not (out / SPEC_FILE).exists():
        rec.write_atomic(out / SPEC_FILE, text)
    repair(out, [r["run_id"] for r in wanted["runs"]])
    return wanted


def load_plan(out_dir: str | Path) -> dict:
    from .directory import read_json

    path = Path(out_dir) / "plan.json"
    if not path.is_file():
        raise BbrlabError(f"{out_dir} is not a campaign directory (no plan.json)")
    plan = read_json(path)
    if not isinstance(plan, dict) or not isinstance(plan.get("runs"), list):
        raise BbrlabError(f"{path} is not a campaign plan (no list of runs)")
    return plan


def _max_attempts(out_dir: Path) -> int:
    import yaml

    spec_path = out_dir / "spec.yaml"
    data = yaml.safe_load(spec_path.read_text()) if spec_path.exists() else {}
    return int((data or {}).get("max_attempts", 3))


def status(out_dir: str | Path) -> dict:
    """Counts for a campaign directory: planned, done, failed (attempts exhausted), failed_attempts,
    running (being written by a live process), remaining (still to run)."""
    out = Path(out_dir)
    plan = load_plan(out)
    max_attempts = _max_attempts(out)
    run_ids = [r["run_id"] for r in plan["runs"]]
    done = sum(rec.is_complete(out, r) for r in run_ids)
    attempts = {r: rec.failed_attempts(out, r) for r in run_ids}
    given_up = sum(1 for r in run_ids if not rec.is_complete(out, r) and len(attempts[r]) >= max_attempts)
    running = [r for r in rec.in_progress(out) if r in set(run_ids)]
    return {
        "campaign": plan["campaign"],
        "planned": len(run_ids),
        "done": done,
        "failed": given_up,
        "failed_attempts": sum(len(a) for a in attempts.values()),
        "running": len(running),
        "remaining": len(run_ids) - done - given_up,
    }


def announcing(run_fn: RunFunction, testbed_name: str, spec: CampaignSpec, out_dir: str | Path) -> RunFunction:
    """``run_fn``, telling the testbed's lock what it is running before each attempt, so that
    ``bbrlab testbed status`` can say "campaign demo, run 12/48 <run_id>" without touching the testbed.

    Call the result while holding the testbed's lock (:func:`bbrlab.testbed.lock.set_activity`)."""
    from bbrlab.testbed.lock import set_activity

    planned = spec.runs
    already = len(list((Path(out_dir) / rec.RUNS).glob(f"*/{rec.RECORD_FILE}")))
    started: dict[str, int] = {}

    def run(scenario: Scenario, staging: Path, **kw) -> dict:
        run_id = kw.get("run_id", scenario.run_id)
        index = started.setdefault(run_id, already + len(started) + 1)
        set_activity(testbed_name, "campaign run", campaign=spec.name, out=str(out_dir), run_id=run_id,
                     attempt=kw.get("attempt"), index=index, planned=planned)
        return run_fn(scenario, staging, **kw)

    return run


@contextmanager
def directory_lock(out_dir: Path) -> Iterator[None]:
    """Exclusive lock on the campaign directory; refused at once if another process holds it.

    The lock file is opened without following a symbolic link and created 0600; one that is not a regular
    file of ours is refused (bbrlab.testbed.lock.open_lock_file)."""
    from bbrlab.testbed.lock import open_lock_file

    fd = open_lock_file(Path(out_dir) / ".lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BbrlabError(f"another bbrlab process is running the campaign in {out_dir}") from None
        yield
    finally:
        os.close(fd)


#: A run function: ``run_fn(scenario, staging_dir, *, run_id, attempt) -> metadata`` writes the run's files into
#: ``staging_dir`` and returns the record's ``metadata``; it raises when the run fails (the exception may carry
#: the metadata measured so far, see :mod:`bbrlab.run.runmeta`).
RunFunction = Callable[..., dict]


def failure_reason(error: BaseException) -> str:
    """``Type: message (at file:line in function)``: where it was raised, since some errors (a bare
    EOFError from an SSH channel) carry no message of their own."""
    import traceback

    text = f"{type(error).__name__}: {error}"
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text


def failure_record(run_id: str, campaign: str, scenario: Scenario, attempt: int, started_at: str,
                   error: BaseException) -> dict:
    """The record of a failed attempt: the reason, with where it was raised, and what the run measured."""
    from bbrlab.run.runmeta import of_error

    return rec.build_record(run_id=run_id, campaign=campaign, status="failed", reason=failure_reason(error),
                            attempt=attempt, started_at=started_at, ended_at=rec.now_iso(),
                            scenario=scenario.to_dict(), metadata=of_error(error))


# ---------------------------------------------------------------------------------------------
# One campaign, one testbed
# ---------------------------------------------------------------------------------------------

#: What a resumed campaign's testbed must share with the one its records ran on (keys of
#: ``Testbed.describe()`` and ``metadata.testbed``); the sender kernel is its ``uname -r``.
SAME_TESTBED_KEYS = ("name", "kind", "accelerator", "sender_vcpus", "sender_kernel")
MIXED_OPTION = "--allow-mixed"


class MixedTestbed(ValidationError):
    """A campaign would mix testbeds (:func:`check_same_testbed`); never a failed attempt of a run."""


def _records(out: Path) -> list[dict]:
    """Every record of the campaign (ok runs and failed attempts) that says what testbed it ran on, oldest
    first; unreadable ones are skipped (resume sets them aside)."""
    import json

    found = []
    for path in [*(out / rec.RUNS).glob(f"*/{rec.RECORD_FILE}"), *(out / rec.FAILED).glob(f"*/{rec.RECORD_FILE}")]:
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        testbed = (record.get("metadata") or {}).get("testbed") if isinstance(record, dict) else None
        if isinstance(testbed, dict) and testbed.get("name"):
            found.append(record)
    return sorted(found, key=lambda r: str(r.get("started_at")))


def testbeds_ran_on(out_dir: str | Path) -> dict[str, dict]:
    """The testbeds a campaign's records ran on: ``{name: first record of that testbed}``, in the order of
    those first runs (the campaign's first run first); empty for a new campaign."""
    out: dict[str, dict] = {}
    for record in _records(Path(out_dir)):
        out.setdefault(record["metadata"]["testbed"]["name"], record)
    return out


def _identity(testbed: dict, kernel_dimension: bool) -> dict:
    keys = [k for k in SAME_TESTBED_KEYS if not (kernel_dimension and k == "sender_kernel")]
    return {k: testbed.get(k) for k in keys}


def testbed_differences(out_dir: str | Path, offered: list[dict], *, kernel_dimension: bool = False) -> list[str]:
    """How the testbeds ``offered`` now (each ``Testbed.describe()``) differ from those the campaign in
    ``out_dir`` ran on, one sentence each; empty when they do not (or nothing is recorded yet).

    A testbed the records never name is a different testbed; one they name must match the first run it
    made in :data:`SAME_TESTBED_KEYS`. With a ``kernels:`` dimension (``kernel_dimension``) the sender
    boots each block's kernel, so its kernel is compared run by run instead (:func:`check_run_testbed`)."""
    ran = testbeds_ran_on(out_dir)
    if not ran:
        return []
    first = next(iter(ran.values()))
    out = []
    for tb in offered:
        mine = ran.get(tb.get("name"))
        if mine is None:
            names = ", ".join(repr(n) for n in ran)
            out.append(f"testbed {tb.get('name')!r} is not one the campaign ran on (it ran on {names}; first run "
                       f"{first['run_id']} on {_said(_identity(first['metadata']['testbed'], kernel_dimension))})")
            continue
        was, now = _identity(mine["metadata"]["testbed"], kernel_dimension), _identity(tb, kernel_dimension)
        for key in was:
            if was[key] != now[key]:
                out.append(f"testbed {tb.get('name')!r}: {key} {now[key]!r} now, but the campaign's runs on it "
                           f"ran with {was[key]!r} (first run {mine['run_id']})")
    return out


def _said(identity: dict) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in identity.items() if k != "name")


def check_same_testbed(out_dir: str | Path, offered: list[dict], *, allow_mixed: bool = False,
                       kernel_dimension: bool = False) -> dict | None:
    """Refuse to resume the campaign in ``out_dir`` on testbeds other than those it ran on.

    ``offered``: each testbed the runs would go to, as ``Testbed.describe()`` gives it (see
    :func:`testbed_differences`). Raises :class:`MixedTestbed` (a :class:`ValidationError` naming
    ``--testbed``, what the campaign ran on and what is offered now) unless ``allow_mixed``. Returns what the
    records made now carry (``metadata.mixed``): ``{"allowed": True, "differences": [...]}`` with
    ``allow_mixed``, else None. Reads only; the single-testbed and the multi-testbed paths both call it
    before their first run."""
    differences = testbed_differences(out_dir, offered, kernel_dimension=kernel_dimension)
    if differences and not allow_mixed:
        raise MixedTestbed("--testbed", ", ".join(str(tb.get("name")) for tb in offered),
                           f"the testbed this campaign ran on: {'; '.join(differences)}. Resume it on that testbed, "
                           f"use another --out, or pass {MIXED_OPTION} to mix them (every record made then says so, "
                           "metadata.mixed)")
    return {"allowed": True, "differences": differences} if allow_mixed else None


def check_run_testbed(out_dir: str | Path, scenario: Scenario, metadata: dict, seen: dict, run_id: str) -> str | None:
    """The difference between the sender kernel run ``run_id`` just measured (``metadata.testbed.sender_kernel``)
    and the campaign's earlier runs of the same testbed and spec kernel (from the records, else this process's
    first such run, kept in ``seen``), or None when they agree."""
    testbed = metadata.get("testbed") or {}
    key = (testbed.get("name"), scenario.kernel)
    if key not in seen:
        for record in _records(Path(out_dir)):
            if (record["metadata"]["testbed"]["name"], (record.get("scenario") or {}).get("kernel")) == key:
                seen[key] = (record["metadata"]["testbed"].get("sender_kernel"), record["run_id"])
                break
        else:
            seen[key] = (testbed.get("sender_kernel"), run_id)
    was, first = seen[key]
    now = testbed.get("sender_kernel")
    if key[0] is None or was == now:
        return None
    return (f"testbed {key[0]!r}: sender_kernel {now!r} in this run, but the campaign's runs "
            f"{'of kernel ' + repr(scenario.kernel) + ' ' if scenario.kernel else ''}ran on {was!r} (first run {first})")


def _guarded(run_fn: RunFunction, out: Path, mixed: dict | None) -> RunFunction:
    """``run_fn``, refusing (:class:`MixedTestbed`, nothing recorded) a run whose sender kernel differs from
    the campaign's, unless ``mixed`` (allowed: the difference goes into ``mixed``)."""
    seen: dict = {}

    def run(scenario: Scenario, staging: Path, **kw) -> dict:
        metadata = run_fn(scenario, staging, **kw)
        difference = check_run_testbed(out, scenario, metadata, seen, kw.get("run_id", scenario.run_id))
        if difference and mixed is None:
            raise MixedTestbed("--testbed", (metadata.get("testbed") or {}).get("name"),
                               f"the testbed this campaign ran on: {difference}. Boot the sender into that kernel, "
                               f"use another --out, or pass {MIXED_OPTION} to mix them (the records then say so)")
        if difference and difference not in mixed["differences"]:
            mixed["differences"].append(difference)
        return metadata

    return run


def execute_run(spec: Planned, out: Path, scenario: Scenario, run_fn: RunFunction, *,
                retry_failed: bool = False, mixed: dict | None = None) -> dict:
    """Run one planned scenario until it succeeds or its attempts are used up; return the last record.

    This is the one place where a run's failure becomes a record. Attempts are numbered across
    processes (``failed/<run_id>.a<N>``); ``retry_failed`` grants a run whose attempts are used up
    ``max_attempts`` more. An interruption (:class:`bbrlab.core.signals.Interrupted`, KeyboardInterrupt) is
    not a failure of the run: nothing is committed, the attempt is not counted, and it propagates; so does
    :class:`MixedTestbed`. With ``mixed`` (:func:`check_same_testbed`'s return) every record made carries it
    as ``metadata.mixed``.
    """
    attempt = len(rec.failed_attempts(out, scenario.run_id))
    last_attempt = attempt + spec.max_attempts if retry_failed else spec.max_attempts
    record: dict = {}
    while attempt < last_attempt:
        attempt += 1
        staging = rec.staging_dir(out, scenario.run_id)
        started = rec.now_iso()
        try:
            metadata = run_fn(scenario, staging, run_id=scenario.run_id, attempt=attempt)
        except MixedTestbed:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of one run is recorded, the campaign goes on
            record = failure_record(scenario.run_id, spec.name, scenario, attempt, started, e)
            if mixed is not None:
                record["metadata"] = {**record["metadata"], "mixed": mixed_marker(mixed)}
        else:
            if mixed is not None:
                metadata = {**metadata, "mixed": mixed_marker(mixed)}
            record = rec.build_record(run_id=scenario.run_id, campaign=spec.name, status="ok", reason=None,
                                      attempt=attempt, started_at=started, ended_at=rec.now_iso(),
                                      scenario=scenario.to_dict(), metadata=metadata)
        rec.commit(staging, out, record)
        if record["status"] == "ok":
            break
    return record


class CampaignAborted(BbrlabError):
    """Several runs in a row failed all their attempts: the testbed, not the scenario, is the likely cause."""


class FailureStreak:
    """Counts the runs in a row that failed every attempt; at ``limit`` the campaign stops
    (:class:`CampaignAborted`), so a testbed outage does not burn the attempts of the whole plan."""

    def __init__(self, limit: int):
        self.limit, self.count = limit, 0

    def add(self, record: dict) -> None:
        """Count one committed run's record (ok ends the streak)."""
        self.count = self.count + 1 if record["status"] != "ok" else 0
        if self.count >= self.limit:
            raise CampaignAborted(
                f"{self.count} runs in a row failed every attempt; last: {record['reason']}. "
                "Fix the cause, then run again (add --retry-failed to retry those runs)")


def mixed_marker(mixed: dict) -> dict:
    """``metadata.mixed`` of one record: a copy, so later differences do not change records already made."""
    return {"allowed": bool(mixed.get("allowed")), "differences": list(mixed.get("differences", []))}


def run_campaign(spec: Planned, out_dir: str | Path, run_fn: RunFunction, *, progress: bool = True,
                 on_run: Callable[[dict], None] | None = None, retry_failed: bool = False,
                 max_consecutive_failures: int = 5, testbed: dict | None = None, allow_mixed: bool = False) -> dict:
    """Run (or resume) every planned run not yet in ``runs/``; return :func:`status` at the end.

    SIGINT, SIGTERM and SIGHUP end the campaign with :class:`bbrlab.core.signals.Interrupted` once the running
    run's context managers have restored the testbed; that run is not counted and is run again on resume.
    Runs whose attempts are used up are skipped unless ``retry_failed``. After
    ``max_consecutive_failures`` runs in a row fail every attempt, the campaign stops with
    :class:`CampaignAborted` (so a testbed outage does not burn the attempts of the whole plan).

    ``testbed`` is the testbed the runs go to (``Testbed.describe()``): a campaign resumed on another testbed,
    accelerator, vCPU count or sender kernel than its records is refused (:func:`check_same_testbed`), and so
    is, run by run, a sender kernel other than the earlier runs' (not recorded), unless ``allow_mixed``: then
    every record made here carries ``metadata.mixed``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with directory_lock(out), interruptible():
        check_out_dir(spec, out)  # another campaign's directory is refused as such, before its records are read
        mixed = check_same_testbed(out, [testbed] if testbed else [], allow_mixed=allow_mixed,
                                   kernel_dimension=bool(getattr(spec, "kernels", ())))
        run_fn = _guarded(run_fn, out, mixed)
        plan = prepare(spec, out)
        rec.clear_tmp(out)
        todo = [Scenario.from_dict(r["scenario"]) for r in plan["runs"] if not rec.is_complete(out, r["run_id"])]
        if not retry_failed:
            todo = [s for s in todo if len(rec.failed_attempts(out, s.run_id)) < spec.max_attempts]
        total = len(plan["runs"])
        bar = _progress_bar(total, total - len(todo), spec, enabled=progress)
        streak = FailureStreak(max_consecutive_failures)
        try:
            for scenario in todo:
                t0 = time.monotonic()
                record = execute_run(spec, out, scenario, run_fn, retry_failed=retry_failed, mixed=mixed)
                bar.set_postfix_str(f"{scenario.run_id} {record['status']} {time.monotonic() - t0:.1f}s")
                bar.update(1)
                if on_run:
                    on_run(record)
                streak.add(record)
        finally:
            with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                bar.close()
    return status(out)


def _progress_bar(total: int, initial: int, spec: Planned, *, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=spec.name, unit="run", disable=not enabled, dynamic_ncols=True)
