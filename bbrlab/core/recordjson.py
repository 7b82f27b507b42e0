"""Typed records to and from their JSON, by pydantic's :class:`~pydantic.TypeAdapter` on plain stdlib dataclasses.

The records that cross rooms (the run record, its metadata and their parts) stay stdlib dataclasses, importable
without pydantic; this module is the one place that turns them into JSON values (:func:`to_json`) and back
(:func:`from_json`, which names the field that is wrong: ``contention.previous: Input should be ...``), and gives
their JSON Schema (:func:`json_schema`). One adapter is built per type, once.

A field is written as its dataclass declares it: the fields in their order, a nested dataclass as its own
fields, a plain ``dict`` or ``list`` copied as it is (values not coerced when written). Classes whose JSON has a
layout of its own, kept byte for byte from older records (inlined parts, rows keyed by a field, keys written
only when known), say so with a ``__get_pydantic_core_schema__`` that returns :func:`own_layout`: the adapter
then calls their ``to_dict``/``from_dict`` where they are nested.

Reading coerces as pydantic's lax mode does: a JSON integer in a field declared ``float`` becomes a float.

Absent or null: a key some records lack is a field declared with :func:`left_out_when_none`: it reads as None
where the record lacks it and is not written while None. Every other field is always written, null included.
So a key is either always there (null when unknown) or there only when known, never both; a key records hold
both ways stays inside a plain ``dict``. :func:`record_layout` applies the rule, so a class with such a field
names it in its ``__get_pydantic_core_schema__`` (without ``read`` and ``write`` when it has no layout of
its own).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import field, fields
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import core_schema


@functools.cache
def adapter(tp: Any) -> TypeAdapter:
    """The one :class:`~pydantic.TypeAdapter` of ``tp``, built on first use."""
    return TypeAdapter(tp)


def to_json(obj: Any, tp: Any = None) -> Any:
    """``obj`` (of type ``tp``, by default its own class) as JSON values: dicts, lists, numbers, strings, None.
    Values a field holds that its annotation does not name are written as they are, without a warning."""
    return adapter(type(obj) if tp is None else tp).dump_python(obj, warnings=False)


def from_json(tp: Any, data: Any) -> Any:
    """``data`` (parsed JSON) read as ``tp``; :class:`pydantic.ValidationError` (a ValueError) names each
    field that does not fit."""
    return adapter(tp).validate_python(data)


def json_schema(tp: Any) -> dict:
    """The JSON Schema of ``tp``'s JSON, for editors and checkers."""
    return adapter(tp).json_schema()


def own_layout(cls: type, read: Callable[[Any], Any] | None = None) -> core_schema.CoreSchema:
    """The schema of a class whose JSON layout is its own: read by ``read`` (default ``cls.from_dict``; an instance
    passes as it is), written by its ``to_dict``; in the JSON Schema, an object. A key it lacks or a value of
    another type is a ValueError, which pydantic reports at the field's place."""
    from_dict = read or cls.from_dict

    def read_value(value: Any) -> Any:
        if isinstance(value, cls):
            return value
        try:
            return from_dict(value)
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a {cls.__name__}: {type(e).__name__} {e}") from e

    return core_schema.no_info_plain_validator_function(
        read_value, serialization=core_schema.plain_serializer_function_ser_schema(lambda value: value.to_dict()),
        json_schema_input_schema=core_schema.dict_schema())


#: The field metadata that marks a key written only when known (:func:`left_out_when_none`).
_LEFT_OUT_WHEN_NONE = "bbrlab.left_out_when_none"


def left_out_when_none() -> Any:
    """A dataclass field (default None) for a key records write only when known: read as None where a record
    lacks it, left out of the JSON while None."""
    return field(default=None, metadata={_LEFT_OUT_WHEN_NONE: True})


def _without_unknown(cls: type, out: dict) -> dict:
    """``out`` (``cls``'s fields as written) without the :func:`left_out_when_none` fields that are None."""
    dropped = {f.name for f in fields(cls) if f.metadata.get(_LEFT_OUT_WHEN_NONE) and out.get(f.name) is None}
    return {k: v for k, v in out.items() if k not in dropped} if dropped else out


def _same(d: dict) -> dict:
    return d


def record_layout(source: type, handler: Any, *, read: Callable[[dict], dict] = _same,
                  write: Callable[[dict], dict] = _same) -> core_schema.CoreSchema:
    """The schema of a dataclass whose JSON is its fields with a layout around them: ``read`` turns the record's
    JSON into the fields' values before they are checked (an instance passes as it is), ``write`` turns the
    fields as written into the record's JSON, after its :func:`left_out_when_none` fields that are None are left
    out; both are the identity by default (a class whose only layout is its keys left out while None).
    ``handler`` is the one pydantic gives ``__get_pydantic_core_schema__``."""
    fields_schema = handler(source)

    def before(value: Any) -> Any:
        return read(value) if isinstance(value, dict) else value

    # The class's reference moves to the schema with its layout: a second field of this class in one record
    # refers to it, not to the bare fields (which would skip ``read`` and ``write``).
    ref = fields_schema.pop("ref", None)
    schema = core_schema.no_info_before_validator_function(
        before, fields_schema,
        serialization=core_schema.wrap_serializer_function_ser_schema(lambda value, dump: write(_without_unknown(source, dump(value))),
                                                                       schema=fields_schema))
    if ref is not None:
        schema["ref"] = ref
    return schema
