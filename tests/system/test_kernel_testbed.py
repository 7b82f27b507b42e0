"""bbr2b in the local testbed's sender guest: loaded beside stock bbr, parameters live in sysfs,
and the behaviour the paper describes visible in ss samples under CPU contention.

Everything here is real: the module is built on this machine against the guest kernel's headers,
copied over SSH, insmod'ed in the guest; flows go sender VM -> emulator VM -> receiver.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.kernel import (
    DEFAULT_PATCH,
    DEFICIT_PARAMS,
    ModuleLoadError,
    available_ccas,
    build_module,
    default_headers_dir,
    ensure_bbr2b,
    load,
    loaded_srcversion,
    read_params,
    set_params,
)
from bbrlab.sampling.ss import parse_ss_log
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

pytestmark = [pytest.mark.system, pytest.mark.testbed]

DEFAULTS = {name: spec.default for name, spec in DEFICIT_PARAMS.items()}
HIGH_GAIN = 739 / 256  # what ss prints as pacing_gain:2.88672


def test_testbed_up_loaded_bbr2b_beside_bbr(testbed):
    """`testbed up` builds and loads the patched module by itself (runs before this file loads it)."""
    available = testbed.sender.host.read_text("/proc/sys/net/ipv4/tcp_available_congestion_control").split()
    assert {"bbr", "bbr2b"} <= set(available)


@pytest.fixture(scope="module")
def sender(testbed):
    host = testbed.sender.host
    ensure_bbr2b(host)
    host.run(["modprobe", "tcp_bbr"], sudo=True)  # stock bbr, beside it
    yield host
    set_params(host, "bbr2b", **DEFAULTS)


def test_bbr2b_loads_beside_stock_bbr(sender):
    identity = ensure_bbr2b(sender)
    ccas = available_ccas(sender)
    assert "bbr" in ccas and "bbr2b" in ccas
    assert identity["name"] == "bbr2b"
    assert identity["srcversion"] == sender.output(["cat", "/sys/module/bbr2b/srcversion"]) != ""
    assert identity["patch_sha256"] == hashlib.sha256(DEFAULT_PATCH.read_bytes()).hexdigest()
    assert identity["params"] == DEFAULTS
    assert "O" in identity["taint"]  # out-of-tree; Debian does not force signatures
    print("bbr2b identity in the guest:", json.dumps(identity))


def test_loading_again_changes_nothing(sender):
    set_params(sender, "bbr2b", deficit_gain=900)  # a reload would reset this to the default
    try:
        again = ensure_bbr2b(sender)
        assert again["params"]["deficit_gain"] == 900
    finally:
        set_params(sender, "bbr2b", deficit_gain=DEFAULTS["deficit_gain"])


def test_parameters_are_changeable_and_bounded(sender):
    try:
        after = set_params(sender, "bbr2b", deficit_gain=1000, deficit_enable=0)
        assert after["deficit_gain"] == 1000 and after["deficit_enable"] == 0
        assert read_params(sender, "bbr2b")["deficit_gain"] == "1000"
        # bbrlab refuses before writing; the kernel refuses on its own too
        with pytest.raises(ValidationError, match=r"params.deficit_gain .*0\.\.1023"):
            set_params(sender, "bbr2b", deficit_gain=2000, deficit_enable=1)
        assert read_params(sender, "bbr2b")["deficit_enable"] == "0"
        direct = sender.run(["sh", "-c", "echo 2000 > /sys/module/bbr2b/parameters/deficit_gain"], check=False)
        assert not direct.ok
        assert read_params(sender, "bbr2b")["deficit_gain"] == "1000"
    finally:
        set_params(sender, "bbr2b", **DEFAULTS)


def _other_build(sender, tmp_path):
    """bbr2b from a slightly different patch (a comment changed): same name, another srcversion."""
    text = DEFAULT_PATCH.read_text()
    changed = text.replace("do not call it a deficit */", "do not call it a deficit (v2) */", 1)
    assert changed != text
    patch = tmp_path / "variant" / "inflight-deficit.patch"
    patch.parent.mkdir()
    patch.write_text(changed)
    (patch.parent / "SOURCE.sha256").write_text((DEFAULT_PATCH.parent / "SOURCE.sha256").read_text())
    release = sender.output(["uname", "-r"])
    return build_module(patch, default_headers_dir(release), tmp_path / "out")


def test_another_build_replaces_an_unused_one_and_is_refused_while_in_use(sender, tmp_path):
    original = ensure_bbr2b(sender)
    other = _other_build(sender, tmp_path)
    assert other.srcversion != original["srcversion"]
    try:
        replaced = load(sender, other)
        assert replaced["srcversion"] == other.srcversion == loaded_srcversion(sender, "bbr2b")
        assert replaced["patch_sha256"] == other.patch_sha256
        # the default congestion control holds a module reference: bbr2b is "in use"
        previous = sender.output(["sysctl", "-n", "net.ipv4.tcp_congestion_control"])
        sender.run(["sysctl", "-w", "net.ipv4.tcp_congestion_control=bbr2b"])
        try:
            with pytest.raises(ModuleLoadError, match="in use"):
                ensure_bbr2b(sender)
            assert loaded_srcversion(sender, "bbr2b") == other.srcversion  # nothing changed
        finally:
            sender.run(["sysctl", "-w", f"net.ipv4.tcp_congestion_control={previous}"])
    finally:
        back = ensure_bbr2b(sender)
    assert back["srcversion"] == original["srcversion"] and back["params"] == DEFAULTS


# -- behaviour: pacing_gain at the deficit gain while inflight < BDP, under contention ---------------

def _probe_bw_samples(testbed, tmp_path, cca: str, tag: str) -> list[dict]:
    """ss samples of one contended run in steady state (cwnd_gain 2 = PROBE_BW; STARTUP has 2.89)."""
    from bbrlab.run.runner import run_once

    scenario = Scenario(Link(rtt_ms=20, rate_mbit=100), Contention(timeslice_ms=1, cpu_share_pct=25),
                        Flow(cca=cca, params=IperfParams(duration_s=10), sample_ms=100, sampler="ss"))
    record = run_once(testbed, scenario, tmp_path / tag)
    if record["status"] != "ok" and "SsFieldsMissing" in (record["reason"] or "") and "bw:0bps" in record["reason"]:
        # A sample taken before BBR's first ACK has no gains yet (ss omits zero gains) and the runner's
        # check refuses it; that is the sampler's business, not this test's: run once more.
        record = run_once(testbed, scenario, tmp_path / f"{tag}-again")
        tag = f"{tag}-again"
    assert record["status"] == "ok", record["reason"]
    if cca == "bbr2b":
        assert record["metadata"]["module"]["srcversion"]
    rows = parse_ss_log((tmp_path / tag / "ss.log").read_text(),
                                 check=False)
    return [r for r in rows if r.get("cwnd_gain") == 2 and r.get("pacing_gain") is not None]


def _deficit_samples(rows: list[dict], gain: float) -> list[dict]:
    return [r for r in rows if abs(r["pacing_gain"] - gain) < 0.01
            and r.get("inflight_bdp") is not None and r["inflight_bdp"] < 1]


def test_bbr2b_paces_at_high_gain_below_bdp_and_stock_bbr_does_not(testbed, sender, tmp_path):
    """The patch's behaviour at its defaults: two contended runs (1 ms / 25 %, 100 Mbit/s, 10 s, ss every 100 ms).
    What its parameters change is the slow test below."""
    patched = _probe_bw_samples(testbed, tmp_path, "bbr2b", "bbr2b")
    stock = _probe_bw_samples(testbed, tmp_path, "bbr", "bbr")
    counts = {name: (len(_deficit_samples(rows, HIGH_GAIN)), len(rows)) for name, rows in (("bbr2b", patched),
                                                                                          ("bbr", stock))}
    print("PROBE_BW samples (at 2.89 below BDP, all):", counts)
    assert patched and stock, counts
    assert counts["bbr2b"][0] > 0
    assert counts["bbr"][0] == 0


@pytest.mark.slow
def test_bbr2b_parameters_change_the_deficit_gain_and_switch_it_off(testbed, sender, tmp_path):
    """``deficit_gain=1000`` paces at 1000/256 below BDP instead of 2.89, ``deficit_enable=0`` at neither: two more
    contended runs (make test-slow; make test checks the parameters are set and bounded, and the default gain's
    effect, above)."""
    set_params(sender, "bbr2b", deficit_gain=1000)
    try:
        higher = _probe_bw_samples(testbed, tmp_path, "bbr2b", "bbr2b-g1000")
        set_params(sender, "bbr2b", deficit_enable=0)
        disabled = _probe_bw_samples(testbed, tmp_path, "bbr2b", "bbr2b-off")
    finally:
        set_params(sender, "bbr2b", **DEFAULTS)
    counts = {name: (len(_deficit_samples(rows, HIGH_GAIN)), len(_deficit_samples(rows, 1000 / 256)), len(rows))
              for name, rows in (("bbr2b gain 1000", higher), ("bbr2b disabled", disabled))}
    print("PROBE_BW samples (at 2.89 below BDP, at 3.91 below BDP, all):", counts)
    assert higher and disabled, counts
    assert counts["bbr2b gain 1000"][1] > 0 and counts["bbr2b gain 1000"][0] == 0
    assert counts["bbr2b disabled"][0] == 0 and counts["bbr2b disabled"][1] == 0


def test_the_identity_of_a_module_not_loaded_is_refused_by_name(sender):
    """module_identity reads sysfs and bbrlab's build record in one command; a module that is not loaded (its
    sysfs directory absent) is an error naming it, not an identity of empty fields."""
    from bbrlab.core.errors import TestbedError
    from bbrlab.kernel import module_identity

    with pytest.raises(TestbedError, match="module bbrlab_absent is not loaded"):
        module_identity(sender, "bbrlab_absent")
    assert module_identity(sender, "bbr2b")["taint"] == sender.output(["cat", "/sys/module/bbr2b/taint"])
