"""bbrlab.core.recordjson: a class with a layout of its own keeps it wherever it is nested, also twice."""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core import recordjson


@dataclass(frozen=True)
class _Part:
    value: int
    known: int | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        return recordjson.record_layout(source, handler)


@dataclass(frozen=True)
class _Pair:
    first: _Part | None = None
    second: _Part | None = None


def test_a_layout_class_in_two_fields_of_one_record_is_written_and_read_with_its_layout_in_both():
    pair = _Pair(_Part(1), _Part(2))
    assert recordjson.to_json(pair) == {"first": {"value": 1}, "second": {"value": 2}}
    assert recordjson.from_json(_Pair, {"first": {"value": 1}, "second": {"value": 2, "known": 3}}) == \
        _Pair(_Part(1), _Part(2, 3))
