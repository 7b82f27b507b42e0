"""One run record (``record.json``, docs/run-record.md) as one typed object: the envelope and its metadata.

:class:`RunRecord` is what :func:`bbrlab.run.record.build_record` writes, typed: the run's id, campaign, status,
reason, attempt and times, the :class:`~bbrlab.scenario.scenario.Scenario` it ran and the :class:`RunMetadata`.
:meth:`RunRecord.from_json` is the one reader: it upgrades a record of an older schema (:func:`upgraded`) and
checks every field (pydantic's TypeAdapter, :mod:`bbrlab.core.recordjson`), naming the one that does not fit;
:meth:`RunRecord.to_dict` gives back the JSON ``record.json`` holds, key for key, for a record of the current
schema. :func:`record_json_schema` is the record's JSON Schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pydantic

from bbrlab.core import recordjson
from bbrlab.scenario.scenario import Scenario

from .runmeta import RunMetadata

#: The schema every record is written in.
RECORD_SCHEMA = "bbrlab.run/2"
#: The schema of records made before the typed run metadata of the run recipe; read, upgraded.
SCHEMA_1 = "bbrlab.run/1"
#: Earlier schemas readers still accept, and the current one.
READABLE_SCHEMAS = (SCHEMA_1, RECORD_SCHEMA)


@dataclass(kw_only=True)
class RunRecord:
    """A run record, field for field as ``record.json`` holds it (the keys in this order)."""

    schema: str = RECORD_SCHEMA
    run_id: str
    campaign: str
    status: str  # ok or failed
    reason: str | None  # why it failed (the error, with where it was raised); None when ok
    attempt: int
    started_at: str  # UTC ISO 8601 with milliseconds
    ended_at: str
    scenario: Scenario  # as its own JSON (Scenario.to_dict, Scenario.from_dict)
    metadata: RunMetadata

    def to_dict(self) -> dict:
        """The JSON of ``record.json``."""
        return recordjson.to_json(self)

    @classmethod
    def from_json(cls, data: dict | str | bytes) -> RunRecord:
        """A record from its JSON (parsed, or text): upgraded to the current schema (:func:`upgraded`), then
        typed; ValueError naming the field that does not fit, or the schema that is not readable."""
        if not isinstance(data, dict):
            data = json.loads(data)
        return recordjson.from_json(cls, upgraded(data))

    @classmethod
    def load(cls, run_dir: Path) -> RunRecord:
        """The ``record.json`` of the run directory ``run_dir``, typed (:meth:`from_json`)."""
        return cls.from_json((Path(run_dir) / "record.json").read_bytes())


def upgraded(record: dict) -> dict:
    """``record`` in the current schema: the one place older records are brought up to date (a new dict; the
    record given is left as it is). A record without a schema is taken as current.

    ``bbrlab.run/1`` (host-netns runs, before the run recipe): its ``contention`` is the host's ``chrt`` output,
    not a contention record, and is left out; ``cca`` lacks ``bbr_version`` and ``patched``, which stay unknown
    (None, False); ``flow``, ``timing`` and ``link`` were not recorded. Everything else reads as it is.
    """
    schema = record.get("schema", RECORD_SCHEMA)
    if schema not in READABLE_SCHEMAS:
        raise ValueError(f"record schema {schema!r}: readable are {', '.join(READABLE_SCHEMAS)}")
    out = {**record, "schema": RECORD_SCHEMA}
    if schema == SCHEMA_1:
        out["metadata"] = {k: v for k, v in (record.get("metadata") or {}).items() if k != "contention"}
    return out


def metadata_of(record: Mapping, *, drop_unreadable: bool = False) -> RunMetadata:
    """The typed metadata of a record's JSON (:func:`upgraded` first), for readers that take the envelope and the
    scenario as they are; a record without metadata has an empty one. ``drop_unreadable``: a part that does not
    read typed (a form older than its type, not upgraded here) is left out, None, rather than the whole record
    refused; an unknown key is still refused."""
    metadata = upgraded({**record, "metadata": record.get("metadata") or {}})["metadata"]
    try:
        return RunMetadata.from_dict(metadata)
    except pydantic.ValidationError as e:
        # a key the campaign added is a part of its own (``added.search`` is ``metadata.search``)
        parts = {loc[1] if loc[0] == "added" and len(loc) > 1 else loc[0] for loc in (err["loc"] for err in e.errors())
                 if loc}
        if not drop_unreadable or not parts:
            raise
    return RunMetadata.from_dict({k: v for k, v in metadata.items() if k not in parts})


def record_json_schema() -> dict:
    """The JSON Schema of a run record (:class:`RunRecord`)."""
    return recordjson.json_schema(RunRecord)


def scenario_of(record: Mapping) -> Scenario:
    """The typed scenario of a record's JSON (:meth:`Scenario.from_record
    <bbrlab.scenario.scenario.Scenario.from_record>`, as :meth:`RunRecord.from_json` reads it), for readers that
    take the rest of the record as it is; ValueError naming the field when it does not read."""
    return recordjson.from_json(Scenario, record.get("scenario"))
