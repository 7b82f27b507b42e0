"""Pure parts of bbrlab.kernel: patch shape, CA name, hashes, parameter bounds, CLI parsing."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from bbrlab.cli.kernel import parse_assignments
from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.kernel import DEFAULT_PATCH, DEFICIT_PARAMS, BuildError, BuiltModule, ca_name, validate_params
from bbrlab.kernel.build import check_patch, expected_sha256_for, patch_targets
from bbrlab.kernel.source import SourceMismatchError, check_sha256, prepare_source, read_expected_sha256

PATCH_TEXT = DEFAULT_PATCH.read_text()


def test_default_patch_changes_only_tcp_bbr_c():
    assert patch_targets(PATCH_TEXT) == ["net/ipv4/tcp_bbr.c"]
    assert check_patch(DEFAULT_PATCH) == PATCH_TEXT


def test_patch_renames_the_congestion_control_to_bbr2b():
    assert '+\t.name\t\t= "bbr2b",' in PATCH_TEXT
    assert '-\t.name\t\t= "bbr",' in PATCH_TEXT


def test_patch_parameters_match_the_python_table():
    declared = re.findall(r"^\+BBR2B_PARAM\((\w+), ([^,]+), (\d+),", PATCH_TEXT, re.M)
    got = {name: (default.strip(), int(limit)) for name, default, limit in declared}
    assert set(got) == set(DEFICIT_PARAMS)
    for name, spec in DEFICIT_PARAMS.items():
        default, limit = got[name]
        assert limit == spec.max, name
        if default == "BBR_UNIT * 2885 / 1000 + 1":  # BBR's bbr_high_gain, written as in tcp_bbr.c
            default = str(256 * 2885 // 1000 + 1)
        assert int(default) == spec.default, name


def test_paper_defaults():
    assert DEFICIT_PARAMS["deficit_gain"].default == 739  # 2.89 x BBR_UNIT, BBR's high gain
    assert DEFICIT_PARAMS["deficit_ewma_shift"].default == 2  # weight 1/4
    assert DEFICIT_PARAMS["deficit_probe_rtt_holdoff_rtts"].default == 3
    assert DEFICIT_PARAMS["deficit_probe_bw_only"].default == 1
    assert DEFICIT_PARAMS["deficit_skip_app_limited"].default == 1


def test_source_hash_file_is_well_formed():
    value = read_expected_sha256(DEFAULT_PATCH.parent / "SOURCE.sha256")
    assert re.fullmatch(r"[0-9a-f]{64}", value)


@pytest.mark.parametrize("text, name", [
    ('static struct tcp_congestion_ops x = {\n\t.name\t\t= "bbr2b",\n};', "bbr2b"),
    ('.name = "bbr_hg4"', "bbr_hg4"),
])
def test_ca_name_reads_the_ops_name(text, name):
    assert ca_name(text) == name


@pytest.mark.parametrize("text, words", [
    ('.name = "bbr"', "own name"),
    ('.name = "BBR-2"', "1-15 characters"),
    ('.name = "averyveryverylongname"', "1-15 characters"),
    ("no ops here", "exactly one"),
])
def test_ca_name_refuses(text, words):
    with pytest.raises(BuildError, match=words):
        ca_name(text)


def test_check_patch_refuses_a_patch_of_another_file(tmp_path):
    p = tmp_path / "other.patch"
    p.write_text("--- a/net/ipv4/tcp_cubic.c\n+++ b/net/ipv4/tcp_cubic.c\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(BbrlabError, match=r"exactly net/ipv4/tcp_bbr.c.*tcp_cubic.c"):
        check_patch(p)


def test_check_patch_refuses_a_missing_file(tmp_path):
    with pytest.raises(BbrlabError, match="patch = .*existing unified diff"):
        check_patch(tmp_path / "nope.patch")


def test_expected_sha256_needs_a_sidecar_or_a_value(tmp_path):
    p = tmp_path / "x.patch"
    p.write_text("")
    with pytest.raises(BbrlabError, match="no SOURCE.sha256"):
        expected_sha256_for(p, None)
    assert expected_sha256_for(p, "AB" * 32) == "ab" * 32
    with pytest.raises(BbrlabError, match="64 hexadecimal digits"):
        expected_sha256_for(p, "abc")


def test_check_sha256_normalises():
    assert check_sha256(" " + "F" * 64 + "\n") == "f" * 64


def test_prepare_source_accepts_the_right_file_and_refuses_a_changed_one(tmp_path: Path):
    good = tmp_path / "tcp_bbr.c"
    good.write_bytes(b"int x;\n")
    digest = hashlib.sha256(b"int x;\n").hexdigest()
    assert prepare_source(good, digest) == good
    tree = tmp_path / "tree" / "net" / "ipv4"
    tree.mkdir(parents=True)
    (tree / "tcp_bbr.c").write_bytes(b"int y;\n")
    with pytest.raises(SourceMismatchError) as err:
        prepare_source(tmp_path / "tree", digest)
    msg = str(err.value)
    assert str(tree / "tcp_bbr.c") in msg and digest in msg and hashlib.sha256(b"int y;\n").hexdigest() in msg


def test_prepare_source_names_a_missing_source(tmp_path):
    with pytest.raises(BbrlabError, match="does not exist"):
        prepare_source(tmp_path / "missing.tar.xz", "0" * 64)


def test_validate_params_bounds_and_names():
    available = list(DEFICIT_PARAMS)
    assert validate_params(available, {"deficit_gain": "1000", "deficit_enable": 0}) == {
        "deficit_gain": 1000, "deficit_enable": 0}
    with pytest.raises(ValidationError, match=r"params.deficit_gain = 1024 .*0\.\.1023"):
        validate_params(available, {"deficit_gain": 1024})
    with pytest.raises(ValidationError, match=r"params.deficit_ewma_shift .*0\.\.4"):
        validate_params(available, {"deficit_ewma_shift": "x"})
    with pytest.raises(ValidationError, match="one of the module's parameters"):
        validate_params(available, {"deficit_typo": 1})
    with pytest.raises(ValidationError):
        validate_params(available, {"deficit_enable": -1})


def test_built_module_target_release_and_round_trip():
    b = BuiltModule(Path("/x/bbr2b.ko"), "bbr2b", "ABC", "6.1.0-56-amd64 SMP preempt mod_unload modversions ",
                    "p" * 64, "s" * 64, "6.1.0-56-amd64")
    assert b.target_release == "6.1.0-56-amd64"
    assert BuiltModule.from_dict(b.to_dict()) == b


def test_parse_assignments():
    assert parse_assignments(["deficit_gain=1000", "deficit_enable=0"]) == {
        "deficit_gain": "1000", "deficit_enable": "0"}
    with pytest.raises(BbrlabError, match="NAME=VALUE"):
        parse_assignments(["deficit_gain"])


V3_PATCH = DEFAULT_PATCH.parents[1] / "bbr3" / "inflight-deficit.patch"


def test_v3_patch_shape_and_defaults():
    text = V3_PATCH.read_text()
    assert patch_targets(text) == ["net/ipv4/tcp_bbr.c"]
    assert '+\t.name\t\t= "bbr2b",' in text
    declared = dict(re.findall(r"^\+BBR2B_PARAM\((\w+), ([^,]+), \d+,", text, re.M))
    assert declared["deficit_gain"] == "BBR_UNIT * 277 / 100 + 1"  # 2.77, v3's high gain
    assert declared["deficit_bdp_gain"] == "BBR_UNIT * 84 / 100"  # threshold min(0.84 BDP, inflight_lo)
    assert set(declared) == set(DEFICIT_PARAMS) | {"deficit_bdp_gain"}
    assert "bbr->inflight_lo);" in text
