"""The testbed file: valid files parse into roles; each wrong field is named in the error."""

from __future__ import annotations

import copy

import pytest
import yaml

from bbrlab.core.errors import ValidationError
from bbrlab.testbed import file as tbfile
from bbrlab.testbed.local.state import check_name
from bbrlab.testbed.roles import from_spec

LAB = {
    "name": "lab1",
    "accelerator": "kvm",
    "roles": {
        "sender": {"address": "192.0.2.10", "port": 2222, "user": "exp", "key": "keys/lab",
                   "known_hosts": "/etc/bbrlab/known_hosts", "experiment_ip": "10.0.0.1",
                   "hypervisor": {"address": "192.0.2.1"}, "vcpu": {"libvirt_domain": "sender-vm"}},
        "emulator": {"address": "192.0.2.11", "ports": {"sender_side": "enp1s0", "receiver_side": "enp2s0"}},
        "receiver": {"address": "192.0.2.12", "experiment_ip": "10.0.0.2"},
    },
}


def _with(path: str, value, base=LAB):
    """A copy of ``base`` with the dotted ``path`` set to ``value`` (or removed for ``...``)."""
    doc = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


def test_lab_file_parses_into_roles(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(LAB))
    spec = tbfile.load_file(path)
    s = spec.roles["sender"]
    assert s.ssh.address == "192.0.2.10" and s.ssh.port == 2222 and s.ssh.user == "exp"
    assert s.ssh.key == str(tmp_path / "keys/lab")  # relative to the file
    assert s.hypervisor.address == "192.0.2.1"
    assert s.vcpu == {"libvirt_domain": "sender-vm"}
    assert spec.roles["emulator"].ports == ("enp1s0", "enp2s0")
    assert spec.roles["receiver"].experiment_ip == "10.0.0.2"
    tb = from_spec(spec)
    assert tb.accelerator == "kvm"
    assert tb.emulator.ports == ("enp1s0", "enp2s0")
    assert tb.receiver.experiment_ip == "10.0.0.2"
    assert tb.sender.host.address == "192.0.2.10" and tb.sender.host.port == 2222
    assert not tb.sender.hypervisor.is_local


def test_defaults_port_user_local_hypervisor_and_ports():
    doc = _with("roles.sender.hypervisor", ...)
    doc = _with("roles.emulator.ports", ..., doc)
    doc = _with("roles.receiver.port", 22, doc)
    spec = tbfile.parse(doc)
    assert spec.roles["sender"].hypervisor is None
    assert spec.roles["emulator"].ports == ("eth1", "eth2")
    assert spec.roles["emulator"].ssh.port == 22 and spec.roles["emulator"].ssh.user == "root"
    assert from_spec(spec).sender.hypervisor.is_local


def test_written_file_reads_back_equal(tmp_path):
    spec = tbfile.parse(LAB, base=tmp_path)
    tbfile.write_file(spec, tmp_path / "out.yaml")
    again = tbfile.load_file(tmp_path / "out.yaml")
    assert again.to_dict() == spec.to_dict()


def test_netns_receiver_is_a_local_namespace_host():
    doc = _with("roles.receiver", {"netns": "bbrlab-x-rx", "experiment_ip": "10.77.0.2"})
    tb = from_spec(tbfile.parse(doc))
    assert tb.receiver.host.netns == "bbrlab-x-rx"
    assert tb.receiver.host.prefix == ("ip", "netns", "exec", "bbrlab-x-rx")


@pytest.mark.parametrize("path,value,field", [
    ("roles.sender.port", 0, "roles.sender.port"),
    ("roles.sender.port", "22", "roles.sender.port"),
    ("roles.sender.port", 70000, "roles.sender.port"),
    ("roles.sender.address", ..., "roles.sender.address"),
    ("roles.sender.address", "", "roles.sender.address"),
    ("roles.sender.user", 5, "roles.sender.user"),
    ("roles.sender.experiment_ip", "10.0.0.300", "roles.sender.experiment_ip"),
    ("roles.sender.vcpu", {"qmp_socket": "/a", "libvirt_domain": "b"}, "roles.sender.vcpu"),
    ("roles.sender.vcpu", {"thread_ids": [12, -3]}, "roles.sender.vcpu.thread_ids[1]"),
    ("roles.sender.vcpu", {"pid": 3}, "roles.sender.vcpu.pid"),
    ("roles.sender.vcpu", {"thread_ids": [12, {"tid": 13, "comm": ""}]}, "roles.sender.vcpu.thread_ids[1].comm"),
    ("roles.sender.vcpu", {"thread_ids": [{"tid": 13, "start_ticks": -1}]},
     "roles.sender.vcpu.thread_ids[0].start_ticks"),
    ("roles.sender.vcpu", {"thread_ids": [12, 12]}, "roles.sender.vcpu.thread_ids"),
    ("roles.sender.hypervisor", {"port": 22}, "roles.sender.hypervisor.address"),
    ("roles.sender.hypervisor", "remote", "roles.sender.hypervisor"),
    ("roles.sender.color", "blue", "roles.sender.color"),
    ("roles.emulator.ports", {"sender_side": "eth1"}, "roles.emulator.ports.receiver_side"),
    ("roles.emulator.ports", {"sender_side": "eth1", "receiver_side": "eth1"},
     "roles.emulator.ports.receiver_side"),
    ("roles.receiver.experiment_ip", ..., "roles.receiver.experiment_ip"),
    ("roles.receiver.netns", "rx", "roles.receiver.netns"),  # netns and SSH fields together
    ("roles.emulator", ..., "roles.emulator"),
    ("roles.emulator", "host1", "roles.emulator"),
    ("roles.extra", {}, "roles.extra"),
    ("accelerator", "hvf", "accelerator"),
    ("name", ..., "name"),
])
def test_each_wrong_field_is_named(path, value, field):
    with pytest.raises(ValidationError) as err:
        tbfile.parse(_with(path, value))
    assert err.value.field == field
    assert field in str(err.value) and "not allowed" in str(err.value)


def test_unreadable_and_invalid_yaml_files_are_named(tmp_path):
    with pytest.raises(ValidationError, match="testbed_file"):
        tbfile.load_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("roles: [unclosed\n")
    with pytest.raises(ValidationError, match="valid YAML"):
        tbfile.load_file(bad)


@pytest.mark.parametrize("name", ["", "Local", "1lab", "a" * 13, "lab_1", "lab 1", None])
def test_testbed_names_are_short_and_plain(name):
    with pytest.raises(ValidationError, match="testbed.name"):
        check_name(name)


def test_vcpu_count_is_checked_before_anything_changes():
    from bbrlab.testbed.local.lifecycle import check_vcpus

    assert check_vcpus(2) == 2
    for bad in (0, 9, "1", True, 1.0):
        with pytest.raises(ValidationError, match="sender_vcpus"):
            check_vcpus(bad)


def test_hand_given_threads_keep_what_the_file_says_about_them(tmp_path):
    doc = _with("roles.sender.vcpu", {"thread_ids": [4242, {"tid": 4243, "comm": "EMT-1", "pid": 4200}]})
    spec = tbfile.parse(doc, base=tmp_path)
    assert spec.roles["sender"].vcpu == {"thread_ids": [4242, {"tid": 4243, "comm": "EMT-1", "pid": 4200}]}
    path = tmp_path / "again.yaml"
    tbfile.write_file(spec, path)
    assert tbfile.load_file(path).roles["sender"].vcpu == spec.roles["sender"].vcpu
    assert from_spec(spec).sender.pin_path.name == "vcpu-pins.json"
    assert from_spec(tbfile.parse(LAB, base=tmp_path)).sender.pin_path is None  # libvirt names its own threads
