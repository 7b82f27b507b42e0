"""The campaign spec's JSON Schema (:func:`spec_json_schema`, ``bbrlab campaign schema``): its keys and their
shapes, for editors and other tools, from the tables that declare them: the dimensions'
(:data:`bbrlab.campaign.dimensions.DIMENSIONS`: each a list of names, numbers or whole numbers, with its unit and
meaning, or named lists of whole numbers) and the settings' (:data:`bbrlab.campaign.settings.SETTINGS`: each its type, range or choices, default
and meaning, or a shape of its own). It states shapes, not every range: what a value may be with the
others (a timeslice with a share, a buffer with a rate x RTT) only the spec's own checks say
(:func:`bbrlab.campaign.spec.load_spec`), and a document the schema takes may still be refused by them.
"""

from __future__ import annotations

from bbrlab.scenario.cpumodels import DEFAULT_MODEL

from .dimensions import DIMENSIONS, MAX_VALUES, Dimension
from .settings import SETTINGS

_ITEMS = {str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"}}


def _dimension_schema(d: Dimension) -> dict:
    """A dimension's list: distinct values of its type, 1 to :data:`MAX_VALUES` of them; a mapping dimension's
    own :attr:`~bbrlab.campaign.dimensions.Dimension.schema`."""
    unit = f" [{d.unit}]" if d.unit else ""
    out = dict(d.schema) if d.schema is not None else {
        "type": "array", "items": _ITEMS[d.type], "minItems": 1, "maxItems": MAX_VALUES, "uniqueItems": True}
    out["description"] = f"{d.doc}{unit}"
    if not d.required:
        out["default"] = d.stored(d.default)
    return out


def spec_json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a campaign spec document: every key, the required ones (``search``
    stands in for ``cpu_shares_pct``), no other key."""
    dims = {d.key: _dimension_schema(d) for d in DIMENSIONS}
    required = [*(s.key for s in SETTINGS if s.required),
                *(d.key for d in DIMENSIONS if d.required and d.key != "cpu_shares_pct")]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "bbrlab campaign spec",
        "type": "object",
        "properties": {**dims, **{s.key: s.json_schema() for s in SETTINGS}},
        "required": required,
        "anyOf": [{"required": ["cpu_shares_pct"]}, {"required": ["search"],
                                                     "properties": {"contention_models": {"const": [DEFAULT_MODEL]}}}],
        "additionalProperties": False,
    }
