"""Really build the inflight-deficit module against this machine's 6.1 headers (no mocks).

Needs Debian's linux-source-6.1 and linux-headers-6.1.0-*-amd64 (scripts/install-system-packages).
Loading is tested in the sender guest (test_kernel_testbed.py): this host's kernel cannot load
modules, but it can refuse a module built for another kernel, which is tested here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bbrlab.core.hosts import LocalHost
from bbrlab.kernel import (
    DEFAULT_PATCH,
    DEFAULT_SOURCE,
    DEFICIT_PARAMS,
    BuildError,
    ModuleLoadError,
    SourceMismatchError,
    build_module,
    check_vermagic,
    prepare_source,
)
from bbrlab.kernel.build import installed_headers, modinfo_field
from bbrlab.kernel.source import SOURCE_MEMBER, read_expected_sha256

pytestmark = pytest.mark.system

EXPECTED = read_expected_sha256(DEFAULT_PATCH.parent / "SOURCE.sha256")


@pytest.fixture(scope="module")
def headers() -> Path:
    found = [h for h in installed_headers() if h.name.endswith("-amd64")]
    assert found, "linux-headers-6.1.0-*-amd64 must be installed (scripts/install-system-packages)"
    return found[-1]


@pytest.fixture(scope="module")
def pristine() -> Path:
    """Debian's tcp_bbr.c, hash-checked (extracted once from the linux-source tarball)."""
    return prepare_source(DEFAULT_SOURCE, EXPECTED)


@pytest.fixture(scope="module")
def built(tmp_path_factory, headers):
    return build_module(DEFAULT_PATCH, headers, tmp_path_factory.mktemp("bbr2b"))


def test_bbr2b_builds_with_its_identity(built, headers):
    assert built.name == "bbr2b"
    assert built.ko_path.name == "bbr2b.ko" and built.ko_path.stat().st_size > 10_000
    assert built.target_release == headers.name.removeprefix("linux-headers-")
    assert built.patch_sha256 == hashlib.sha256(DEFAULT_PATCH.read_bytes()).hexdigest()
    assert built.source_sha256 == EXPECTED
    assert modinfo_field(built.ko_path, "srcversion") == built.srcversion != ""
    assert modinfo_field(built.ko_path, "bbrlab_patch_sha256") == built.patch_sha256
    assert modinfo_field(built.ko_path, "bbrlab_source_sha256") == EXPECTED


def test_module_parameters_are_declared_with_their_ranges(built):
    parm = modinfo_field(built.ko_path, "parm")
    declared = {line.split(":", 1)[0]: line for line in parm.splitlines()}
    assert set(declared) == set(DEFICIT_PARAMS)
    for name, spec in DEFICIT_PARAMS.items():
        assert declared[name].endswith(f"[0..{spec.max}]"), declared[name]


def test_a_wrong_kernel_source_is_refused_before_anything_is_built(tmp_path, pristine, headers):
    changed = tmp_path / "tcp_bbr.c"
    data = bytearray(pristine.read_bytes())
    data[100] ^= 0x01  # one byte changed
    changed.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(SourceMismatchError) as err:
        build_module(DEFAULT_PATCH, headers, out, source=changed)
    msg = str(err.value)
    assert str(changed) in msg and EXPECTED in msg and hashlib.sha256(bytes(data)).hexdigest() in msg
    assert not out.exists(), "nothing may be patched or built for a refused source"


def _variant_patch(pristine: Path, tmp_path: Path, edit) -> Path:
    """A researcher's patch: our patched file, edited further, diffed against the pristine file."""
    tree = tmp_path / "tree"
    for side in ("a", "b"):
        (tree / side / SOURCE_MEMBER).parent.mkdir(parents=True)
        shutil.copyfile(pristine, tree / side / SOURCE_MEMBER)
    subprocess.run(["patch", "-p1", "-s", "-d", str(tree / "b"), "-i", str(DEFAULT_PATCH)], check=True)
    target = tree / "b" / SOURCE_MEMBER
    target.write_text(edit(target.read_text()))
    diff = subprocess.run(["diff", "-u", f"a/{SOURCE_MEMBER}", f"b/{SOURCE_MEMBER}"], cwd=tree,
                          capture_output=True, text=True)
    assert diff.returncode == 1, diff.stderr
    patch = tmp_path / "variant" / "high-gain.patch"
    patch.parent.mkdir()
    patch.write_text(diff.stdout)
    (patch.parent / "SOURCE.sha256").write_text(f"{EXPECTED}  {SOURCE_MEMBER}\n")
    return patch


def test_a_researchers_higher_gain_variant_builds_under_its_own_name(tmp_path, pristine, headers):
    def higher_gain(text: str) -> str:
        text = text.replace('.name\t\t= "bbr2b"', '.name\t\t= "bbr2b_g4"')
        return text.replace("BBR2B_PARAM(deficit_gain, BBR_UNIT * 2885 / 1000 + 1, 1023,",
                            "BBR2B_PARAM(deficit_gain, 1000, 1023,")

    patch = _variant_patch(pristine, tmp_path, higher_gain)
    variant = build_module(patch, headers, tmp_path / "out")
    assert variant.name == "bbr2b_g4" and variant.ko_path.name == "bbr2b_g4.ko"
    assert variant.patch_sha256 == hashlib.sha256(patch.read_bytes()).hexdigest()
    assert modinfo_field(variant.ko_path, "name") == "bbr2b_g4"
    assert "deficit_gain" in modinfo_field(variant.ko_path, "parm")


def test_a_patch_that_keeps_the_stock_name_is_refused(tmp_path, pristine, headers):
    patch = _variant_patch(pristine, tmp_path, lambda t: t.replace('.name\t\t= "bbr2b"', '.name\t\t= "bbr"'))
    with pytest.raises(BuildError, match="own name"):
        build_module(patch, headers, tmp_path / "out")


def test_a_patch_that_does_not_apply_is_refused(tmp_path, headers):
    text = DEFAULT_PATCH.read_text().replace(" \t\tprobe_rtt_round_done:1,", " \t\tprobe_rtt_round_done:2,", 1)
    assert text != DEFAULT_PATCH.read_text()
    patch = tmp_path / "broken.patch"
    patch.write_text(text)
    (tmp_path / "SOURCE.sha256").write_text(EXPECTED + "\n")
    with pytest.raises(BuildError, match="does not apply"):
        build_module(patch, headers, tmp_path / "out")


def test_a_module_for_another_kernel_is_refused_by_vermagic(built):
    host = LocalHost()  # this host runs 6.18, the module is for 6.1
    release = host.output(["uname", "-r"])
    assert release != built.target_release
    with pytest.raises(ModuleLoadError) as err:
        check_vermagic(host, built)
    assert built.target_release in str(err.value) and release in str(err.value)


def test_build_cache_reuses_the_same_inputs(headers):
    first = build_module(DEFAULT_PATCH, headers)
    second = build_module(DEFAULT_PATCH, headers)
    assert first == second and first.ko_path.is_file()


def _bbrlab(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("bbrlab")
    return subprocess.run([str(exe), "kernel", *args], capture_output=True, text=True, timeout=600)


def test_cli_build_prints_the_identity(tmp_path, headers):
    res = _bbrlab("build", "--headers", str(headers), "--out", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["name"] == "bbr2b" and Path(data["ko_path"]).is_file() and data["source_sha256"] == EXPECTED


def test_cli_refuses_a_wrong_source_with_the_hashes(tmp_path, pristine, headers):
    changed = tmp_path / "tcp_bbr.c"
    changed.write_bytes(pristine.read_bytes() + b"\n")
    res = _bbrlab("build", "--headers", str(headers), "--source", str(changed), "--out", str(tmp_path / "out"))
    assert res.returncode == 1
    assert "bbrlab: error:" in res.stderr and EXPECTED in res.stderr and str(changed) in res.stderr
    assert not (tmp_path / "out").exists()
