"""The testbed file: which hosts play sender, emulator and receiver, and how to reach them.

A YAML file (the local testbed writes one of the same form, so one code path drives both)::

    name: lab1
    accelerator: kvm            # optional: kvm | tcg | unknown (recorded in every run)
    roles:
      sender:
        address: 192.0.2.10     # SSH: address, port (22), user (root), key, known_hosts
        key: ~/.ssh/lab_ed25519
        known_hosts: ~/.ssh/known_hosts
        experiment_ip: 10.0.0.1
        hypervisor: local       # or {address, port, user, key, known_hosts}: where its QEMU runs
        vcpu: {qmp_socket: /run/vm1.qmp}   # or {libvirt_domain: vm1} or {thread_ids: [1234]}
                                           # (an entry may be {tid: 1234, comm: EMT-0, pid: .., start_ticks: ..})
      emulator:
        address: 192.0.2.11
        ports: {sender_side: eth1, receiver_side: eth2}
      receiver:
        address: 192.0.2.12     # or, on this machine only: netns: <namespace>
        experiment_ip: 10.0.0.2 # the address iperf3 connects to

Every field is checked; a wrong one raises :class:`~bbrlab.core.errors.ValidationError` naming it
(``roles.sender.port``) and what is allowed.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bbrlab.core.errors import ValidationError
from bbrlab.core.giventhreads import parse_given_threads

ROLES = ("sender", "emulator", "receiver")
ACCELERATORS = ("kvm", "tcg", "unknown")
SSH_FIELDS = {"address", "port", "user", "key", "known_hosts"}
ROLE_FIELDS = {
    "sender": SSH_FIELDS | {"experiment_ip", "hypervisor", "vcpu"},
    "emulator": SSH_FIELDS | {"ports", "experiment_ip"},
    "receiver": SSH_FIELDS | {"experiment_ip", "netns"},
}
VCPU_KINDS = ("qmp_socket", "libvirt_domain", "thread_ids")


@dataclass(frozen=True)
class SSHSpec:
    """How to reach a host over SSH (fabric)."""

    address: str
    port: int = 22
    user: str = "root"
    key: str | None = None
    known_hosts: str | None = None

    def to_dict(self) -> dict:
        """The fields that are set (None left out), as a role's SSH keys in the testbed file."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class RoleSpec:
    """One role as the file gives it. ``ssh`` is None for a local network namespace (``netns``)."""

    role: str
    ssh: SSHSpec | None
    netns: str | None = None
    experiment_ip: str | None = None
    hypervisor: SSHSpec | None = None  # sender only; None = this machine ("local")
    vcpu: dict = field(default_factory=dict)  # sender only: one of VCPU_KINDS
    ports: tuple[str, str] = ("eth1", "eth2")  # emulator only: (sender_side, receiver_side)


@dataclass(frozen=True)
class TestbedSpec:
    """A validated testbed file: its ``name``, ``accelerator`` and the three roles by name; ``source`` is the
    file it was read from ("" when made in code)."""
    name: str
    accelerator: str
    roles: dict[str, RoleSpec]
    source: str = ""

    def to_dict(self) -> dict:
        """The spec in the testbed file's YAML form, as :func:`write_file` writes it (``source`` left out)."""
        return {"name": self.name, "accelerator": self.accelerator,
                "roles": {r: _role_to_dict(s) for r, s in self.roles.items()}}


def _role_to_dict(s: RoleSpec) -> dict:
    out: dict = dict(s.ssh.to_dict()) if s.ssh else {"netns": s.netns}
    if s.experiment_ip:
        out["experiment_ip"] = s.experiment_ip
    if s.role == "sender":
        out["hypervisor"] = s.hypervisor.to_dict() if s.hypervisor else "local"
        if s.vcpu:
            out["vcpu"] = dict(s.vcpu)
    if s.role == "emulator":
        out["ports"] = {"sender_side": s.ports[0], "receiver_side": s.ports[1]}
    return out


# -- field checks ---------------------------------------------------------------------------------
def _str(where: str, value: object, allowed: str = "a non-empty string") -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(where, value, allowed)
    return value.strip()


def _port(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValidationError(where, value, "an integer TCP port 1-65535")
    return value


def _ip(where: str, value: object) -> str:
    try:
        return str(ipaddress.ip_address(_str(where, value, "an IPv4 or IPv6 address")))
    except ValueError:
        raise ValidationError(where, value, "an IPv4 or IPv6 address") from None


def _path(where: str, value: object, base: Path) -> str:
    p = Path(os.path.expanduser(_str(where, value, "a file path")))
    return str(p if p.is_absolute() else base / p)


def _mapping(where: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise ValidationError(where, value, "a mapping of fields")
    return value


def _no_unknown(where: str, raw: dict, allowed: set[str]) -> None:
    for key in raw:
        if key not in allowed:
            raise ValidationError(f"{where}.{key}", raw[key], f"a known field: {', '.join(sorted(allowed))}")


def parse_ssh(where: str, raw: dict, base: Path) -> SSHSpec:
    """The SSH fields of mapping ``raw`` (``address`` required; port 22 and user root by default), with a
    relative ``key`` or ``known_hosts`` taken from ``base``; raises
    :class:`~bbrlab.core.errors.ValidationError` naming ``<where>.<field>``."""
    if "address" not in raw:
        raise ValidationError(f"{where}.address", None, "required: the host name or IP address to SSH to")
    return SSHSpec(
        address=_str(f"{where}.address", raw["address"], "a host name or IP address"),
        port=_port(f"{where}.port", raw.get("port", 22)),
        user=_str(f"{where}.user", raw.get("user", "root"), "a user name"),
        key=_path(f"{where}.key", raw["key"], base) if raw.get("key") is not None else None,
        known_hosts=(_path(f"{where}.known_hosts", raw["known_hosts"], base)
                     if raw.get("known_hosts") is not None else None),
    )


def _parse_vcpu(where: str, raw: object, base: Path) -> dict:
    raw = _mapping(where, raw)
    kinds = [k for k in raw if k in VCPU_KINDS]
    _no_unknown(where, raw, set(VCPU_KINDS))
    if len(kinds) != 1:
        raise ValidationError(where, raw, f"exactly one of {', '.join(VCPU_KINDS)}")
    kind = kinds[0]
    if kind == "qmp_socket":
        return {kind: _path(f"{where}.qmp_socket", raw[kind], base)}
    if kind == "libvirt_domain":
        return {kind: _str(f"{where}.libvirt_domain", raw[kind], "a libvirt domain name")}
    return {kind: [g.to_file() for g in parse_given_threads(raw[kind], f"{where}.thread_ids")]}


def _parse_ports(where: str, raw: object) -> tuple[str, str]:
    raw = _mapping(where, raw)
    _no_unknown(where, raw, {"sender_side", "receiver_side"})
    for side in ("sender_side", "receiver_side"):
        if side not in raw:
            raise ValidationError(f"{where}.{side}", None, "required: the emulator's interface name")
    a = _str(f"{where}.sender_side", raw["sender_side"], "an interface name")
    b = _str(f"{where}.receiver_side", raw["receiver_side"], "an interface name")
    if a == b:
        raise ValidationError(f"{where}.receiver_side", b, "an interface other than sender_side")
    return a, b


def parse_role(role: str, raw: object, base: Path) -> RoleSpec:
    """Role ``role``'s mapping from the file as a :class:`RoleSpec`: SSH fields or a ``netns``, plus what only
    that role has (the sender's ``hypervisor`` and ``vcpu``, the emulator's ``ports``); raises
    :class:`~bbrlab.core.errors.ValidationError` naming ``roles.<role>.<field>``."""
    where = f"roles.{role}"
    raw = _mapping(where, raw)
    _no_unknown(where, raw, ROLE_FIELDS[role])
    netns = raw.get("netns")
    if netns is not None:
        if any(k in raw for k in SSH_FIELDS):
            raise ValidationError(f"{where}.netns", netns, "either netns or SSH fields (address, ...), not both")
        ssh = None
        netns = _str(f"{where}.netns", netns, "a network namespace name")
    else:
        ssh = parse_ssh(where, raw, base)
    ip = raw.get("experiment_ip")
    if role == "receiver" and ip is None:
        raise ValidationError(f"{where}.experiment_ip", None, "required: the address iperf3 connects to")
    kw: dict = {}
    if role == "sender":
        hyp = raw.get("hypervisor", "local")
        if hyp != "local":
            kw["hypervisor"] = parse_ssh(f"{where}.hypervisor", _mapping(f"{where}.hypervisor", hyp), base)
        if "vcpu" in raw:
            kw["vcpu"] = _parse_vcpu(f"{where}.vcpu", raw["vcpu"], base)
    if role == "emulator" and "ports" in raw:
        kw["ports"] = _parse_ports(f"{where}.ports", raw["ports"])
    return RoleSpec(role=role, ssh=ssh, netns=netns,
                    experiment_ip=_ip(f"{where}.experiment_ip", ip) if ip is not None else None, **kw)


def parse(raw: object, source: str = "", base: Path | None = None) -> TestbedSpec:
    """Validate a loaded YAML document; relative paths are taken from ``base``."""
    base = base or Path.cwd()
    raw = _mapping("testbed", raw)
    _no_unknown("testbed", raw, {"name", "accelerator", "roles"})
    name = _str("name", raw.get("name"), "a testbed name")
    accel = raw.get("accelerator", "unknown")
    if accel not in ACCELERATORS:
        raise ValidationError("accelerator", accel, f"one of {', '.join(ACCELERATORS)}")
    roles_raw = _mapping("roles", raw.get("roles"))
    _no_unknown("roles", roles_raw, set(ROLES))
    roles = {}
    for role in ROLES:
        if role not in roles_raw:
            raise ValidationError(f"roles.{role}", None, "required: every testbed has sender, emulator, receiver")
        roles[role] = parse_role(role, roles_raw[role], base)
    return TestbedSpec(name=name, accelerator=accel, roles=roles, source=source)


def load_file(path: str | Path) -> TestbedSpec:
    """Read and validate a testbed file."""
    from bbrlab.core.yamlfile import load_text

    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValidationError("testbed_file", str(path),
                              f"a readable YAML file ({getattr(e, 'strerror', None) or e})") from e
    raw = load_text(text, str(path), field="testbed_file")  # a key given twice is refused too
    return parse(raw, source=str(path), base=path.parent.resolve())


def write_file(spec: TestbedSpec, path: str | Path) -> None:
    """Write ``spec`` as a testbed file (atomically)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    os.replace(tmp, path)
