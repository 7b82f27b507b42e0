"""The campaign spec's table of dimensions (#37): the spec, the run id, the tables and the run identity agree with
it, and a dimension added to it is crossed, checked, stored and kept out of spec.yaml at its default by that one
entry (and the spec's field of its name)."""

from __future__ import annotations

import dataclasses

import pytest

from bbrlab.analysis import runkey, tables
from bbrlab.campaign import dimensions, spec
from bbrlab.campaign.dimensions import DIMENSIONS, Dimension
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.scenario.scenario import RUN_ID_FRAGMENTS, Contention, Flow, IperfParams, Link, Scenario

BASE = {"name": "t", "ccas": ["cubic"], "timeslices_ms": [1], "cpu_shares_pct": [50], "rtts_ms": [10],
        "rates_mbit": [100], "repetitions": 1}
#: CampaignSpec's tuple fields that are not crossed into the grid: the extra flows (beside every run's own) and the
#: expectations (what the runs are judged against).
NOT_DIMENSIONS = {"flows", "expect"}


def test_every_list_field_of_the_spec_is_one_dimension_with_its_default_and_back():
    lists = {f.name: f for f in dataclasses.fields(CampaignSpec)
             if str(f.type).startswith("tuple[") or f.type == "NamedLists"}
    assert set(lists) - NOT_DIMENSIONS == {d.key for d in DIMENSIONS}
    assert len({d.key for d in DIMENSIONS}) == len(DIMENSIONS)
    for d in DIMENSIONS:
        field = lists[d.key]
        assert (field.default is dataclasses.MISSING) == d.required, d.key
        assert d.required or field.default == d.default, d.key
        assert str(field.type) == ("NamedLists" if d.mapping else f"tuple[{d.type.__name__}, ...]"), d.key


def test_a_mapping_dimension_reads_writes_and_describes_its_named_lists():
    for d in (d for d in DIMENSIONS if d.mapping):
        assert d.spec_value is not None and d.schema is not None and d.default == () and d.omitted_default, d.key
        assert d.stored(d.default) == {} and d.checked({}) == ()
        assert d.keyed_by is None or d.keyed_by in {k.key for k in DIMENSIONS if not k.mapping}, d.key


def test_each_dimension_lands_in_a_real_field_and_names_a_real_fragment():
    owners = {"link": Link, "contention": Contention, "scenario": Scenario}
    for d in DIMENSIONS:
        assert d.part in dimensions.PARTS
        if d.part in owners:
            names = {f.name for f in dataclasses.fields(owners[d.part])}
            if d.part == "contention":
                names |= {"model", "deadline_mode", "period_ms", "burst_ms", "credit_s"}  # the models' own, recorded flat
            assert d.field in names, d.lands_in
        else:
            assert d.field in {"cca", "workload"} | {f.name for f in dataclasses.fields(IperfParams)}, d.lands_in
        assert d.id_fragment is None or d.id_fragment in RUN_ID_FRAGMENTS, d.key
        assert d.type in (str, int, float)


def test_the_contention_dimensions_are_one_block_of_the_grid_order():
    parts = [d.part == "contention" for d in DIMENSIONS]
    first, last = parts.index(True), len(parts) - parts[::-1].index(True)
    assert all(parts[first:last])


def test_each_dimension_has_a_runs_column_and_the_run_identity_holds_the_identity_ones():
    for d in DIMENSIONS:
        assert d.column in tables.RUN_COLUMNS, d.key
        assert (d.column in runkey.RUN_KEY) == d.identity, d.key
    assert runkey.DIMENSIONS_KEY == ()  # every identity column is placed in a group of the key today


def test_spec_yaml_leaves_out_what_the_table_says_at_its_default():
    stored = CampaignSpec.from_dict(BASE).to_dict()
    for d in DIMENSIONS:
        assert (d.key in stored) == (not d.omitted_default), d.key


# -- adding a dimension ---------------------------------------------------------------------------------------
MTUS = Dimension("mtus_bytes", int, "bytes", (1500,), lambda v: Link(rtt_ms=10, rate_mbit=100, mtu_bytes=v),
                 "link.mtu_bytes", None, "mtu_bytes", True, omitted_default=True, doc="the link's MTU")


@pytest.fixture
def with_mtus(monkeypatch):
    """The spec with a test-only dimension: one table entry and the spec's field of its name."""
    extended = dataclasses.make_dataclass("CampaignSpec", [("mtus_bytes", tuple[int, ...], dataclasses.field(
        default=MTUS.default))], bases=(CampaignSpec,), frozen=True)
    monkeypatch.setattr(spec, "DIMENSIONS", (*DIMENSIONS, MTUS))
    monkeypatch.setattr(spec, "_OMITTED_DEFAULTS", {**spec._OMITTED_DEFAULTS, "mtus_bytes": [1500]})
    monkeypatch.setattr(spec, "CampaignSpec", extended)
    return extended


def test_a_dimension_added_to_the_table_is_checked_crossed_and_left_out_at_its_default(with_mtus):
    s = with_mtus.from_dict({**BASE, "mtus_bytes": [1500, 9000]})
    assert [p.link.mtu_bytes for p in s.grid()] == [1500, 9000]
    assert s.runs == 2 and len(s.plan()) == 2
    assert s.to_dict()["mtus_bytes"] == [1500, 9000]
    assert "mtus_bytes" not in with_mtus.from_dict(BASE).to_dict()
    with pytest.raises(ValidationError, match=r"mtus_bytes\[1\]"):
        with_mtus.from_dict({**BASE, "mtus_bytes": [1500, 100]})
    with pytest.raises(ValidationError, match=r"mtus_bytes\[0\]"):
        with_mtus.from_dict({**BASE, "mtus_bytes": [1500.5]})


def test_the_run_identity_and_the_tables_take_a_new_dimensions_column():
    from bbrlab.analysis.columns import dimension_columns

    schema = tuple(c for c in tables.RUN_SCHEMA if c.name != "loss_pct")
    (col,) = dimension_columns(schema)
    assert (col.name, col.dtype) == ("loss_pct", "float64")

    class View:
        scenario = Scenario(Link(20, 100, loss_model="uniform", loss_pct=2.0), Contention(1, 100), Flow("bbr"))

    assert col.of_record(View()) == 2.0


# -- the spec's JSON Schema -----------------------------------------------------------------------------------
def test_every_shipped_spec_validates_against_the_json_schema_and_it_names_every_key():
    import glob

    import jsonschema
    import yaml

    from bbrlab.campaign.spec_schema import spec_json_schema

    schema = spec_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    known = {f.name for f in dataclasses.fields(CampaignSpec)} - {"adaptive"} | {"sample_ss_ms"}
    assert set(schema["properties"]) == known
    files = sorted(glob.glob(str(spec.Path(spec.__file__).parents[2] / "specs" / "*.yaml")))
    assert files
    for path in files:
        with open(path) as f:
            jsonschema.validate(yaml.safe_load(f), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**BASE, "rtts_ms": []}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**BASE, "typo": 1}, schema)


def test_bbrlab_campaign_schema_prints_it(capsys):
    import json

    from bbrlab.campaign.spec_schema import spec_json_schema
    from bbrlab.cli.main import main

    assert main(["campaign", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == spec_json_schema()
