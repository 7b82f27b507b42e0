"""The campaign spec's JSON Schema (:func:`spec_json_schema`, ``bbrlab campaign schema``): its keys and their
shapes, for editors and other tools. The dimensions' part comes from their table
(:data:`bbrlab.campaign.dimensions.DIMENSIONS`: each a list of names, numbers or whole numbers, with its unit and
meaning); the settings' part is written here. It states shapes, not every range: what a value may be with the
others (a timeslice with a share, a buffer with a rate x RTT) only the spec's own checks say
(:func:`bbrlab.campaign.spec.load_spec`), and a document the schema takes may still be refused by them.
"""

from __future__ import annotations

from bbrlab.scenario.cpumodels import DEFAULT_MODEL
from bbrlab.scenario.scenario import SAMPLERS, VCPU_TRACE

from .dimensions import DIMENSIONS, MAX_VALUES, Dimension
from .spec_values import MAX_DESCRIPTION_CHARS, ORDERS

_ITEMS = {str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"}}
_NUMBER = {"type": "number"}
_NULL = {"type": "null"}

#: The settings (every key but the dimensions), each with its schema.
SETTINGS: dict[str, dict] = {
    "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", "description": "names directories"},
    "testbed": {"type": ["string", "null"], "description": "a local testbed's name, or a testbed file relative "
                "to the spec's folder"},
    "description": {"type": "string", "maxLength": MAX_DESCRIPTION_CHARS},
    "emulator_offloads": {"enum": ["off", "on", True, False], "description": "TSO/GSO/GRO on the emulator's ports"},
    "flows": {"type": "array", "items": {"type": "object", "required": ["cca"]},
              "description": "flows beside each run's own (docs/competition.md)"},
    "file_mb": {**_NUMBER, "description": "rsync: the file's size [10^6 bytes]"},
    "transfer_timeout_s": {**_NUMBER, "description": "rsync: a copy still running then is ended [s]"},
    "repetitions": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 1000},
                              {"type": "object", "required": ["min", "max"],
                               "properties": {"min": {"type": "integer"}, "max": {"type": "integer"},
                                              "precision": _NUMBER}}],
                    "description": "a number, or adaptive: {min, max, precision}"},
    "search": {"type": "object", "required": ["target"], "description": "a threshold search per curve instead "
               "of cpu_shares_pct and repetitions (docs/statistics.md)"},
    "duration_s": {**_NUMBER, "description": "iperf3's test duration [s]"},
    "sample_ms": {"anyOf": [{"type": "integer"}, _NULL], "description": "sample the data sockets every N ms"},
    "sample_ss_ms": {"anyOf": [{"type": "integer"}, _NULL], "description": "the older form of sample_ms with "
                     "sampler ss"},
    "sampler": {"enum": list(SAMPLERS)},
    "vcpu_trace": {"enum": list(VCPU_TRACE)},
    "bottleneck_ms": {"anyOf": [{"type": "integer"}, {"const": "auto"}],
                      "description": "the emulator's queue sampled every N ms; 0 off [ms]"},
    "order": {"enum": list(ORDERS)},
    "seed": {"type": "integer", "minimum": 0},
    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 10},
    "host_guard": {"anyOf": [{"const": "off"}, {"const": False}, _NULL, {
        "type": "object", "additionalProperties": False, "properties": {"max_other_busy_pct": _NUMBER}}]},
    "delay_split": {"enum": ["symmetric", "forward"]},
    "blocks": {"type": "integer", "minimum": 1},
    "block_reboot": {"enum": ["sender", "sender+emulator"]},
}


def _dimension_schema(d: Dimension) -> dict:
    """A dimension's list: distinct values of its type, 1 to :data:`MAX_VALUES` of them."""
    unit = f" [{d.unit}]" if d.unit else ""
    out = {"type": "array", "items": _ITEMS[d.type], "minItems": 1, "maxItems": MAX_VALUES, "uniqueItems": True,
           "description": f"{d.doc}{unit}"}
    if not d.required:
        out["default"] = list(d.default)
    return out


def spec_json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a campaign spec document: every key, the required ones (``search``
    stands in for ``cpu_shares_pct``), no other key."""
    dims = {d.key: _dimension_schema(d) for d in DIMENSIONS}
    required = ["name", *(d.key for d in DIMENSIONS if d.required and d.key != "cpu_shares_pct")]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "bbrlab campaign spec",
        "type": "object",
        "properties": {**dims, **SETTINGS},
        "required": required,
        "anyOf": [{"required": ["cpu_shares_pct"]}, {"required": ["search"],
                                                     "properties": {"contention_models": {"const": [DEFAULT_MODEL]}}}],
        "additionalProperties": False,
    }
