"""``metadata.testbed`` typed (bbrlab.testbed.record): every committed form reads with its keys and their order
kept, the machine reads as attributes or as the error it was, and a testbed's record is built in the order the
run writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bbrlab.core import machine
from bbrlab.core.machine import Machine
from bbrlab.kernel.sender import SenderKernel
from bbrlab.run.runrecord import RunRecord
from bbrlab.testbed import roles
from bbrlab.testbed.record import MachineUnreachable, TestbedRecord
from tests.unit.testbed.test_testbed_file import LAB

ROOT = Path(__file__).resolve().parents[3]
RECORDS = sorted([*ROOT.glob("data/**/record.json"), *ROOT.glob("tests/fixtures/**/record.json")])


def _testbeds() -> dict[tuple[str, ...], dict]:
    """One committed ``metadata.testbed`` of each layout (its keys in order)."""
    out: dict[tuple[str, ...], dict] = {}
    for path in RECORDS:
        testbed = json.loads(path.read_text())["metadata"]["testbed"]
        out.setdefault(tuple(testbed), testbed)
    return out


def test_every_committed_layout_reads_typed_and_writes_back_its_keys_in_their_order():
    layouts = _testbeds()
    assert len(layouts) >= 4  # with and without the machine, without the kernel's identity, bbrlab.run/1's
    for keys, stored in layouts.items():
        typed = TestbedRecord.from_dict(stored)
        assert typed.keys == keys and json.dumps(typed.to_dict()) == json.dumps(stored)


def test_a_current_record_reads_its_machine_and_kernel_as_attributes():
    stored = next(t for keys, t in _testbeds().items() if "machine" in keys)
    typed = TestbedRecord.from_dict(stored)
    assert isinstance(typed.machine, Machine) and typed.machine.cpu_model == stored["machine"]["cpu_model"]
    assert typed.machine.label == stored["machine"]["label"] and typed.accelerator == stored["accelerator"]
    assert isinstance(typed.sender_kernel_identity, SenderKernel)
    assert typed.sender_kernel_identity.sha256 == stored["sender_kernel_identity"]["sha256"]


def test_keys_an_older_record_lacks_read_none_and_stay_absent():
    stored = next(t for keys, t in _testbeds().items() if "machine" not in keys and "note" not in keys)
    typed = TestbedRecord.from_dict(stored)
    assert typed.machine is None and typed.emulator_boot_id is None
    assert "machine" not in typed.to_dict() and "emulator_boot_id" not in typed.to_dict()
    schema_1 = next(t for keys, t in _testbeds().items() if "note" in keys)
    assert TestbedRecord.from_dict(schema_1).note == schema_1["note"]


def test_a_null_key_stays_null_and_an_unreachable_machine_reads_as_its_error():
    stored = {"name": "lab1", "machine": {"error": "unreachable: timed out"}, "emulator_boot_id": None}
    typed = TestbedRecord.from_dict(stored)
    assert typed.machine == MachineUnreachable("unreachable: timed out")
    assert typed.machine.label is None and typed.machine.machine_id is None and typed.machine.boot_id is None
    assert typed.to_dict() == stored and list(typed.to_dict()) == list(stored)


def test_an_unknown_key_is_refused_and_an_empty_testbed_is_written_empty():
    with pytest.raises(ValueError, match="qemu_version"):
        TestbedRecord.from_dict({"name": "x", "qemu_version": "7.2"})
    with pytest.raises(TypeError, match="surprise"):
        TestbedRecord().update(surprise=1)
    assert TestbedRecord().to_dict() == {} and TestbedRecord.from_dict({}).name is None


def test_the_runner_s_update_keeps_the_order_a_dict_s_would():
    typed = TestbedRecord.of(name="lab1", sender_kernel="6.1.0")
    typed.update(sender_kernel="6.12.0", sender_boot_id="b")
    assert list(typed.to_dict().items()) == [("name", "lab1"), ("sender_kernel", "6.12.0"), ("sender_boot_id", "b")]


def test_a_run_record_s_testbed_is_typed():
    path = next(p for p in RECORDS if "machine" in json.loads(p.read_text())["metadata"]["testbed"])
    stored = json.loads(path.read_text())
    typed = RunRecord.from_json(stored)
    assert isinstance(typed.metadata.testbed, TestbedRecord)
    assert typed.metadata.testbed.sender_boot_id == stored["metadata"]["testbed"]["sender_boot_id"]
    assert typed.to_dict()["metadata"]["testbed"] == stored["metadata"]["testbed"]


def test_a_lab_s_record_is_built_in_the_order_runs_wrote_it(tmp_path, monkeypatch):
    from bbrlab.testbed import file as tbfile

    def unreachable(host):
        raise OSError("no route to host")

    monkeypatch.setattr(machine, "measure", unreachable)
    monkeypatch.setattr(roles.Role, "kernel_release", lambda self: f"6.1.0-{self.name}")
    tb = roles.from_spec(tbfile.parse(LAB, base=tmp_path))
    typed = tb.record()
    assert typed.keys == ("name", "kind", "accelerator", "hypervisor", "host_kernel", "machine", "sender_kernel",
                          "emulator_kernel", "receiver_kernel")
    assert typed.machine == MachineUnreachable("unreachable: no route to host")
    assert typed.receiver_kernel == "6.1.0-receiver" and typed.hypervisor == "libvirt"
    assert tb.describe() == typed.to_dict() and tb.describe()["machine"] == {"error": "unreachable: no route to host"}


def test_a_local_testbed_s_details_are_keys_of_the_record():
    from dataclasses import fields

    details = roles.LocalDetails(image="img", sender_vcpus=2, qemu_pids={"sender": 7})
    typed = TestbedRecord.of(**{f.name: getattr(details, f.name) for f in fields(details)})
    assert typed.sender_vcpus == 2 and typed.to_dict()["qemu_pids"] == {"sender": 7}
    assert typed.to_dict()["sender_kernel_identity"] is None
