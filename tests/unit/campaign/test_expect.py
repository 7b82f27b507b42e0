"""A spec's expect: block (bbrlab.campaign.expect): every bad value refused naming the field and what it may be,
read back to what was written, in the spec's JSON Schema, and never part of the campaign's identity (the plan,
the directory a campaign resumes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bbrlab.campaign import directory
from bbrlab.campaign.expect import expectations_from_file, read_expectations
from bbrlab.campaign.spec import CampaignSpec, load_spec, spec_from_yaml
from bbrlab.campaign.spec_schema import spec_json_schema
from bbrlab.core.errors import BbrlabError, ValidationError

ROOT = Path(__file__).resolve().parents[3]

BASE = {"name": "t", "ccas": ["bbr", "bbr2b"], "timeslices_ms": [1, 10], "cpu_shares_pct": [25, 40, 100],
        "rtts_ms": [20], "rates_mbit": [20], "repetitions": 2, "duration_s": 5}
GOOD = [{"name": "recovers", "cca": "bbr2b", "metric": "link_utilisation", "stat": "median", "op": ">=",
         "value": 0.8, "where": {"timeslice_ms": 1, "cpu_share_pct": ">= 40"}, "confidence": 0.95},
        {"cca": "bbr2b", "not_below": "bbr"},
        {"metric": "jain_index", "op": ">=", "value": 0.9, "where": {"cca": ["bbr", "bbr2b"]}, "confidence": 0.5}]


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def test_a_block_is_read_with_its_defaults():
    e = spec(expect=GOOD).expect
    assert [x.label for x in e] == ["recovers", "expect[1]", "expect[2]"]
    assert [x.kind for x in e] == ["threshold", "not_below", "threshold"]
    assert e[1].metric == "link_utilisation" and e[1].stat == "median" and e[1].confidence == 0.95
    assert e[0].where[1].holds(40.0) and not e[0].where[1].holds(25.0) and not e[0].where[1].holds(None)
    assert e[2].where[0].holds("bbr") and not e[2].where[0].holds("cubic")
    assert e[0].text() == ("bbr2b: median link_utilisation >= 0.8 where timeslice_ms = 1, cpu_share_pct >= 40, "
                           "at 95 % confidence")


def test_the_block_reads_back_to_what_was_written():
    s = spec(expect=GOOD)
    again = spec_from_yaml(yaml.safe_dump(s.to_dict(), sort_keys=False))
    assert again == s and again.to_dict() == s.to_dict()
    assert "expect" not in spec().to_dict()  # at its default spec.yaml leaves it out, as specs before it had


@pytest.mark.parametrize(("block", "field", "allowed"), [
    ({"op": ">="}, "expect[0].value", "required"),
    ({"value": 0.8}, "expect[0].op", "required"),
    ({"op": "=>", "value": 1}, "expect[0].op", ">=, >, <=, <"),
    ({"op": ">=", "value": float("nan")}, "expect[0].value", "a finite number"),
    ({"op": ">=", "value": True}, "expect[0].value", "a finite number"),
    ({"op": ">=", "value": 1, "metric": "cpu"}, "expect[0].metric", "link_utilisation, throughput_mbit"),
    ({"op": ">=", "value": 1, "stat": "mean"}, "expect[0].stat", "median"),
    ({"op": ">=", "value": 1, "confidence": 1}, "expect[0].confidence", "0.5 <= confidence < 1"),
    ({"op": ">=", "value": 1, "confidence": 0.3}, "expect[0].confidence", "0.5 <= confidence < 1"),
    ({"op": ">=", "value": 1, "cca": "BBR!"}, "expect[0].cca", "a congestion control name"),
    ({"op": ">=", "value": 1, "cca": "cubic"}, "expect[0].cca", "one of the spec's ccas: bbr, bbr2b"),
    ({"op": ">=", "value": 1, "name": "a b"}, "expect[0].name", "A-Z a-z 0-9"),
    ({"op": ">=", "value": 1, "colour": "red"}, "expect[0].colour", "a known key: name, cca, metric"),
    ({"op": ">=", "value": 1, "where": {"share": 40}}, "expect[0].where", "a column of the run identity"),
    ({"op": ">=", "value": 1, "where": {}}, "expect[0].where", "a mapping of columns"),
    ({"op": ">=", "value": 1, "where": {"cpu_share_pct": ">= 40 %"}}, "expect[0].where.cpu_share_pct",
     "a comparison such as '>= 25'"),
    ({"op": ">=", "value": 1, "where": {"cpu_share_pct": "forty"}}, "expect[0].where.cpu_share_pct",
     "a number, a list of numbers, or a comparison"),
    ({"op": ">=", "value": 1, "where": {"cca": 3}}, "expect[0].where.cca", "a name"),
    ({"op": ">=", "value": 1, "where": {"cpu_share_pct": 50}}, "expect[0].where.cpu_share_pct",
     "values of the spec's cpu_share_pct: 25, 40, 100"),
    ({"op": ">=", "value": 1, "where": {"timeslice_ms": ">= 20"}}, "expect[0].where.timeslice_ms",
     "values of the spec's timeslice_ms: 1, 10"),
    ({"not_below": "bbr"}, "expect[0].cca", "required with not_below"),
    ({"cca": "bbr", "not_below": "bbr"}, "expect[0].not_below", "another CCA than cca"),
    ({"cca": "bbr2b", "not_below": "bbr", "op": ">="}, "expect[0].not_below", "absent when op and value"),
    ("bbr2b >= 0.8", "expect[0]", "a mapping of keys"),
])
def test_a_bad_expectation_names_its_field_and_what_it_may_be(block, field, allowed):
    with pytest.raises(ValidationError) as e:
        spec(expect=[block])
    assert e.value.field == field and allowed in e.value.allowed, str(e.value)


def test_block_shape_and_names():
    with pytest.raises(ValidationError, match="a list of expectations"):
        spec(expect={"op": ">="})
    with pytest.raises(ValidationError, match="a name no other expectation of the block has") as e:
        read_expectations([{"name": "x", "op": ">=", "value": 1}, {"name": "x", "op": "<", "value": 2}])
    assert e.value.field == "expect[1].name"
    with pytest.raises(ValidationError, match="at most 200"):
        read_expectations([{"op": ">=", "value": 1}] * 201)


def test_json_schema_describes_the_block():
    schema = spec_json_schema()["properties"]["expect"]
    assert schema["type"] == "array" and schema["default"] == []
    item = schema["items"]
    assert set(item["properties"]) == {"name", "cca", "metric", "stat", "op", "value", "not_below", "where",
                                       "confidence"}
    assert item["properties"]["op"]["enum"] == [">=", ">", "<=", "<"]
    assert "cpu_share_pct" in item["properties"]["where"]["propertyNames"]["enum"]
    jsonschema = pytest.importorskip("jsonschema")
    doc = {**BASE, "expect": GOOD}
    jsonschema.validate(doc, spec_json_schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**BASE, "expect": [{"cca": "bbr2b", "not_below": "bbr", "op": ">="}]},
                            spec_json_schema())


# -- not the campaign's identity ------------------------------------------------------------------------------------

def test_expectations_change_neither_the_plan_nor_the_directory(tmp_path):
    plain, judged = spec(), spec(expect=GOOD)
    assert [r.run_id for r in judged.plan()] == [r.run_id for r in plain.plan()]
    directory.prepare(plain, tmp_path)
    assert directory.check_out_dir(judged, tmp_path) is True  # the same campaign: it resumes there
    directory.prepare(judged, tmp_path)
    kept = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    assert kept["expect"] == judged.to_dict()["expect"]  # spec.yaml takes the block last given
    changed = spec(expect=GOOD[:1])
    directory.prepare(changed, tmp_path)
    assert yaml.safe_load((tmp_path / "spec.yaml").read_text())["expect"] == changed.to_dict()["expect"]
    directory.prepare(plain, tmp_path)
    assert "expect" not in yaml.safe_load((tmp_path / "spec.yaml").read_text())
    with pytest.raises(BbrlabError, match="different campaign"):
        directory.prepare(spec(seed=7, expect=GOOD), tmp_path)  # what makes it another campaign still does


def test_a_committed_campaign_matches_its_spec_with_expectations():
    """specs/threshold-search-local.yaml carries an expect: block; data/threshold-search-local, recorded before
    expectations existed (its spec.yaml has none), is still that spec's directory."""
    s = load_spec(ROOT / "specs" / "threshold-search-local.yaml")
    assert s.expect, "the shipped spec has an expect: block"
    assert "expect" not in yaml.safe_load((ROOT / "data" / "threshold-search-local" / "spec.yaml").read_text())
    assert directory.check_out_dir(s, ROOT / "data" / "threshold-search-local") is True


# -- a file of expectations -----------------------------------------------------------------------------------------

def test_a_file_of_expectations(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"description": "mine", "expect": GOOD[:2]}))
    got = expectations_from_file(path)
    assert got.description == "mine" and [e.label for e in got.expectations] == ["recovers", "expect[1]"]
    path.write_text(yaml.safe_dump({"expect": GOOD, "ccas": ["bbr"]}))
    with pytest.raises(ValidationError, match="a key of a file of expectations: expect, description"):
        expectations_from_file(path)
    path.write_text("- {op: '>=', value: 1}\n")
    with pytest.raises(ValidationError, match="a mapping with expect:"):
        expectations_from_file(path)
    path.write_text("expect: [{op: '>=', value: 1, op: '<'}]\n")
    with pytest.raises(ValidationError, match="each key once"):
        expectations_from_file(path)
    path.write_text("expect: []\n" + "#" * (1 << 20))
    with pytest.raises(ValidationError, match="at most 1048576 bytes"):
        expectations_from_file(path)
    with pytest.raises(BbrlabError, match="cannot read"):
        expectations_from_file(tmp_path / "absent.yaml")


def test_shipped_files_of_expectations_are_valid():
    files = sorted((ROOT / "specs" / "expect").glob("*.yaml"))
    assert files, "specs/expect/ holds no files of expectations"
    for path in files:
        assert expectations_from_file(path).expectations, path


def test_a_spec_with_expectations_hashes():
    assert hash(spec(expect=GOOD)) != hash(spec())
