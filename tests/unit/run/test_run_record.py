"""The typed run record (issue #37): every committed record reads as one :class:`RunRecord` and writes back, byte
for byte, as it is stored (data/ loads unchanged); older schemas are upgraded in one place; a value that does not
fit names its field; the record has a JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from bbrlab.contention.evidence import ContentionRecord
from bbrlab.run import record
from bbrlab.run.runmeta import CcaUse, RunMetadata
from bbrlab.run.runrecord import RECORD_SCHEMA, RunRecord, metadata_of, record_json_schema, upgraded
from bbrlab.scenario.scenario import Scenario

ROOT = Path(__file__).resolve().parents[3]
RECORDS = sorted(ROOT.glob("data/**/record.json"))
SCHEMA_1 = sorted(ROOT.glob("tests/fixtures/campaign/runs/*/record.json"))


def test_every_committed_record_reads_typed_and_writes_back_byte_for_byte():
    assert len(RECORDS) > 800
    differ = []
    for path in RECORDS:
        text = path.read_text()
        typed = RunRecord.from_json(text)
        assert isinstance(typed.metadata, RunMetadata) and isinstance(typed.metadata.cca, CcaUse)
        if json.dumps(typed.to_dict(), indent=2) + "\n" != text:  # as bbrlab.run.record.commit writes it
            differ.append(str(path.relative_to(ROOT)))
    assert differ == []


def test_a_record_built_by_the_run_is_the_typed_records_json():
    stored = json.loads(RECORDS[0].read_text())
    typed = RunRecord.from_json(stored)
    built = record.build_record(**{k: v for k, v in stored.items() if k not in ("schema", "scenario", "metadata")},
                                scenario=typed.scenario, metadata=typed.metadata.to_dict())
    assert built == typed and json.dumps(built.to_dict()) == json.dumps(stored)
    assert RunRecord.load(RECORDS[0].parent) == record.load(RECORDS[0].parent) == typed


def test_a_schema_1_record_is_upgraded_where_it_is_read():
    assert SCHEMA_1
    for path in SCHEMA_1:
        stored = json.loads(path.read_text())
        assert stored["schema"] == "bbrlab.run/1" and "host" not in stored["metadata"]["contention"]
        typed = RunRecord.from_json(stored)
        assert typed.schema == RECORD_SCHEMA and typed.metadata.contention is None
        assert typed.metadata.cca.bbr_version is None and typed.metadata.testbed.to_dict() == stored["metadata"]["testbed"]
        assert json.loads(path.read_text()) == stored  # the record given is left as it was


def test_the_failed_record_of_a_hung_run_reads_typed_with_what_the_campaign_added():
    stored = json.loads(RECORDS[0].read_text())
    hung = {**stored, "status": "failed", "reason": "hung: ...",
            "metadata": {"hang": {"bound_s": 120.0, "ran_s": 130.2, "worker": "tcp://w"}, "timing": {"between_s": 1.0}}}
    typed = RunRecord.from_json(hung)
    assert typed.metadata.added.hang == hung["metadata"]["hang"] and typed.metadata.timing == {"between_s": 1.0}
    assert typed.status == "failed" and typed.metadata.contention is None


def test_a_part_older_than_its_type_is_left_out_where_the_tables_read_it():
    stored = json.loads(RECORDS[0].read_text())
    older = {**stored, "metadata": {**stored["metadata"], "sampling": {"samples": 10, "ended": "stop_file"},
                                    "contention": {"requested": {}}}}
    with pytest.raises(pydantic.ValidationError) as caught:
        metadata_of(older)
    assert {e["loc"][0] for e in caught.value.errors()} == {"sampling", "contention"}
    meta = metadata_of(older, drop_unreadable=True)
    assert meta.sampling is None and meta.contention is None and meta.testbed.to_dict() == stored["metadata"]["testbed"]
    with pytest.raises(ValueError, match="not those of a bbrlab.run/2 record"):
        metadata_of({**stored, "metadata": {**stored["metadata"], "surprise": 1}}, drop_unreadable=True)


def test_an_unknown_schema_or_a_value_that_does_not_fit_is_refused_by_name():
    stored = json.loads(RECORDS[0].read_text())
    with pytest.raises(ValueError, match="bbrlab.run/9"):
        upgraded({**stored, "schema": "bbrlab.run/9"})
    bad = {**stored, "attempt": "second", "metadata": {**stored["metadata"], "cca": {"available": []}}}
    with pytest.raises(pydantic.ValidationError) as caught:
        RunRecord.from_json(bad)
    where = {".".join(map(str, e["loc"])) for e in caught.value.errors()}
    assert where == {"attempt", "metadata.cca.requested"}
    with pytest.raises(ValueError, match="not those of a bbrlab.run/2 record"):
        RunRecord.from_json({**stored, "metadata": {**stored["metadata"], "surprise": 1}})


def test_the_record_has_a_json_schema():
    schema = record_json_schema()
    assert schema["required"] == ["run_id", "campaign", "status", "reason", "attempt", "started_at", "ended_at",
                                  "scenario", "metadata"]
    assert "requested" in schema["$defs"]["CcaUse"]["required"]
    assert isinstance(RunRecord.from_json(RECORDS[0].read_text()).metadata.contention, ContentionRecord)


FIXTURE_RECORDS = sorted(ROOT.glob("tests/fixtures/**/record.json"))


def test_every_committed_scenario_reads_typed_and_writes_back_as_stored():
    """Every scenario shape the committed records hold (kernel, sender_qdisc, flows, contention models, rsync,
    samplers, schema 1) reads as a :class:`Scenario` and its JSON is the stored one; under data/ byte for byte
    (test above). The 8 rsync fixtures of tests/fixtures/transfer were written by an early rsync writer whose
    flow keys came in another order (``sample_ss_ms`` before ``workload``): their JSON is equal, their bytes not."""
    assert len(RECORDS) + len(FIXTURE_RECORDS) == 831
    for path in RECORDS + FIXTURE_RECORDS:
        stored = json.loads(path.read_text())
        typed = RunRecord.from_json(stored)
        assert isinstance(typed.scenario, Scenario) and typed.scenario.run_id == stored["run_id"], path
        assert typed.to_dict()["scenario"] == stored["scenario"] == Scenario.from_dict(stored["scenario"]).to_dict()


def test_the_scenario_reads_by_attribute_and_a_key_older_records_lack_reads_as_its_default():
    older = (json.loads(p.read_text()) for p in RECORDS)  # a record made before kernels and queue trees
    stored = next(r for r in older if "kernel" not in r["scenario"] and "queue" not in r["scenario"]["link"])
    s = RunRecord.from_json(stored).scenario
    link = stored["scenario"]["link"]
    assert s.link.rtt_ms == link["rtt_ms"] and s.link.rate_mbit == link["rate_mbit"]
    assert s.flow.cca == stored["scenario"]["flow"]["cca"] and s.contention.cpu_share_pct > 0
    assert "queue" not in link and s.link.queue == "bbrlab" and s.link.emulator_offloads == "off"
    assert s.kernel is None and s.sender_qdisc == "default" and s.flows == ()
    with pytest.raises(pydantic.ValidationError) as caught:
        RunRecord.from_json({**stored, "scenario": {**stored["scenario"], "link": {**link, "rtt_ms": -1}}})
    assert {e["loc"] for e in caught.value.errors()} == {("scenario",)} and "link.rtt_ms" in str(caught.value)


def _envelope(stored: dict) -> dict:
    return {k: v for k, v in stored.items() if k not in ("schema", "status", "reason", "scenario", "metadata")}


def test_a_run_whose_metadata_does_not_type_is_kept_as_a_failed_attempt_naming_the_key(tmp_path):
    stored = json.loads(RECORDS[0].read_text())
    typed = RunRecord.from_json(stored)
    given = {**typed.metadata.to_dict(), "written_by": "test", "cca": "bbr"}
    staging = record.staging_dir(tmp_path, typed.run_id)
    made = record.record_of_run(staging, **_envelope(stored), status="ok", reason=None, scenario=typed.scenario,
                                metadata=given)
    assert made.status == "failed" and made.reason.startswith("the run's metadata does not type")
    assert "['written_by']" in made.reason and "cca: Input should be a dictionary" in made.reason
    assert made.metadata.cca is None and made.metadata.testbed == typed.metadata.testbed  # the keys that type stay
    assert json.loads((staging / record.UNTYPED_METADATA_FILE).read_text()) == given  # nothing measured is lost
    assert RunRecord.from_json(made.to_dict()) == made  # the failed record itself reads typed
    final = record.commit(staging, tmp_path, made)
    assert final.parent.name == record.FAILED and (final / record.UNTYPED_METADATA_FILE).is_file()


def test_a_failed_runs_own_reason_comes_first_and_typed_metadata_writes_no_extra_file(tmp_path):
    stored = json.loads(RECORDS[0].read_text())
    typed = RunRecord.from_json(stored)
    made = record.record_of_run(tmp_path, **_envelope(stored), status="failed", reason="host busy: 90 %",
                                scenario=typed.scenario, metadata={"pid": 7})
    assert made.reason.startswith("host busy: 90 %; the run's metadata does not type") and "['pid']" in made.reason
    assert made.metadata == RunMetadata()
    assert (tmp_path / record.UNTYPED_METADATA_FILE).is_file()
    (tmp_path / "ok").mkdir()
    ok = record.record_of_run(tmp_path / "ok", **_envelope(stored), status="ok", reason=None,
                              scenario=typed.scenario, metadata=typed.metadata.to_dict())
    assert ok == typed and not (tmp_path / "ok" / record.UNTYPED_METADATA_FILE).exists()
    with pytest.raises(ValueError, match="status must be ok or failed"):
        record.record_of_run(tmp_path, **_envelope(stored), status="stopped", reason=None, scenario=typed.scenario,
                             metadata={})
