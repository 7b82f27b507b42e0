"""Run identity: BBR version and patch from what a record or the authors' meta.json says."""

import json
from pathlib import Path

import pytest

from bbrlab.analysis import identity
from bbrlab.kernel import ModuleIdentity
from bbrlab.run.runmeta import CcaUse, RunMetadata
from bbrlab.run.runrecord import RunRecord
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario
from bbrlab.testbed.record import TestbedRecord

DATA = Path(__file__).parents[3] / "data"


def record(cca, module=None, kernel="6.1.0-56-amd64", **said):
    """(scenario, metadata) of a run of ``cca``; without ``said``, its cca states no BBR version (older records)."""
    meta = RunMetadata(testbed=TestbedRecord(sender_kernel=kernel), cca=CcaUse(cca, **said), module=module)
    return Scenario(Link(20, 100), Contention(1, 100), Flow(cca)), meta


BBR2B = ModuleIdentity("bbr2b", patch_sha256="e58b", source_sha256="d808", params={"deficit_gain": 739})


def test_record_fields_win_when_present():
    ident = identity.from_record(*record("bbr", bbr_version=3, patched=False, kernel="6.13.0-bbrv3"))
    assert (ident.bbr_version, ident.patched, ident.variant) == (3, False, "BBRv3")
    assert identity.from_record(*record("cubic", bbr_version=None, patched=False)).variant == "Cubic"


@pytest.mark.parametrize(("cca", "module", "kernel", "variant"), [
    ("bbr", None, "6.1.0-56-amd64", "BBRv1"),
    ("bbr2b", BBR2B, "6.1.0-56-amd64", "BBRv1 patched"),
    ("cubic", None, "6.1.0-56-amd64", "Cubic"),
    ("cubic", BBR2B, "6.1.0-56-amd64", "Cubic"),          # a module named for another CCA says nothing
    ("bbr", None, "6.13.7-bbrv3", "BBRv3"),               # bbrlab's v3 recipe: LOCALVERSION -bbrv3
    ("bbr2b", BBR2B, "6.13.7-bbrv3", "BBRv3 patched"),
    ("bbr", None, "6.18.44-fc-v669", "BBRv1"),            # mainline ships BBRv1
])
def test_fallback_for_older_records(cca, module, kernel, variant):
    assert identity.from_record(*record(cca, module, kernel)).variant == variant


def test_every_record_in_data_gets_a_version_from_its_module_and_kernel():
    for path in DATA.glob("*/runs/*/record.json"):
        rec = json.loads(path.read_text())
        typed = RunRecord.from_json(rec)
        ident = identity.from_record(typed.scenario, typed.metadata)
        cca = rec["scenario"]["flow"]["cca"]
        expected = {"bbr": "BBRv1", "bbr2b": "BBRv1 patched", "cubic": "Cubic"}[cca]
        # the kernel the sender ran, as the run read it (data/poster-fig2-local also holds 5.10 and 6.12)
        assert ident.variant == expected and ident.kernel == rec["metadata"]["testbed"]["sender_kernel"]
        assert ident.kernel.startswith(("5.10.", "6.1.", "6.12."))


@pytest.mark.parametrize(("cca", "kernel", "version", "patched", "variant"), [
    ("bbr", "kernel6-1", 1, False, "BBRv1"),
    ("bbr", "BBRv3", 3, False, "BBRv3"),
    ("bbr1", "BBRv3", 1, False, "BBRv1"),
    ("bbr", "BBRv3_fixed", 3, True, "BBRv3 patched"),
    ("bbr1", "BBRv3_fixed", 1, True, "BBRv1 patched"),
    ("bbr", "kernel6-1_fixed", 1, True, "BBRv1 patched"),
    ("bbr", "BBRv3_fixed_new", 3, True, "BBRv3 patched (new)"),
    ("bbr2", "BBRv2", 2, False, "BBRv2"),
    ("bbr", "BBRv2", 1, False, "BBRv1"),
    ("cubic", "BBRv3_fixed", None, False, "Cubic"),
])
def test_authors_identity_follows_their_parser(cca, kernel, version, patched, variant):
    ident = identity.from_authors(cca, kernel)
    assert (ident.bbr_version, ident.patched, ident.variant) == (version, patched, variant)


def test_socket_log_names():
    ident, share, rep = identity.from_socket_log_name("ss_patched_25_scheduling_bbr3")
    assert (ident.variant, share, rep) == ("BBRv3 patched", 25.0, 0)
    ident, share, rep = identity.from_socket_log_name("ss_25_scheduling_bbr2_2")
    assert (ident.variant, share, rep) == ("BBRv2", 25.0, 2)
    assert identity.from_socket_log_name("ss_no_scheduling_bbr1")[1] == 100.0
    assert identity.from_socket_log_name("notes") is None


def test_labels():
    assert identity.variant_label("bbr", None, False) == "BBR (version unknown)"
    assert identity.variant_label("reno", None, False) == "Reno"
