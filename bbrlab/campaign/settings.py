"""The campaign spec's settings (#37), each declared once: every key of a spec that is not a dimension (a list
crossed into the grid, :mod:`bbrlab.campaign.dimensions`).

A :class:`Setting` says what the rest of the house needs of one key: the type of its value, its unit, its default,
the range or choices it may take, a line saying what it does, and, where that is not all, a check or reading of
its own. From :data:`SETTINGS` the spec takes its keys (with the dimensions'), its required ones, its settings'
defaults (the field of the same name in :class:`~bbrlab.campaign.spec.CampaignSpec` reads its default here), the
check of each value given (in the table's order: the spec's name and testbed before the dimensions, the others
after them), the keys ``spec.yaml`` leaves out at their defaults, and the settings' part of the JSON Schema
(:mod:`bbrlab.campaign.spec_schema`). Adding a setting is one entry here, the spec's field of its name and
whatever the campaign does with it.

What holds only across the spec's values (a timeslice with a share, the runs a grid makes) is
:mod:`bbrlab.campaign.spec_combinations`'; a threshold search, which stands in for ``cpu_shares_pct`` and
``repetitions``, is read before the other keys (:func:`bbrlab.campaign.spec._search_shares`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bbrlab.core.errors import ValidationError
from bbrlab.run.blockboot import REBOOTS
from bbrlab.scenario.competition import extra_flows
from bbrlab.scenario.sampling_limits import DEFAULT_SAMPLER, MAX_BOTTLENECK_MS, SAMPLERS, check_bottleneck_ms
from bbrlab.scenario.scenario import VCPU_TRACE, Flow
from bbrlab.scenario.workloads import (
    DEFAULT_DURATION_S,
    DEFAULT_FILE_MB,
    DEFAULT_TRANSFER_TIMEOUT_S,
    IperfParams,
    RsyncParams,
)

from .blocks import MAX_BLOCKS, check_blocks_fit
from .expect import json_schema as expect_schema
from .expect import read_expectations
from .hostguard import HostGuard
from .repetitions import RepetitionRule
from .search import SearchRule
from .spec_values import MAX_DESCRIPTION_CHARS, ORDERS, check_testbed, emulator_offloads, number, rename_field

#: A spec's name: it names directories.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_JSON_TYPES = {str: "string", int: "integer", float: "number"}


@dataclass(frozen=True)
class Setting:
    """One key of a campaign spec that is not a dimension (see the module docstring).

    ``type`` is its value's: ``str``, ``int`` (a whole number), ``float`` (a number), or ``object`` (a shape of
    its own, which ``read`` takes and ``schema`` describes). A value is checked in this order: refused beside the
    keys it ``excludes``; None taken as is when ``nullable``; its type (numbers), range (``minimum`` <= value <=
    ``maximum``, value < ``below``) and ``choices``, in words of ``allowed`` if given; ``check`` (one value on
    its own, raising :class:`ValidationError`, renamed to the key); ``read`` (what the spec keeps of the value,
    e.g. a :class:`~bbrlab.campaign.hostguard.HostGuard`; its errors name the key or a part of it); and
    ``with_others`` (the value with the settings read before it). ``sets`` gives the spec's fields a value sets
    (default: the field of the key's name).
    """

    key: str
    type: type
    default: object
    doc: str
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    below: int | None = None
    choices: tuple | None = None
    allowed: str = ""
    nullable: bool = False
    required: bool = False
    check: Callable[[object], object] | None = None
    read: Callable[[object], object] | None = None
    with_others: Callable[[object, Mapping[str, object]], None] | None = None
    excludes: tuple[str, ...] = ()
    excludes_why: str = ""
    sets: Callable[[object], dict] | None = None
    schema: dict | None = None
    omitted_default: bool = False
    before_dimensions: bool = False

    def checked(self, value: object, given: Mapping[str, object], read: Mapping[str, object]) -> dict:
        """The spec's fields ``value`` sets (:attr:`sets`), checked as the class docstring says; ``given`` is the
        spec as written (for :attr:`excludes`), ``read`` the settings read so far (for :attr:`with_others`)."""
        if self.excludes and is_given(self.key, given):
            present = [k for k in self.excludes if is_given(k, given)]
            if present:
                raise ValidationError(self.key, value, f"absent when {' or '.join(self.excludes)} is given"
                                      + (f" ({self.excludes_why})" if self.excludes_why else ""))
        if value is None and self.nullable:
            return self.fields(None)
        if self.type in (int, float):
            if self.allowed and (isinstance(value, bool) or not isinstance(value, int if self.type is int else
                                                                             (int, float))):
                raise ValidationError(self.key, value, self.allowed)
            number(self.key, value, integer=self.type is int)
        if not self._in_range(value):
            raise ValidationError(self.key, value, self.allowed or self.range_words())
        if self.check is not None:
            try:
                self.check(value)
            except ValidationError as e:
                raise rename_field(e, self.key) from None
        if self.read is not None:
            value = self.read(value)
        if self.with_others is not None:
            self.with_others(value, read)
        return self.fields(value)

    def _in_range(self, value: object) -> bool:
        """Whether ``value`` (of the right type) is within :attr:`minimum`, :attr:`maximum`, :attr:`below` and
        among :attr:`choices`."""
        if self.choices is not None and value not in self.choices:
            return False
        return ((self.minimum is None or self.minimum <= value) and (self.maximum is None or value <= self.maximum)
                and (self.below is None or value < self.below))

    def range_words(self) -> str:
        """What the value may be, in an error's words: ``one of a, b`` or ``1 <= key <= 10``."""
        if self.choices is not None:
            return f"one of {', '.join(map(str, self.choices))}"
        low = f"{_shown(self.minimum)} <= " if self.minimum is not None else ""
        high = (f" <= {_shown(self.maximum)}" if self.maximum is not None else "") + (
            f" < {_shown(self.below)}" if self.below is not None else "")
        return f"{low}{self.key}{high}"

    def fields(self, value: object) -> dict:
        """The spec's fields ``value`` sets: the key's own, or what :attr:`sets` gives."""
        return self.sets(value) if self.sets else {self.key: value}

    def json_schema(self) -> dict:
        """The key's JSON Schema: :attr:`schema`, else its type, range and choices; with its default and its
        :attr:`doc` (and unit) as the description."""
        out = dict(self.schema) if self.schema is not None else self._shape()
        unit = f" [{self.unit}]" if self.unit else ""
        if self.doc:
            out["description"] = f"{self.doc}{unit}"
        if not self.required and self.default is not None:
            out["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        return out

    def _shape(self) -> dict:
        """The JSON Schema of the value's type, range and choices (None too, when :attr:`nullable`)."""
        out: dict = {"enum": list(self.choices)} if self.choices is not None else {"type": _JSON_TYPES[self.type]}
        for word, bound in (("minimum", self.minimum), ("maximum", self.maximum), ("exclusiveMaximum", self.below)):
            if bound is not None:
                out[word] = bound
        return {"anyOf": [out, {"type": "null"}]} if self.nullable else out

    @property
    def stored_default(self) -> object:
        """The default as ``spec.yaml`` would write it (a tuple as a list)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default


def _shown(bound: float) -> str:
    """A bound as an error writes it: a large power of two as ``2**k``."""
    if isinstance(bound, int) and bound > 2**20 and bound & (bound - 1) == 0:
        return f"2**{bound.bit_length() - 1}"
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def is_given(key: str, given: Mapping[str, object]) -> bool:
    """Whether a spec gives ``key``: it is there, and for a nullable setting it is not None (None is its
    default)."""
    setting = BY_KEY.get(key)
    return key in given and (given[key] is not None or setting is None or not setting.nullable)


def _name(value: object) -> None:
    """A spec's name: 1-64 characters of A-Z a-z 0-9 . _ -, as it names directories."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ValidationError("name", value, "1-64 characters of A-Z a-z 0-9 . _ - (it names directories)")


def _description(value: object) -> None:
    """A spec's description: text of at most :data:`MAX_DESCRIPTION_CHARS` characters."""
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION_CHARS:
        raise ValidationError("description", value, f"text of at most {MAX_DESCRIPTION_CHARS} characters")


#: ``repetitions`` as a fixed number (its other form is adaptive: ``{min, max, precision}``).
_FIXED_REPETITIONS = Setting("repetitions", int, None, "", minimum=1, maximum=1000)


def _repetitions(value: object) -> int | RepetitionRule:
    """A fixed number of repetitions, or adaptive ones (:class:`RepetitionRule`) from a mapping."""
    if isinstance(value, dict):
        return RepetitionRule.from_value(value)
    return _FIXED_REPETITIONS.checked(value, {}, {})["repetitions"]


def _repetition_fields(value: int | RepetitionRule) -> dict:
    """Adaptive repetitions run at most their ``max``."""
    if isinstance(value, RepetitionRule):
        return {"adaptive": value, "repetitions": value.max_reps}
    return {"repetitions": value}


def _blocks_fit(blocks: int, read: Mapping[str, object]) -> None:
    """The blocks with the repetitions (a divisor of them; 1 with adaptive repetitions or a threshold search)."""
    check_blocks_fit(blocks, read.get("repetitions", BY_KEY["repetitions"].default),
                     adaptive="adaptive" in read or read.get("search") is not None)


def _older_sampling(value: int | None) -> dict:
    """``sample_ss_ms: N`` is ``sample_ms: N`` with ``sampler: ss``."""
    return {} if value is None else {"sample_ms": value, "sampler": "ss"}


_SAMPLE_MS = {"type": int, "default": None, "unit": "ms", "nullable": True,
              "check": lambda v: Flow("cubic", sample_ms=v)}

#: Every setting, in the order the spec checks them.
SETTINGS: tuple[Setting, ...] = (
    Setting("name", str, None, "names directories", required=True, check=_name, before_dimensions=True,
            schema={"type": "string", "pattern": f"^{NAME.pattern}$"}),
    Setting("testbed", str, None, "a local testbed's name, or a testbed file relative to the spec's folder; "
            "default: --testbed, else the local testbed that is up", nullable=True, read=check_testbed,
            before_dimensions=True),
    Setting("flows", object, (), "flows beside each run's own (docs/competition.md)", read=extra_flows,
            omitted_default=True, schema={"type": "array", "items": {"type": "object", "required": ["cca"]}}),
    Setting("repetitions", object, 30, "a number, or adaptive: {min, max, precision} (a point stops once its "
            "median's interval is precise enough; bbrlab.campaign.repetitions)", read=_repetitions,
            sets=_repetition_fields, schema={"oneOf": [
                _FIXED_REPETITIONS._shape(),
                {"type": "object", "required": ["min", "max"],
                 "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}, "precision": {"type": "number"}}}]}),
    Setting("duration_s", float, DEFAULT_DURATION_S, "iperf3's test duration", "s",
            check=lambda v: IperfParams(duration_s=v)),
    Setting("sample_ss_ms", doc="the older form of sample_ms with sampler ss", excludes=("sample_ms", "sampler"),
            excludes_why="sample_ss_ms: N is the older form of sample_ms: N with sampler: ss", sets=_older_sampling,
            **_SAMPLE_MS),
    Setting("sample_ms", doc="sample the data sockets every N ms (figures 5, 6, 9, 11); null: unsampled",
            **_SAMPLE_MS),
    Setting("sampler", str, DEFAULT_SAMPLER, "the socket sampler of sampled runs", choices=SAMPLERS),
    Setting("file_mb", float, DEFAULT_FILE_MB, "rsync: the file's size", "10^6 bytes",
            check=lambda v: RsyncParams(file_mb=v), omitted_default=True),
    Setting("transfer_timeout_s", float, DEFAULT_TRANSFER_TIMEOUT_S, "rsync: a copy still running then is ended "
            "and recorded as timed out", "s", check=lambda v: RsyncParams(transfer_timeout_s=v), omitted_default=True),
    Setting("vcpu_trace", str, "auto", "trace the sender's vCPU threads on the host; auto: when sampled",
            choices=VCPU_TRACE),
    Setting("bottleneck_ms", object, "auto", "the emulator's queue sampled every N ms; 0 off; auto: every 5 ms "
            "in sampled runs", "ms", check=lambda v: check_bottleneck_ms(v, "bottleneck_ms"),
            schema={"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_BOTTLENECK_MS}, {"const": "auto"}]}),
    Setting("order", str, "blocked-random", "the order of the plan's runs", choices=ORDERS),
    Setting("seed", int, 1, "seeds the plan's order", minimum=0, below=2**63),
    Setting("host_guard", object, None, "off, or {max_other_busy_pct: N}: a run whose host was busier outside "
            "the testbed fails as host busy and is tried again later; default: 25, or BBRLAB_HOST_GUARD",
            read=HostGuard.from_value, omitted_default=True, schema={"anyOf": [
                {"const": "off"}, {"const": False}, {"type": "null"},
                {"type": "object", "additionalProperties": False,
                 "properties": {"max_other_busy_pct": {"type": "number"}}}]}),
    Setting("max_attempts", int, 3, "a failing run is tried at most this often", minimum=1, maximum=10),
    Setting("delay_split", str, "symmetric", "symmetric: RTT/2 each way; forward: the whole RTT on the data "
            "direction", choices=("symmetric", "forward"), allowed="symmetric or forward"),
    Setting("emulator_offloads", object, "off", "TSO/GSO/GRO on the emulator's ports: off, or on as the authors "
            "had them", read=emulator_offloads, omitted_default=True, schema={"enum": ["off", "on", True, False]}),
    Setting("description", str, "", "what the campaign is for", check=_description,
            schema={"type": "string", "maxLength": MAX_DESCRIPTION_CHARS}),
    Setting("blocks", int, 1, "each point's repetitions split into this many blocks, each on a fresh boot of the "
            "sender (a divisor of repetitions; docs/statistics.md)", minimum=1, maximum=MAX_BLOCKS,
            allowed=f"a whole number, 1 <= blocks <= {MAX_BLOCKS} (each block runs on a fresh boot of the sender)",
            with_others=_blocks_fit, omitted_default=True),
    Setting("block_reboot", str, "sender", "what a block boots afresh", choices=REBOOTS,
            allowed=f"one of {', '.join(REBOOTS)} (what each block boots afresh)", omitted_default=True),
    Setting("search", object, None, "a threshold search per curve instead of cpu_shares_pct and repetitions "
            "(docs/statistics.md)", read=SearchRule.from_value, schema={"type": "object", "required": ["target"]}),
    Setting("expect", object, (), "what the runs should show, judged by bbrlab check (docs/expectations.md); not "
            "part of the campaign's identity: changing it never changes the plan", read=read_expectations,
            omitted_default=True, schema=expect_schema()),
)

#: Each setting by its key.
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


def setting_default(key: str) -> object:
    """The default of setting ``key`` (for :class:`~bbrlab.campaign.spec.CampaignSpec`'s field of that name)."""
    return BY_KEY[key].default


def read_settings(given: Mapping[str, object], read: dict[str, object], *, before_dimensions: bool) -> None:
    """Check the settings ``given`` (a spec as written) that are not in ``read`` yet, those read before the
    dimensions or those after them, in the table's order; each one's fields go into ``read``."""
    for s in SETTINGS:
        if s.before_dimensions == before_dimensions and s.key in given and s.key not in read:
            read.update(s.checked(given[s.key], given, read))
