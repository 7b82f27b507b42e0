"""The roles of a testbed as objects: each role is a host to run commands on, plus what it is for.

Built from a validated :class:`~bbrlab.testbed.file.TestbedSpec`, so the local testbed and a real
lab are driven by the same code::

    tb.sender.host.run(["uname", "-r"])         # an SSHHost (fabric), or a NetnsHost locally
    tb.sender.vcpu_threads()                    # vCPU thread ids, from QMP / libvirt / the file
    tb.emulator.ports                           # ("eth1", "eth2"): sender side, receiver side
    tb.receiver.experiment_ip                   # where iperf3 connects
"""

from __future__ import annotations

import hashlib
import platform
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from bbrlab.contention.threadstat import ThreadIdentity
from bbrlab.contention.vcpu import (
    libvirt_vcpu_threads,
    pin_given_threads,
    qmp_vcpu_threads,
    qmp_vcpu_threads_remote,
)
from bbrlab.core import machine
from bbrlab.core.errors import TestbedError
from bbrlab.core.giventhreads import parse_given_threads
from bbrlab.core.hosts import Host, LocalHost, NetnsHost, SSHHost
from bbrlab.kernel.sender import SenderKernel

from .file import RoleSpec, SSHSpec, TestbedSpec
from .record import MachineUnreachable, TestbedRecord

GIVEN_THREADS_FIELD = "roles.sender.vcpu.thread_ids"


def ssh_host(name: str, spec: SSHSpec) -> SSHHost:
    """An :class:`~bbrlab.core.hosts.SSHHost` called ``name`` for the SSH fields ``spec`` (its host key pinned
    from their ``known_hosts``)."""
    return SSHHost(name=name, address=spec.address, user=spec.user, port=spec.port, key_path=spec.key,
                   known_hosts=spec.known_hosts)


def role_host(spec: RoleSpec) -> Host:
    """The host a role's commands run on: a :class:`~bbrlab.core.hosts.NetnsHost` for a ``netns`` role, else
    an SSH host named after the role."""
    if spec.ssh is None:
        return NetnsHost(name=spec.role, netns=spec.netns or "")
    return ssh_host(spec.role, spec.ssh)


@dataclass
class Role:
    """One role: ``name`` (sender/emulator/receiver), ``host`` to run commands on."""

    name: str
    host: Host
    experiment_ip: str | None = None
    spec: RoleSpec | None = field(default=None, repr=False)

    def kernel_release(self) -> str:
        """The role's kernel release (``uname -r``, 20 s timeout); raises when the host does not answer."""
        return self.host.output(["uname", "-r"], timeout=20)


@dataclass
class SenderRole(Role):
    """The sender VM; ``hypervisor`` is the host its QEMU runs on (contention is applied there)."""

    hypervisor: Host = field(default_factory=LocalHost)
    vcpu: dict = field(default_factory=dict)
    #: Where the pins of hand-given thread ids are kept (:func:`vcpu_pin_path`); None: none given.
    pin_path: Path | None = None

    def vcpu_threads(self) -> list[int]:
        """The VM's vCPU thread ids on the hypervisor host, sorted by vCPU index (never guessed).

        Hand-given ids are checked against their pins first (:meth:`vcpu_pins`)."""
        if "qmp_socket" in self.vcpu:
            if self.hypervisor.is_local:
                return qmp_vcpu_threads(self.vcpu["qmp_socket"])
            return qmp_vcpu_threads_remote(self.hypervisor, self.vcpu["qmp_socket"])
        if "libvirt_domain" in self.vcpu:
            return libvirt_vcpu_threads(self.hypervisor, self.vcpu["libvirt_domain"])
        if "thread_ids" in self.vcpu:
            return list(self.vcpu_pins())
        raise TestbedError("the testbed file gives no roles.sender.vcpu (qmp_socket, libvirt_domain or "
                           "thread_ids): cannot find the sender's vCPU threads")

    def vcpu_pins(self) -> dict[int, ThreadIdentity] | None:
        """Hand-given vCPU thread ids, each checked now against the thread it is pinned to (pinned at the
        first call: :func:`bbrlab.contention.vcpu.pin_given_threads`); None when the threads are found through QMP or
        libvirt, which name the VM's threads themselves."""
        if "thread_ids" not in self.vcpu:
            return None
        if self.pin_path is None:
            raise TestbedError("hand-given vCPU thread ids need a place for their pins (SenderRole.pin_path)")
        given = parse_given_threads(self.vcpu["thread_ids"], GIVEN_THREADS_FIELD)
        return pin_given_threads(self.hypervisor, given, self.pin_path, GIVEN_THREADS_FIELD)

    def qemu_pid(self) -> int | None:
        """The pid of the sender's QEMU on a local hypervisor (owner of the vCPU threads), else None."""
        if not self.hypervisor.is_local:
            return None
        threads = self.vcpu_threads()
        try:
            with open(f"/proc/{threads[0]}/status") as f:
                for line in f:
                    if line.startswith("Tgid:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None


@dataclass
class EmulatorRole(Role):
    """The emulator: bridges sender and receiver; netem + token bucket go on ``ports``' egress."""

    ports: tuple[str, str] = ("eth1", "eth2")


@dataclass(frozen=True)
class LocalDetails:
    """How a local testbed was started, from its state: the guest image, its kernel, the sender's vCPUs,
    and how long each VM took from QEMU's start to answering SSH."""

    image: str | None = None
    guest_kernel: str | None = None
    sender_vcpus: int | None = None
    boot_to_ssh_s: dict = field(default_factory=dict)
    #: The sender's kernel as booted (name, release, origin, package or path, sha256 of its bzImage).
    #: describe() measures ``sender_kernel`` (its ``uname -r``) separately.
    sender_kernel_identity: SenderKernel | None = None
    qemu_pids: dict = field(default_factory=dict)  # role -> pid of its QEMU on this machine


@dataclass
class Testbed:
    """Three roles and how the testbed runs.

    ``kind`` is ``local`` (built on this machine by ``bbrlab testbed up``) or ``lab`` (a testbed file);
    ``accelerator`` is kvm, tcg or unknown; ``hypervisor_name`` names what runs the sender VM as far as it
    is known (the local testbed's QEMU version; the host it runs on is ``sender.hypervisor``); ``local``
    holds the local testbed's details.
    """

    name: str
    sender: SenderRole
    emulator: EmulatorRole
    receiver: Role
    accelerator: str = "unknown"
    spec: TestbedSpec | None = field(default=None, repr=False)
    kind: str = "lab"
    hypervisor_name: str | None = None
    local: LocalDetails | None = None

    @property
    def roles(self) -> dict[str, Role]:
        """The three roles by name: ``sender``, ``emulator``, ``receiver``."""
        return {"sender": self.sender, "emulator": self.emulator, "receiver": self.receiver}

    def record(self) -> TestbedRecord:
        """What a run record needs to know about the testbed, measured now (``metadata.testbed``): ``host_kernel`` is
        this machine's (the one driving the testbed), ``machine`` the sender's hypervisor host
        (:mod:`bbrlab.core.machine`), or why it could not be read."""
        out = TestbedRecord.of(name=self.name, kind=self.kind, accelerator=self.accelerator,
                               hypervisor=self.hypervisor_name, host_kernel=platform.release())
        if self.local:
            out.update(**{f.name: getattr(self.local, f.name) for f in fields(self.local)})
        try:
            out.update(machine=machine.measure(self.sender.hypervisor))
        except Exception as e:  # noqa: BLE001 - an unreachable hypervisor host is recorded, not fatal here
            out.update(machine=MachineUnreachable(f"unreachable: {e}"[:500]))
        for name, role in self.roles.items():
            try:
                out.update(**{f"{name}_kernel": role.kernel_release()})
            except Exception as e:  # noqa: BLE001 - an unreachable role is recorded, not fatal here
                out.update(**{f"{name}_kernel": f"unreachable: {e}"})
        return out

    def describe(self) -> dict:
        """:meth:`record` as its JSON, for what compares testbeds as dicts (a campaign's sameness, a calibration)."""
        return self.record().to_dict()

    def close(self) -> None:
        """Close the connections of every role's host and of the sender's hypervisor."""
        for role in self.roles.values():
            role.host.close()
        self.sender.hypervisor.close()


def vcpu_pin_path(spec: TestbedSpec) -> Path:
    """Where the pins of a testbed file's hand-given vCPU threads live:
    ``<state>/labs/<name>-<hash>/vcpu-pins.json`` beside the local testbeds' state (``$BBRLAB_STATE_DIR``,
    else ``~/.local/state/bbrlab``), one per testbed file (its resolved path), name and hypervisor host."""
    from .local.state import state_root

    hypervisor = spec.roles["sender"].hypervisor
    where = f"{hypervisor.address}:{hypervisor.port}" if hypervisor else "local"
    source = str(Path(spec.source).resolve()) if spec.source else ""
    key = hashlib.sha256(f"{source}\0{spec.name}\0{where}".encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name)[:40]
    return state_root().parent / "labs" / f"{slug}-{key}" / "vcpu-pins.json"


def from_spec(spec: TestbedSpec, *, kind: str = "lab", hypervisor_name: str | None = None,
              local: LocalDetails | None = None) -> Testbed:
    """Role objects for a validated testbed file."""
    s, e, r = spec.roles["sender"], spec.roles["emulator"], spec.roles["receiver"]
    hypervisor_host: Host = ssh_host("sender-hypervisor", s.hypervisor) if s.hypervisor else LocalHost()
    sender = SenderRole("sender", role_host(s), s.experiment_ip, s, hypervisor=hypervisor_host, vcpu=dict(s.vcpu),
                        pin_path=vcpu_pin_path(spec) if "thread_ids" in s.vcpu else None)
    emulator = EmulatorRole("emulator", role_host(e), e.experiment_ip, e, ports=e.ports)
    receiver = Role("receiver", role_host(r), r.experiment_ip, r)
    if hypervisor_name is None:  # a lab: as far as the file says (how its vCPU threads are found)
        hypervisor_name = {"qmp_socket": "QEMU", "libvirt_domain": "libvirt"}.get(next(iter(s.vcpu), ""))
    return Testbed(spec.name, sender, emulator, receiver, spec.accelerator, spec, kind=kind,
                   hypervisor_name=hypervisor_name, local=local)
