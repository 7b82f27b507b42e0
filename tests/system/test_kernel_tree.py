"""``bbrlab kernel build-tree``: the checks before compiling, and (slow) the whole recipe for real.

The slow test builds Debian's ``linux-source-6.1`` (installed by make setup) as a sender kernel,
boots it as the testbed's sender and carries a bbr flow; it takes tens of minutes on 2 cores
(``make test-slow``). The other tests run the checks that come before any compiling, on stand-in
trees made of the real 6.1 ``tcp_bbr.c``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import bbrlab.testbed as tbmod
from bbrlab.core.cachefiles import sha256_file
from bbrlab.kernel import DEFAULT_PATCH, DEFAULT_SOURCE, prepare_source
from bbrlab.kernel.bbr2b import Bbr2bUnavailable
from bbrlab.kernel.ccaprobe import probe_ccas
from bbrlab.kernel.source import read_expected_sha256
from bbrlab.kernel.tree import V3_PATCH, TreeBuildError, build_tree, check_tree, choose_bbr2b
from tests.testbed_flows import bbr_flow, received_mbit

pytestmark = pytest.mark.system

IPERF_PORT = 5292


@pytest.fixture
def stand_in_tree(tmp_path):
    """The files check_tree looks at, with Debian 6.1's real tcp_bbr.c (not a buildable tree)."""
    root = tmp_path / "tree"
    pristine = prepare_source(DEFAULT_SOURCE, read_expected_sha256(DEFAULT_PATCH.parent / "SOURCE.sha256"))
    for member in ("Makefile", "arch/x86/configs/x86_64_defconfig", "scripts/kconfig/merge_config.sh"):
        (root / member).parent.mkdir(parents=True, exist_ok=True)
        (root / member).write_text("# stand-in\n")
    (root / "net/ipv4").mkdir(parents=True)
    shutil.copyfile(pristine, root / "net/ipv4/tcp_bbr.c")
    return root


def test_a_6_1_tree_gets_the_v1_patch(stand_in_tree):
    tcp_bbr_c = check_tree(stand_in_tree)
    assert choose_bbr2b(tcp_bbr_c).patch == DEFAULT_PATCH


def test_a_v3_tree_needs_its_hash_accepted_and_the_v3_patch_to_apply(stand_in_tree):
    tcp_bbr_c = stand_in_tree / "net/ipv4/tcp_bbr.c"
    tcp_bbr_c.write_text(tcp_bbr_c.read_text().replace("#include <linux/module.h>",
                                                       "#include <linux/module.h>\n#define BBR_VERSION\t\t3", 1))
    with pytest.raises(Bbr2bUnavailable) as err:
        choose_bbr2b(tcp_bbr_c)
    assert f"--bbr2b-sha256 {sha256_file(tcp_bbr_c)}" in str(err.value)
    with pytest.raises(Bbr2bUnavailable, match="does not apply"):  # the stand-in is not a real v3 tcp_bbr.c
        choose_bbr2b(tcp_bbr_c, expected_sha256=sha256_file(tcp_bbr_c))
    assert V3_PATCH.is_file()


@pytest.mark.parametrize("damage, why", [
    (lambda t: (t / "Makefile").unlink(), "has no Makefile"),
    (lambda t: (t / "net/ipv4/tcp_bbr.c").unlink(), "has no net/ipv4/tcp_bbr.c"),
    (lambda t: (t / ".config").write_text("CONFIG_X=y\n"), "make mrproper"),
])
def test_a_bad_tree_is_refused_before_anything_is_built(stand_in_tree, tmp_path, damage, why):
    damage(stand_in_tree)
    out = tmp_path / "out"
    with pytest.raises(TreeBuildError, match=why):
        build_tree(stand_in_tree, out)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.testbed
@pytest.mark.timeout(3 * 3600)  # a whole kernel build on 2 shared cores
def test_linux_source_6_1_builds_boots_as_the_sender_and_carries_bbr(testbed, tmp_path_factory):
    work = tmp_path_factory.mktemp("build-tree")
    subprocess.run(["tar", "-xf", str(DEFAULT_SOURCE), "-C", str(work)], check=True, timeout=1800)
    tree = next(p for p in work.iterdir() if p.is_dir())
    out = work / "kernel"
    result = build_tree(tree, out, jobs=os.cpu_count(), nice=10, progress=print)
    print(f"\nbuild-tree {tree.name} -> {result.release}: {result.build_s:.0f} s with -j{result.jobs} "
          f"(steps: {result.steps_s})")
    assert result.release.endswith("-bbrlab") and result.tree_bbr_version == 1
    assert (out / "bzImage").is_file() and (out / "lib/modules" / result.release / "modules.dep").is_file()
    assert result.bbr2b["name"] == "bbr2b" and result.bbr2b["kernel_release"] == result.release
    assert json.loads((out / "kernel.json").read_text())["release"] == result.release

    name, vcpus = testbed.name, testbed.local.sender_vcpus
    try:
        tb = tbmod.up(name, sender_vcpus=vcpus, progress=True, kernel=str(out))
        try:
            assert tb.sender.host.output(["uname", "-r"]) == result.release
            recorded = tbmod.sender_kernel(tb)
            assert (recorded.origin, recorded.path, recorded.sha256) == ("user", str(out),
                                                                         sha256_file(out / "bzImage"))
            ccas = probe_ccas(tb.sender.host)
            assert ccas["bbr"].bbr_version == 1 and ccas["bbr2b"].patched
            rate = received_mbit(bbr_flow(tb, IPERF_PORT, work, duration_s=5))
            print(f"bbr through the emulator on the built kernel: {rate:.0f} Mbit/s")
            assert rate > 0
        finally:
            tb.close()
    finally:
        tb = tbmod.up(name, sender_vcpus=vcpus, progress=False)
        testbed.sender.host.close()
        assert tb.sender.host.output(["uname", "-r"]).startswith("6.1.")
        tb.close()
