"""A spec's ``expect:`` block: what its runs should show, each expectation checked when the spec is loaded.

An expectation is about judging a campaign, not running it: it is in ``spec.yaml`` but not in the campaign's
identity (:func:`bbrlab.campaign.directory.check_out_dir`), so adding or changing one never changes the plan, and
a campaign directory made before it keeps matching. ``bbrlab check DIR`` judges the runs against them
(:mod:`bbrlab.analysis.expectations`; docs/expectations.md)::

    expect:
      - name: patched-recovers       # optional: [A-Za-z0-9._-], names the check in reports; unique
        cca: bbr2b                   # optional: only this CCA's runs (the `cca` column)
        metric: link_utilisation     # default link_utilisation (throughput / rate); see METRICS
        stat: median                 # the statistic (median: the one bbrlab states intervals for)
        op: ">="                     # >=, >, <= or <
        value: 0.8
        where: {timeslice_ms: 1, cpu_share_pct: ">= 25"}   # optional: only these points
        confidence: 0.95             # the level asked of each interval (0.5 <= confidence < 1)
      - {cca: bbr2b, not_below: bbr} # at every point both ran: bbr2b's metric not significantly below bbr's

Each expectation is judged at each point (one condition, the run identity) its ``cca`` and ``where`` select.
``where`` maps a column of the run identity (a dimension's, or ``variant``) to a value, a list of values, or a
comparison of a numeric column (``">= 25"``, ``"> 10, <= 50"``). A file of expectations (``bbrlab check DIR
--expect FILE``) holds ``expect:`` and, optionally, ``description:`` (:func:`expectations_from_file`).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.core.errors import BbrlabError, ValidationError, key_name
from bbrlab.core.yamlfile import load_file
from bbrlab.scenario.competition import CCA_NAME

from .dimensions import DIMENSIONS

#: The run-table columns an expectation may judge, each with what it is (its unit).
METRICS: dict[str, str] = {
    "link_utilisation": "throughput / rate, 0 to 1",
    "throughput_mbit": "the run's own flow's throughput at the receiver [Mbit/s]",
    "goodput_mbit": "iperf3: the throughput; rsync: the file's bytes that arrived x 8 / the copy's time [Mbit/s]",
    "jain_index": "Jain's fairness index of the run's flows over their overlap, 1/n to 1 (runs with competing "
                  "flows only)",
    "mean_rtt_ms": "the sender's smoothed RTT averaged over the transfer [ms]",
    "retransmits": "TCP retransmissions of the run's own flow",
}
DEFAULT_METRIC = "link_utilisation"
#: The statistics an expectation may state (the median: its order-statistic interval holds at any n).
STATS = ("median",)
#: Comparisons of a statistic with a value.
OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, ">": operator.gt, "<=": operator.le,
                                                  "<": operator.lt}
#: Comparisons a ``where`` condition may make of a numeric column.
WHERE_OPS: dict[str, Callable[[float, float], bool]] = {**OPS, "==": operator.eq, "!=": operator.ne}
#: The level asked when an expectation does not say.
DEFAULT_CONFIDENCE = 0.95
MIN_CONFIDENCE = 0.5
#: At most this many expectations in one block (each is a line of the report and a test case per point).
MAX_EXPECTATIONS = 200
#: The keys of one expectation.
KEYS = ("name", "cca", "metric", "stat", "op", "value", "not_below", "where", "confidence")
#: The keys of a file of expectations.
FILE_KEYS = ("expect", "description")
#: At most this many bytes in a file of expectations.
MAX_FILE_BYTES = 1 << 20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_COMPARISON = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*([-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s*")


def where_columns() -> dict[str, type]:
    """The columns ``where`` may name and the type of their values (``str`` or a number): each dimension's column
    in the run identity (:data:`bbrlab.campaign.dimensions.DIMENSIONS`), and ``variant`` (Cubic, BBRv1 patched ...)."""
    out: dict[str, type] = {d.column: (str if d.type is str else float) for d in DIMENSIONS if d.identity}
    return {**out, "variant": str}


@dataclass(frozen=True)
class Condition:
    """One ``where`` entry: a column and what its value must be. ``given`` is the value as written (a value, a tuple
    of values for a list, or a comparison such as ``">= 25, < 100"``); ``values`` the values it allows (equality), or
    ``comparisons`` the (op, number) pairs a number must meet, all of them."""

    column: str
    given: object
    values: tuple = ()
    comparisons: tuple[tuple[str, float], ...] = ()

    def holds(self, value: object) -> bool:
        """Whether a point's ``value`` of :attr:`column` meets the condition (a missing value meets none)."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return False
        if self.comparisons:
            return all(WHERE_OPS[op](float(value), bound) for op, bound in self.comparisons)
        return any(value == v for v in self.values)

    def text(self) -> str:
        """The condition in words: ``cpu_share_pct >= 25``, ``timeslice_ms = 1``, ``cca in bbr, cubic``."""
        if self.comparisons:
            return " and ".join(f"{self.column} {op} {bound:g}" for op, bound in self.comparisons)
        shown = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in self.values)
        return f"{self.column} {'=' if len(self.values) == 1 else 'in'} {shown}"


@dataclass(frozen=True)
class Expectation:
    """One expectation (see the module docstring). Either ``op`` and ``value`` (the statistic against a number)
    or ``not_below`` (against the same points of another CCA) is set; ``index`` is its place in the block."""

    index: int
    metric: str = DEFAULT_METRIC
    stat: str = "median"
    op: str | None = None
    value: float | None = None
    not_below: str | None = None
    cca: str | None = None
    where: tuple[Condition, ...] = ()
    confidence: float = DEFAULT_CONFIDENCE
    name: str | None = None

    @property
    def label(self) -> str:
        """The name reports give it: its ``name``, else ``expect[i]``."""
        return self.name or f"expect[{self.index}]"

    @property
    def kind(self) -> str:
        """``threshold`` (against a value) or ``not_below`` (against another CCA)."""
        return "not_below" if self.not_below is not None else "threshold"

    def text(self) -> str:
        """The expectation in words, e.g. ``bbr2b: median link_utilisation >= 0.8 where timeslice_ms = 1, at
        95 % confidence``."""
        who = f"{self.cca}: " if self.cca else ""
        claim = (f"median {self.metric} not significantly below {self.not_below}'s" if self.kind == "not_below"
                 else f"{self.stat} {self.metric} {self.op} {self.value:g}")
        where = f" where {', '.join(c.text() for c in self.where)}" if self.where else ""
        return f"{who}{claim}{where}, at {self.confidence * 100:g} % confidence"

    def to_value(self) -> dict:
        """The expectation as ``spec.yaml`` writes it (read back to an equal expectation)."""
        out: dict = {"name": self.name, "cca": self.cca, "metric": self.metric, "stat": self.stat, "op": self.op,
                     "value": self.value, "not_below": self.not_below,
                     "where": {c.column: list(c.given) if isinstance(c.given, tuple) else c.given
                               for c in self.where} or None, "confidence": self.confidence}
        return {k: v for k, v in out.items() if v is not None}


def _field(index: int, key: str = "") -> str:
    return f"expect[{index}]" + (f".{key}" if key else "")


def _ccaname(index: int, key: str, value: object) -> str:
    if not isinstance(value, str) or not CCA_NAME.fullmatch(value):
        raise ValidationError(_field(index, key), value, "a congestion control name: [a-z][a-z0-9_]{0,14}")
    return value


def _finite(index: int, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(_field(index, key), value, "a finite number")
    return value


def _choice(index: int, key: str, value: object, choices: Sequence[str], words: str = "") -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValidationError(_field(index, key), value, f"one of {', '.join(choices)}{words}")
    return value


def _condition(index: int, column: object, given: object) -> Condition:
    """One ``where`` entry of expectation ``index``, checked against the column's type."""
    columns = where_columns()
    name = _field(index, f"where.{key_name(column)}")
    if not isinstance(column, str) or column not in columns:
        raise ValidationError(_field(index, "where"), column, f"a column of the run identity: {', '.join(columns)}")
    numeric = columns[column] is not str
    if isinstance(given, str) and numeric and given.strip()[:1] in "<>=!":
        parts = given.split(",")
        matches = [_COMPARISON.fullmatch(p) for p in parts]
        if not all(matches):
            raise ValidationError(name, given, "a comparison such as '>= 25' or '> 10, <= 50' (ops: "
                                  f"{', '.join(WHERE_OPS)})")
        return Condition(column, given, comparisons=tuple((m.group(1), float(m.group(2))) for m in matches))
    values = given if isinstance(given, list) else [given]
    if not values or len(values) > 1000:
        raise ValidationError(name, given, "a value, a non-empty list of at most 1000 values, or a comparison")
    for v in values:
        ok = (_is_number(v) and math.isfinite(v)) if numeric else isinstance(v, str) and 0 < len(v) <= 200
        if not ok:
            kind = ("a number, a list of numbers, or a comparison such as '>= 25'" if numeric
                    else "a name (text of 1-200 characters) or a list of names")
            raise ValidationError(name, v, kind)
    return Condition(column, tuple(given) if isinstance(given, list) else given,
                     values=tuple(float(v) if numeric else v for v in values))


def _is_number(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float)


def read_expectation(index: int, data: object) -> Expectation:
    """Expectation ``index`` of a block, checked: every error names ``expect[i].key`` and what it may be."""
    if not isinstance(data, dict):
        raise ValidationError(_field(index), data, "a mapping of keys such as cca, metric, op, value, where")
    for key in data:
        if key not in KEYS:
            raise ValidationError(_field(index, key_name(key)), data[key], f"a known key: {', '.join(KEYS)}")
    got: dict = {"index": index}
    if "name" in data:
        if not isinstance(data["name"], str) or not NAME.fullmatch(data["name"]):
            raise ValidationError(_field(index, "name"), data["name"], "1-64 characters of A-Z a-z 0-9 . _ -")
        got["name"] = data["name"]
    if "cca" in data:
        got["cca"] = _ccaname(index, "cca", data["cca"])
    if "metric" in data:
        got["metric"] = _choice(index, "metric", data["metric"], tuple(METRICS))
    if "stat" in data:
        got["stat"] = _choice(index, "stat", data["stat"], STATS, " (the statistic bbrlab states intervals for)")
    if "confidence" in data:
        c = _finite(index, "confidence", data["confidence"])
        if not MIN_CONFIDENCE <= c < 1:
            raise ValidationError(_field(index, "confidence"), c, f"{MIN_CONFIDENCE:g} <= confidence < 1 (the "
                                  "level asked of each interval, e.g. 0.95)")
        got["confidence"] = float(c)
    if "where" in data:
        if not isinstance(data["where"], dict) or not data["where"]:
            raise ValidationError(_field(index, "where"), data["where"], "a mapping of columns to values, e.g. "
                                  "{timeslice_ms: 1, cpu_share_pct: '>= 25'}")
        got["where"] = tuple(_condition(index, k, v) for k, v in data["where"].items())
    return Expectation(**got, **_claim(index, data, got.get("cca")))


def _claim(index: int, data: dict, cca: str | None) -> dict:
    """What is claimed: ``op`` and ``value``, or ``not_below`` (with a ``cca``), not both."""
    if "not_below" in data:
        if "op" in data or "value" in data:
            raise ValidationError(_field(index, "not_below"), data["not_below"], "absent when op and value are "
                                  "given (an expectation compares with a value or with another CCA, not both)")
        other = _ccaname(index, "not_below", data["not_below"])
        if cca is None:
            raise ValidationError(_field(index, "cca"), None, "required with not_below (the CCA that must not "
                                  "fall below it)")
        if other == cca:
            raise ValidationError(_field(index, "not_below"), other, "another CCA than cca")
        return {"not_below": other}
    for key in ("op", "value"):
        if key not in data:
            raise ValidationError(_field(index, key), None, "required (or not_below: CCA instead of op and value)")
    return {"op": _choice(index, "op", data["op"], tuple(OPS)), "value": float(_finite(index, "value", data["value"]))}


def read_expectations(value: object) -> tuple[Expectation, ...]:
    """A spec's ``expect:`` block (a list of expectations), each checked (:func:`read_expectation`); names unique."""
    if not isinstance(value, list):
        raise ValidationError("expect", value, "a list of expectations, e.g. [{cca: bbr2b, op: '>=', value: 0.8}]")
    if len(value) > MAX_EXPECTATIONS:
        raise ValidationError("expect", f"{len(value)} expectations", f"at most {MAX_EXPECTATIONS}")
    out = tuple(read_expectation(i, e) for i, e in enumerate(value))
    seen: set[str] = set()
    for e in out:
        if e.label in seen:
            raise ValidationError(_field(e.index, "name"), e.label, "a name no other expectation of the block has")
        seen.add(e.label)
    return out


def check_against_spec(expectations: Sequence[Expectation], ccas: Sequence[str], lists: dict[str, Sequence]) -> None:
    """Expectations that cannot select a run of the spec are refused: a ``cca`` or ``not_below`` not among its
    ``ccas``, a ``where`` value (or comparison) that none of the spec's values of that column meets. ``lists``
    maps a column to the spec's values of it (an empty list: not checked)."""
    for e in expectations:
        for key in ("cca", "not_below"):
            cca = getattr(e, key)
            if cca is not None and cca not in ccas:
                raise ValidationError(_field(e.index, key), cca, f"one of the spec's ccas: {', '.join(ccas)}")
        for c in e.where:
            have = tuple(dict.fromkeys(lists.get(c.column) or ()))
            if have and (not any(c.holds(v) for v in have) if c.comparisons else
                         any(v not in have for v in c.values)):
                shown = ", ".join(f"{v:g}" if _is_number(v) else str(v) for v in have)
                raise ValidationError(_field(e.index, f"where.{c.column}"), c.given,
                                      f"values of the spec's {c.column}: {shown}")


@dataclass(frozen=True)
class ExpectationFile:
    """A file of expectations (``bbrlab check DIR --expect FILE``): its path, expectations and description."""

    path: Path
    expectations: tuple[Expectation, ...]
    description: str = field(default="")


def expectations_from_file(path: str | Path) -> ExpectationFile:
    """Read a file of expectations: a YAML mapping with ``expect:`` (a list, as a spec's) and, optionally,
    ``description:``; any other key, or a file over 1 MiB, is refused with the reason."""
    path = Path(path)
    try:
        data = load_file(path, "expect", "file of expectations", MAX_FILE_BYTES)
    except (OSError, UnicodeDecodeError) as e:
        raise BbrlabError(f"cannot read the file of expectations {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(data, dict) or "expect" not in data:
        raise ValidationError(f"{path}", type(data).__name__, "a mapping with expect: (a list of expectations) "
                              "and optionally description:")
    for key in data:
        if key not in FILE_KEYS:
            raise ValidationError(f"{path}: {key_name(key)}", data[key], f"a key of a file of expectations: "
                                  f"{', '.join(FILE_KEYS)} (a campaign's own expect: block is in its spec.yaml)")
    description = data.get("description", "")
    if not isinstance(description, str) or len(description) > 4000:
        raise ValidationError(f"{path}: description", description, "text of at most 4000 characters")
    return ExpectationFile(path, read_expectations(data["expect"]), description)


def json_schema() -> dict:
    """The JSON Schema of ``expect:``: a list of expectations, each with :data:`KEYS`, ``op`` and ``value`` or
    ``not_below``."""
    condition = {"anyOf": [{"type": ["string", "number"]}, {"type": "array", "items": {"type": ["string", "number"]},
                                                            "minItems": 1}]}
    item = {"type": "object", "additionalProperties": False,
            "properties": {"name": {"type": "string", "pattern": f"^{NAME.pattern}$"},
                           "cca": {"type": "string"}, "not_below": {"type": "string"},
                           "metric": {"enum": list(METRICS), "default": DEFAULT_METRIC},
                           "stat": {"enum": list(STATS), "default": "median"},
                           "op": {"enum": list(OPS)}, "value": {"type": "number"},
                           "where": {"type": "object", "propertyNames": {"enum": list(where_columns())},
                                     "additionalProperties": condition, "minProperties": 1},
                           "confidence": {"type": "number", "minimum": MIN_CONFIDENCE, "exclusiveMaximum": 1,
                                          "default": DEFAULT_CONFIDENCE}},
            "oneOf": [{"required": ["op", "value"], "not": {"required": ["not_below"]}},
                      {"required": ["not_below", "cca"], "not": {"anyOf": [{"required": ["op"]},
                                                                         {"required": ["value"]}]}}]}
    return {"type": "array", "items": item, "maxItems": MAX_EXPECTATIONS}
