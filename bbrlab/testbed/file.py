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
(``roles.sender.port``) and what is allowed. Names (user, namespace, interface, domain, the testbed's) and
addresses are plain words that never start with ``-`` (they end up on command lines); paths have no ``..``
and never start with ``-``; an ``experiment_ip`` is one host's unicast address (not ``0.0.0.0``, ``::``,
multicast or broadcast: the run's servers listen on it).
"""

from __future__ import annotations

import ipaddress
import os
import re
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
#: A name or host address in a testbed file: a letter, digit or ``_`` first (never ``-``), then letters, digits,
#: ``_ . : @ % -`` (IPv6 and scoped addresses included), at most 253 characters.
WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@%-]{0,252}")
WORD_ALLOWED = "letters, digits and _ . : @ % - (not first), at most 253 characters, without '..'"


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


def _word(where: str, value: object, what: str) -> str:
    """A name or address (:data:`WORD`): never an option (``-...``) or a path (``/``, ``..``)."""
    text = _str(where, value, f"{what}: {WORD_ALLOWED}")
    if not WORD.fullmatch(text) or ".." in text:
        raise ValidationError(where, value, f"{what}: {WORD_ALLOWED}")
    return text


def _port(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValidationError(where, value, "an integer TCP port 1-65535")
    return value


def _ip(where: str, value: object) -> str:
    """One host's IP address: a run's sshd and iperf3 server listen on it, so an address of every interface
    (``0.0.0.0``, ``::``), a multicast or a broadcast address is refused."""
    allowed = "one host's unicast IPv4 or IPv6 address (not 0.0.0.0, ::, multicast or broadcast)"
    try:
        ip = ipaddress.ip_address(_str(where, value, allowed))
    except ValueError:
        raise ValidationError(where, value, allowed) from None
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise ValidationError(where, value, allowed)
    return str(ip)


def _path(where: str, value: object, base: Path) -> str:
    allowed = "a file path without '..' that does not start with '-'"
    text = _str(where, value, allowed)
    if text.startswith("-") or ".." in Path(text).parts or any(c in text for c in "\n\r\0"):
        raise ValidationError(where, value, allowed)
    p = Path(os.path.expanduser(text))
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
        address=_word(f"{where}.address", raw["address"], "a host name or IP address"),
        port=_port(f"{where}.port", raw.get("port", 22)),
        user=_word(f"{where}.user", raw.get("user", "root"), "a user name"),
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
        return {kind: _word(f"{where}.libvirt_domain", raw[kind], "a libvirt domain name")}
    return {kind: [g.to_file() for g in parse_given_threads(raw[kind], f"{where}.thread_ids")]}


def _parse_ports(where: str, raw: object) -> tuple[str, str]:
    raw = _mapping(where, raw)
    _no_unknown(where, raw, {"sender_side", "receiver_side"})
    for side in ("sender_side", "receiver_side"):
        if side not in raw:
            raise ValidationError(f"{where}.{side}", None, "required: the emulator's interface name")
    a = _word(f"{where}.sender_side", raw["sender_side"], "an interface name")
    b = _word(f"{where}.receiver_side", raw["receiver_side"], "an interface name")
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
        netns = _word(f"{where}.netns", netns, "a network namespace name")
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
    name = _word("name", raw.get("name"), "a testbed name")
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
    """Read and validate a testbed file (one over :data:`bbrlab.core.yamlfile.MAX_FILE_BYTES` is refused
    before it is read)."""
    from bbrlab.core.yamlfile import load_file as load_yaml

    path = Path(path)
    try:
        raw = load_yaml(path, "testbed_file", "testbed file")  # a key given twice is refused too
    except (OSError, UnicodeDecodeError) as e:
        raise ValidationError("testbed_file", str(path),
                              f"a readable YAML file ({getattr(e, 'strerror', None) or e})") from e
    return parse(raw, source=str(path), base=path.parent.resolve())


def write_file(spec: TestbedSpec, path: str | Path) -> None:
    """Write ``spec`` as a testbed file (atomically)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    os.replace(tmp, path)
