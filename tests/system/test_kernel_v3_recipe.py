"""The BBRv3 recipe (kernels/bbr3/build-kernel-debs.sh), run as far as this machine allows.

The google/bbr tree is not here, so the recipe's preparation steps (hash check, patched copy,
identity lines, Makefile entry) run against a stand-in tree made of Debian 6.1's tcp_bbr.c with the
v1 patch, which exercises the same script code. The kernel build itself needs the v3 tree.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from bbrlab.kernel import DEFAULT_PATCH, DEFAULT_SOURCE, KERNELS_DIR, prepare_source
from bbrlab.kernel.source import read_expected_sha256

pytestmark = pytest.mark.system

SCRIPT = KERNELS_DIR / "bbr3" / "build-kernel-debs.sh"


@pytest.fixture
def tree(tmp_path) -> Path:
    pristine = prepare_source(DEFAULT_SOURCE, read_expected_sha256(DEFAULT_PATCH.parent / "SOURCE.sha256"))
    root = tmp_path / "bbr-v3"
    (root / "net" / "ipv4").mkdir(parents=True)
    shutil.copyfile(pristine, root / "net" / "ipv4" / "tcp_bbr.c")
    (root / "net" / "ipv4" / "Makefile").write_text("obj-$(CONFIG_TCP_CONG_BBR) += tcp_bbr.o\n")
    return root


def _prepare(tree: Path, patch: Path = DEFAULT_PATCH) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--tree", str(tree), "--patch", str(patch), "--prepare-only"],
                          capture_output=True, text=True, timeout=120)


def test_recipe_prepares_a_bbr2b_module_beside_bbr(tree):
    for _ in range(2):  # idempotent
        res = _prepare(tree)
        assert res.returncode == 0, res.stderr
    copy = (tree / "net" / "ipv4" / "tcp_bbr2b.c").read_text()
    assert '.name\t\t= "bbr2b"' in copy
    assert f'MODULE_INFO(bbrlab_patch_sha256, "{hashlib.sha256(DEFAULT_PATCH.read_bytes()).hexdigest()}");' in copy
    assert (tree / "net" / "ipv4" / "tcp_bbr.c").read_text().count('.name\t\t= "bbr",') == 1  # stock kept
    makefile = (tree / "net" / "ipv4" / "Makefile").read_text().splitlines()
    assert makefile.count("obj-m += tcp_bbr2b.o") == 1


def test_recipe_refuses_a_source_with_another_hash(tree):
    src = tree / "net" / "ipv4" / "tcp_bbr.c"
    src.write_text(src.read_text().replace("BBR", "BBr", 1))
    res = _prepare(tree)
    assert res.returncode != 0
    assert "refusing" in res.stderr and hashlib.sha256(src.read_bytes()).hexdigest() in res.stderr
    assert not (tree / "net" / "ipv4" / "tcp_bbr2b.c").exists()


def test_recipe_refuses_a_patch_that_does_not_apply(tree, tmp_path):
    v3 = KERNELS_DIR / "bbr3" / "inflight-deficit.patch"  # written for the v3 file, not for 6.1's
    res = _prepare(tree, v3)
    assert res.returncode != 0
    assert "does not apply" in res.stderr or "refusing" in res.stderr  # (hash check first once v3 is pinned)
