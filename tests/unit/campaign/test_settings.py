"""The campaign spec's table of settings (#37): the spec's fields, defaults, checks, stored keys and JSON Schema agree
with it, and a setting added to it is checked, defaulted, kept out of spec.yaml and described by that one entry
(and the spec's field of its name)."""

from __future__ import annotations

import dataclasses

import pytest

from bbrlab.campaign import settings, spec, spec_schema
from bbrlab.campaign.settings import SETTINGS, Setting
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.campaign.spec_schema import spec_json_schema
from bbrlab.core.errors import ValidationError

BASE = {"name": "t", "ccas": ["cubic"], "timeslices_ms": [1], "cpu_shares_pct": [50], "rtts_ms": [10],
        "rates_mbit": [100], "repetitions": 2}
#: CampaignSpec's fields that are no key of their own: adaptive repetitions are read from ``repetitions``.
NOT_KEYS = {"adaptive"}
#: Settings without a field of their own: the older form of sample_ms sets sample_ms and sampler.
NO_FIELD = {"sample_ss_ms"}


def test_every_field_of_the_spec_is_a_dimension_or_one_setting_with_its_default():
    from bbrlab.campaign.dimensions import BY_KEY as DIMENSION

    others = {f.name: f for f in dataclasses.fields(CampaignSpec) if f.name not in DIMENSION and f.name not in NOT_KEYS}
    assert set(others) == {s.key for s in SETTINGS} - NO_FIELD
    assert len({s.key for s in SETTINGS}) == len(SETTINGS)
    assert not {s.key for s in SETTINGS} & set(DIMENSION)
    for s in SETTINGS:
        if s.key in NO_FIELD:
            continue
        field = others[s.key]
        assert (field.default is dataclasses.MISSING) == s.required, s.key
        assert s.required or field.default == s.default, s.key
        assert s.type in (str, int, float, object)
        assert s.type is not object or s.schema is not None or s.read is not None, s.key


def test_spec_yaml_leaves_out_what_the_table_says_at_its_default():
    stored = CampaignSpec.from_dict(BASE).to_dict()
    for s in SETTINGS:
        if s.key not in NO_FIELD and s.key != "search":  # search: written only in a threshold search
            assert (s.key in stored) == (not s.omitted_default), s.key


def test_each_setting_is_in_the_json_schema_with_its_default_and_doc():
    properties = spec_json_schema()["properties"]
    for s in SETTINGS:
        assert properties[s.key] == s.json_schema()
        assert s.doc and properties[s.key]["description"].startswith(s.doc), s.key
        if s.default is not None and not s.required:
            assert properties[s.key]["default"] == s.stored_default, s.key
    assert "name" in spec_json_schema()["required"]


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("seed", -1, "0 <= seed < 2**63"),
    ("seed", 2**63, "0 <= seed < 2**63"),
    ("seed", "1", "a whole number"),
    ("max_attempts", 11, "1 <= max_attempts <= 10"),
    ("repetitions", 0, "1 <= repetitions <= 1000"),
    ("order", "shuffled", "one of blocked-random, sequential, random"),
    ("delay_split", "both", "symmetric or forward"),
    ("sampler", "perf", "one of bpf, netlink, ss"),
    ("blocks", True, "a whole number, 1 <= blocks <= 100 (each block runs on a fresh boot of the sender)"),
])
def test_a_settings_range_and_choices_are_its_errors_words(key, value, allowed):
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**BASE, key: value})
    assert (e.value.field, e.value.allowed) == (key, allowed)


def test_a_key_that_stands_for_others_is_refused_beside_them_but_not_beside_their_none():
    with pytest.raises(ValidationError, match="absent when sample_ms or sampler is given"):
        CampaignSpec.from_dict({**BASE, "sample_ss_ms": 10, "sampler": None})
    s = CampaignSpec.from_dict({**BASE, "sample_ss_ms": 10, "sample_ms": None})
    assert (s.sample_ms, s.sampler) == (10, "ss")


# -- adding a setting ---------------------------------------------------------------------------------------
WARMUP = Setting("warmup_s", float, 0.0, "idle before each run", "s", minimum=0, maximum=60, omitted_default=True)


@pytest.fixture
def with_warmup(monkeypatch):
    """The spec with a test-only setting: one table entry and the spec's field of its name."""
    extended = dataclasses.make_dataclass("CampaignSpec", [("warmup_s", float, dataclasses.field(
        default=WARMUP.default))], bases=(CampaignSpec,), frozen=True)
    table = (*SETTINGS, WARMUP)
    monkeypatch.setattr(settings, "SETTINGS", table)
    monkeypatch.setattr(settings, "BY_KEY", {s.key: s for s in table})
    monkeypatch.setattr(spec, "SETTINGS", table)
    monkeypatch.setattr(spec_schema, "SETTINGS", table)
    monkeypatch.setattr(spec, "_OMITTED_DEFAULTS", {**spec._OMITTED_DEFAULTS, "warmup_s": 0.0})
    monkeypatch.setattr(spec, "CampaignSpec", extended)
    return extended


def test_a_setting_added_to_the_table_is_checked_defaulted_stored_and_described(with_warmup):
    assert with_warmup.from_dict({**BASE, "warmup_s": 5}).warmup_s == 5
    assert with_warmup.from_dict(BASE).warmup_s == 0.0
    assert "warmup_s" not in with_warmup.from_dict(BASE).to_dict()
    assert with_warmup.from_dict({**BASE, "warmup_s": 5}).to_dict()["warmup_s"] == 5
    with pytest.raises(ValidationError, match="0 <= warmup_s <= 60"):
        with_warmup.from_dict({**BASE, "warmup_s": 61})
    with pytest.raises(ValidationError, match="a number"):
        with_warmup.from_dict({**BASE, "warmup_s": "5"})
    assert spec_schema.spec_json_schema()["properties"]["warmup_s"] == {
        "type": "number", "minimum": 0, "maximum": 60, "description": "idle before each run [s]", "default": 0.0}
