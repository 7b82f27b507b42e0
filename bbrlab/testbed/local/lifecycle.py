"""Bringing the local testbed up and down.

``up`` resolves and checks the sender's kernel (:mod:`bbrlab.kernel.sender`), builds (or reuses)
the guest image, decides KVM or TCG, creates the namespaces and taps, boots the sender and
emulator VMs in parallel, waits until both answer SSH and the receiver namespace can ping the
sender through the emulator's bridge, and writes ``testbed.yaml`` in the state directory (the same
form as a lab's testbed file). Every resource is recorded in ``state.json`` before it is created;
any failure calls :func:`down`, which removes all of it.

Each VM gets an SSH host key of its own, made fresh at each boot (``ssh-keygen``, milliseconds) and
pinned in the testbed's ``known_hosts``: the private half reaches the guest through fw_cfg and the role's
setup script installs it before sshd starts (:data:`HOST_KEY_SETUP`), so the cached guest image needs no
rebuild and its own key is never served. A sender answering on the emulator's port is refused.

A running testbed is reused when the sender already runs the requested kernel with the requested
vCPUs (and each of its VMs has its own pinned host key); when only the sender differs, only the sender VM is rebooted (the emulator, namespaces and
bridge stay), which is what a campaign over several kernels needs between kernel blocks.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import SSHHost
from bbrlab.kernel import DEFAULT_SOURCE, default_headers_dir
from bbrlab.kernel import sender as sender_kernel
from bbrlab.scenario import scenario as scenario_module

from ..file import RoleSpec, SSHSpec, TestbedSpec, write_file
from . import accel, image, kernelboot, plumbing, qemu
from .state import State, check_name

SUBNET_PREFIX = 24
SENDER_IP = "10.77.0.1"
RECEIVER_IP = "10.77.0.2"
EMULATOR_PORTS = ("eth1", "eth2")
SSH_DEADLINE_S = 300.0
PING_DEADLINE_S = 60.0
MAX_SENDER_VCPUS = scenario_module.MAX_SENDER_VCPUS

#: First in every role's setup script (run by the guest's init before sshd starts): the VM's own host key,
#: handed in through fw_cfg, replaces the one in the image. Without it sshd would serve the image's key,
#: which the testbed's known_hosts does not pin: SSH then refuses the VM rather than trust it.
HOST_KEY_SETUP = """\
key=/sys/firmware/qemu_fw_cfg/by_name/opt/bbrlab/host_key/raw
if [ -r "$key" ]; then
    (umask 077; cat "$key" > /etc/ssh/ssh_host_ed25519_key.new) && mv -f /etc/ssh/ssh_host_ed25519_key.new \
        /etc/ssh/ssh_host_ed25519_key && rm -f /etc/ssh/ssh_host_ed25519_key.pub
else
    echo "bbrlab-init: no host key handed in: sshd keeps the image's, which nobody pins"
fi
"""
SENDER_SETUP = f"""\
ip link set eth1 up
ip addr add {SENDER_IP}/{SUBNET_PREFIX} dev eth1
ethtool -K eth1 tso on gso on || echo "bbrlab-init: could not turn TSO on for eth1"
"""
#: The emulator forwards packet by packet: no GRO (its NICs accept no GSO frames either, see qemu.VmSpec), so
#: netem's delay and loss apply to each wire packet as the scenario says, not to aggregates.
EMULATOR_SETUP = """\
ip link add br0 type bridge stp_state 0 forward_delay 0
for port in eth1 eth2; do
    ethtool -K "$port" gro off || echo "bbrlab-init: could not turn GRO off for $port"
    ip link set "$port" master br0; ip link set "$port" up
done
ip link set br0 up
"""


class Progress:
    """Prints ``[  12.3 s] message`` lines to stderr when enabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.t0:6.1f} s] {message}", file=sys.stderr, flush=True)


def vm_name(testbed: str, role: str) -> str:
    """The QEMU ``-name`` of ``role``'s VM in testbed ``testbed``, ``bbrlab-<testbed>-<role>``: how ``down``
    recognises its process."""
    return f"bbrlab-{testbed}-{role}"


def testbed_file(name: str) -> Path:
    """Local testbed ``name``'s testbed file, ``testbed.yaml`` in its state directory (written by ``up``)."""
    return State(name).dir / "testbed.yaml"


def check_vcpus(sender_vcpus: object) -> int:
    """``sender_vcpus`` when it is a whole number from 1 to :data:`MAX_SENDER_VCPUS`; else raises
    :class:`~bbrlab.core.errors.ValidationError`."""
    if isinstance(sender_vcpus, bool) or not isinstance(sender_vcpus, int) or not (
            1 <= sender_vcpus <= MAX_SENDER_VCPUS):
        raise ValidationError("sender_vcpus", sender_vcpus, f"an integer 1-{MAX_SENDER_VCPUS}")
    return sender_vcpus


# -- is it running? -------------------------------------------------------------------------------
def running(state: State | None) -> bool:
    """True when the recorded VMs are alive and the namespaces exist (SSH not checked)."""
    if state is None or state.phase != "up":
        return False
    vms = state.vms
    if set(vms) != {"sender", "emulator"}:
        return False
    alive = all(qemu.is_our_qemu(v.get("pid", 0), v["vm_name"]) for v in vms.values())
    return alive and all(plumbing.netns_exists(ns) for ns in state.netns)


def sshd_banner(port: int, timeout_s: float = 3.0) -> bool:
    """Does something on 127.0.0.1:port speak SSH? (QEMU's forward accepts and then resets until
    the guest's sshd listens; asking for the banner first keeps paramiko from logging each reset.)"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def ssh_ready(port: int, key: Path, known_hosts: Path, timeout_s: float = 10.0) -> bool:
    """One attempt: does ``ssh root@127.0.0.1:port true`` succeed with the pinned host key?"""
    return sshd_banner(port, timeout_s) and _ssh_true(port, key, known_hosts, timeout_s)


def _ssh_true(port: int, key: Path, known_hosts: Path, timeout_s: float) -> bool:
    host = SSHHost(name=f"127.0.0.1:{port}", address="127.0.0.1", port=port, key_path=str(key),
                   known_hosts=str(known_hosts), connect_timeout_s=timeout_s)
    try:
        return host.run(["true"], timeout=timeout_s, check=False).ok
    except Exception:  # noqa: BLE001 - not up yet: refused, reset, banner timeout, auth not ready
        return False
    finally:
        host.close()


# -- the sender's kernel --------------------------------------------------------------------------
def resolve_sender_kernel(kernel: str | Path = sender_kernel.DEFAULT_KERNEL,
                          progress=lambda s: None) -> sender_kernel.ResolvedKernel:
    """Resolve and check the sender kernel ``kernel`` (a name or a path); nothing boots.

    ``debian-6.1`` is the guest image's own kernel (the image is built first if needed); other
    names and paths are resolved by :func:`bbrlab.kernel.sender.resolve`.
    """
    def from_image() -> sender_kernel.ResolvedKernel:
        img = image.ensure_image(progress)
        package, version = image.guest_kernel_package()
        return sender_kernel.image_kernel(img.kernel, img.initrd, package, version,
                                          default_headers_dir(img.kernel_release), DEFAULT_SOURCE)

    return sender_kernel.resolve(kernel, image_kernel=from_image, progress=progress)


def _boot_record(boot: qemu.BootFiles) -> dict:
    return {"kernel": str(boot.kernel), "initrd": str(boot.initrd),
            "modules_disk": str(boot.modules_disk) if boot.modules_disk else None}


def _sender_matches(state: State, sender_vcpus: int, boot: qemu.BootFiles) -> bool:
    return state.data.get("sender_vcpus") == sender_vcpus and state.data.get("sender_boot") == _boot_record(boot)


# -- up -------------------------------------------------------------------------------------------
def up(name: str = "local", sender_vcpus: int = 1, progress: bool = True,
       kernel: str | Path | sender_kernel.ResolvedKernel = sender_kernel.DEFAULT_KERNEL) -> Path:
    """Bring the local testbed up (or find it running); return the path of its testbed file.

    ``kernel`` is the sender's kernel (a name or path, see :mod:`bbrlab.kernel.sender`, or one
    already resolved), checked before anything boots or stops. A running testbed whose sender
    differs (kernel or vCPUs) gets a new sender only.
    """
    check_name(name)
    check_vcpus(sender_vcpus)
    say = Progress(progress)
    resolved = kernel if isinstance(kernel, sender_kernel.ResolvedKernel) else resolve_sender_kernel(kernel, say)
    boot = kernelboot.boot_files(resolved, say)
    img = image.ensure_image(say)
    for part in _clear_partitions(name):  # before the sender is reused: it must not stay on a few CPUs
        say(f"removed the CPU partition {part.path} a killed campaign left")
    state = State.load(name)
    if running(state) and state.data.get("image") == str(img.folder) and _own_host_keys(state) and \
            _all_ssh_ready(state):
        if _sender_matches(state, sender_vcpus, boot):
            say(f"testbed '{name}' already up (accelerator {state.data.get('accelerator')}, sender kernel "
                f"{resolved.kernel.release}): reusing it")
            return testbed_file(name)
        say(f"testbed '{name}' up with another sender ({state.data.get('sender_kernel', {}).get('release')}, "
            f"{state.data.get('sender_vcpus')} vCPU): rebooting the sender only")
        try:
            _reboot_sender(state, sender_vcpus, resolved, boot, say)
        except BaseException:
            say("sender reboot failed: removing the testbed")
            down(name, progress=progress)
            raise
        return testbed_file(name)
    if state is not None and (state.phase != "down" or state.vms or state.netns):
        say(f"testbed '{name}' partly present or configured differently: cleaning up first")
    down(name, progress=progress)  # also catches a stray QEMU or namespace of this name
    state = State(name)
    try:
        _bring_up(state, sender_vcpus, resolved, boot, say)
    except BaseException:
        say("up failed: removing what it created")
        down(name, progress=progress)
        raise
    return testbed_file(name)


def _own_host_keys(state: State) -> bool:
    """Each VM has a host key of its own, recorded (a testbed started before per-VM keys has none)."""
    keys = [vm.get("host_key_pub") for vm in state.vms.values()]
    return bool(keys) and all(keys) and len(set(keys)) == len(keys)


def _all_ssh_ready(state: State) -> bool:
    d = state.dir
    return all(ssh_ready(v["ssh_port"], d / "id_ed25519", d / "known_hosts") for v in state.vms.values())


def _record_sender(state: State, sender_vcpus: int, resolved: sender_kernel.ResolvedKernel,
                   boot: qemu.BootFiles) -> None:
    state.data.update(sender_vcpus=sender_vcpus, sender_kernel=resolved.kernel.to_dict(),
                      sender_boot=_boot_record(boot), sender_features=dict(resolved.features.found))
    state.save()


def _bring_up(state: State, sender_vcpus: int, resolved: sender_kernel.ResolvedKernel, boot: qemu.BootFiles,
              say: Progress) -> None:
    t_start = time.monotonic()
    state.data.update(phase="starting")
    _record_sender(state, sender_vcpus, resolved, boot)
    img = image.ensure_image(say)
    accelerator = _choose_accelerator(say)
    state.data.update(accelerator=accelerator, image=str(img.folder), guest_kernel=img.kernel_release,
                      qemu_version=qemu.qemu_version())
    state.save()
    key = _ensure_ssh_key(state.dir)
    link_ns, rx_ns = plumbing.link_netns(state.name), plumbing.receiver_netns(state.name)
    for ns in (link_ns, rx_ns):
        state.add_netns(ns)
        plumbing.create_netns(ns)
    fds = {"s": plumbing.open_tap(link_ns, "tap-s"), "ea": plumbing.open_tap(link_ns, "tap-ea"),
           "eb": plumbing.open_tap(rx_ns, "rx0")}
    try:
        plumbing.make_bridge(link_ns, "br-a", ["tap-s", "tap-ea"])
        plumbing.set_address(rx_ns, "rx0", RECEIVER_IP, SUBNET_PREFIX)
        specs = _vm_specs(state, sender_vcpus, accelerator, key, fds, boot)
        for role, spec in specs.items():
            _launch(state, role, spec, img, say)
    finally:
        for fd in fds.values():
            os.close(fd)  # QEMU holds its own copies; the taps live as long as QEMU does
    _write_known_hosts(state)
    _write_testbed_file(state, key)
    boot_s = _wait_ssh(state, specs, say)
    _wait_ping(state, RECEIVER_IP, say)
    state.data.update(phase="up", boot_to_ssh_s=boot_s, up_s=round(time.monotonic() - t_start, 1))
    state.save()
    say(f"testbed '{state.name}' up in {time.monotonic() - t_start:.1f} s ({accelerator}; sender kernel "
        f"{resolved.kernel.release}; boot to SSH: " + ", ".join(f"{r} {s:.1f} s" for r, s in boot_s.items()) + ")")


def _reboot_sender(state: State, sender_vcpus: int, resolved: sender_kernel.ResolvedKernel,
                   boot: qemu.BootFiles, say: Progress) -> None:
    """Stop the sender VM and boot it again with ``boot``; emulator, namespaces and bridge stay."""
    t_start = time.monotonic()
    img = image.GuestImage(Path(state.data["image"]))
    vm = state.vms["sender"]
    state.data.update(phase="starting")
    state.save()
    if qemu.stop_vm(vm["pid"], vm["vm_name"]):
        say(f"sender: stopped QEMU pid {vm['pid']}")
    _record_sender(state, sender_vcpus, resolved, boot)
    link_ns = plumbing.link_netns(state.name)
    fd = _reopen_tap(link_ns, "tap-s")  # the old tap went with the old QEMU
    try:
        plumbing.make_bridge(link_ns, "br-a", ["tap-s"])
        spec = _sender_spec(state, sender_vcpus, state.data["accelerator"], state.dir / "id_ed25519", fd, boot,
                            ssh_port=vm["ssh_port"])
        _launch(state, "sender", spec, img, say)
    finally:
        os.close(fd)
    took_s = _settle_reboot(state, "sender", spec, say, t_start)
    say(f"sender rebooted into {resolved.kernel.release} in {took_s:.1f} s")


def _settle_reboot(state: State, role: str, spec: qemu.VmSpec, say: Progress, t_start: float) -> float:
    """After ``role``'s VM was launched again: pin its new host key, wait for its SSH and for the receiver to
    answer a ping, and save the state with the boot's time (``<role>_reboot_s``). Seconds since ``t_start``."""
    _write_known_hosts(state)  # the VM's new host key
    boot_s = _wait_ssh(state, {role: spec}, say)
    _wait_ping(state, RECEIVER_IP, say)
    state.data.update(phase="up", boot_to_ssh_s={**state.data.get("boot_to_ssh_s", {}), **boot_s},
                      **{f"{role}_reboot_s": round(time.monotonic() - t_start, 1)})
    state.save()
    return time.monotonic() - t_start


def _reopen_tap(ns: str, ifname: str, deadline_s: float = 5.0) -> int:
    """Open tap ``ifname`` again after its QEMU exited (the kernel may still be tearing the old one down)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return plumbing.open_tap(ns, ifname)
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise TestbedError(f"cannot open tap {ifname} in {ns} again: {e}") from e
            time.sleep(0.05)


def _choose_accelerator(say: Progress) -> str:
    result = accel.cached_kvm_probe()
    if result is None:
        say(f"probing KVM with a real guest boot (at most {accel.PROBE_DEADLINE_S:.0f} s, once per machine)")
        result = accel.probe_kvm()
    chosen = "kvm" if result.usable else "tcg"
    say(f"accelerator: {chosen} ({result.detail})")
    return chosen


def _ensure_ssh_key(folder: Path) -> Path:
    """The testbed's own ed25519 key pair (mode 0600), made once."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = folder / "id_ed25519"
    if not key.is_file():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"bbrlab-{folder.name}",
                        "-f", str(key)], check=True, capture_output=True, timeout=30)
    key.chmod(0o600)
    return key


def new_host_key(state: State, role: str) -> Path:
    """A fresh ed25519 SSH host key for ``role``'s VM (private half 0600 in the testbed's 0700 state
    directory); its public half is recorded in the state (``vms.<role>.host_key_pub``) for known_hosts."""
    key = state.dir / f"{role}_host_ed25519_key"
    for old in (key, Path(f"{key}.pub")):
        old.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"bbrlab-{state.name}-{role}",
                    "-f", str(key)], check=True, capture_output=True, timeout=30)
    key.chmod(0o600)
    public = " ".join(Path(f"{key}.pub").read_text().split()[:2])  # "ssh-ed25519 AAAA..." without the comment
    state.set_vm(role, host_key_pub=public)
    return key


def _setup_script(state: State, role: str, text: str) -> Path:
    path = state.dir / f"{role}-setup.sh"
    path.write_text(HOST_KEY_SETUP + text)
    return path


def _sender_spec(state: State, sender_vcpus: int, accelerator: str, key: Path, tap_fd: int,
                 boot: qemu.BootFiles, ssh_port: int = 0) -> qemu.VmSpec:
    return qemu.VmSpec(vm_name=vm_name(state.name, "sender"), hostname="sender", folder=state.dir,
                       accelerator=accelerator, authorized_key_file=Path(f"{key}.pub"), vcpus=sender_vcpus,
                       host_key_file=new_host_key(state, "sender"),
                       setup_script=_setup_script(state, "sender", SENDER_SETUP), tap_fds=[tap_fd], mac_tag=1,
                       ssh_port=ssh_port or qemu.free_local_port(), boot=boot)


def _vm_specs(state: State, sender_vcpus: int, accelerator: str, key: Path, fds: dict[str, int],
              boot: qemu.BootFiles) -> dict[str, qemu.VmSpec]:
    return {
        "sender": _sender_spec(state, sender_vcpus, accelerator, key, fds["s"], boot),
        "emulator": _emulator_spec(state, accelerator, key, fds),
    }


def _emulator_spec(state: State, accelerator: str, key: Path, fds: dict[str, int], ssh_port: int = 0) -> qemu.VmSpec:
    return qemu.VmSpec(vm_name=vm_name(state.name, "emulator"), hostname="emulator", vcpus=1,
                       folder=state.dir, accelerator=accelerator, authorized_key_file=Path(f"{key}.pub"),
                       host_key_file=new_host_key(state, "emulator"),
                       setup_script=_setup_script(state, "emulator", EMULATOR_SETUP),
                       tap_fds=[fds["ea"], fds["eb"]], mac_tag=2, ssh_port=ssh_port or qemu.free_local_port(),
                       receive_offloads=False)


def _launch(state: State, role: str, spec: qemu.VmSpec, img: image.GuestImage, say: Progress) -> None:
    qemu.make_overlay(img, spec.overlay)
    state.set_vm(role, vm_name=spec.vm_name, ssh_port=spec.ssh_port, qmp_socket=str(spec.qmp_socket),
                 overlay=str(spec.overlay), console_log=str(spec.console_log), vcpus=spec.vcpus)
    pid = qemu.start_vm(spec, img)
    state.set_vm(role, pid=pid, started_monotonic=time.monotonic())
    say(f"{role}: QEMU pid {pid}, {spec.vcpus} vCPU, {spec.accelerator}, ssh 127.0.0.1:{spec.ssh_port}")


def _write_known_hosts(state: State) -> None:
    """Pin each VM's own host key at its management port (and nothing else)."""
    lines = [f"[127.0.0.1]:{v['ssh_port']} {v['host_key_pub']}\n" for v in state.vms.values()]
    (state.dir / "known_hosts").write_text("".join(lines))


def _write_testbed_file(state: State, key: Path) -> None:
    def ssh(role: str) -> SSHSpec:
        return SSHSpec(address="127.0.0.1", port=state.vms[role]["ssh_port"], user="root", key=str(key),
                       known_hosts=str(state.dir / "known_hosts"))

    spec = TestbedSpec(name=state.name, accelerator=state.data["accelerator"], roles={
        "sender": RoleSpec("sender", ssh("sender"), experiment_ip=SENDER_IP,
                           vcpu={"qmp_socket": state.vms["sender"]["qmp_socket"]}),
        "emulator": RoleSpec("emulator", ssh("emulator"), ports=EMULATOR_PORTS),
        "receiver": RoleSpec("receiver", None, netns=plumbing.receiver_netns(state.name),
                             experiment_ip=RECEIVER_IP),
    })
    write_file(spec, testbed_file(state.name))


def _wait_ssh(state: State, specs: dict[str, qemu.VmSpec], say: Progress) -> dict[str, float]:
    """Poll SSH on the VMs of ``specs`` until they answer (deadline ``SSH_DEADLINE_S``); seconds from QEMU start."""
    waiting = {role: vm for role, vm in state.vms.items() if role in specs}
    boot: dict[str, float] = {}
    deadline = time.monotonic() + SSH_DEADLINE_S
    key, known = state.dir / "id_ed25519", state.dir / "known_hosts"
    while waiting:
        for role, vm in list(waiting.items()):
            if not qemu.is_our_qemu(vm["pid"], vm["vm_name"]):
                log = (state.dir / f"{role}.qemu.log").read_text(errors="replace")[-500:]
                raise TestbedError(f"{role} VM exited while booting: {log.strip()}\nconsole:\n"
                                   f"{qemu.console_tail(specs[role])}")
            if ssh_ready(vm["ssh_port"], key, known, timeout_s=5):
                boot[role] = round(time.monotonic() - vm["started_monotonic"], 1)
                say(f"{role}: SSH ready after {boot[role]:.1f} s")
                del waiting[role]
        if waiting and time.monotonic() > deadline:
            role = next(iter(waiting))
            raise TestbedError(f"{role} VM did not answer SSH within {SSH_DEADLINE_S:.0f} s; console:\n"
                               f"{qemu.console_tail(specs[role])}")
        if waiting:
            time.sleep(0.5)
    return boot


def _wait_ping(state: State, address: str, say: Progress) -> None:
    """The sender reaches the receiver through the emulator's bridge (ARP + ICMP, real packets).

    The ping runs in the sender guest (the image has ping; this host need not)."""
    d = state.dir
    sender = SSHHost(name="sender", address="127.0.0.1", port=state.vms["sender"]["ssh_port"],
                     key_path=str(d / "id_ed25519"), known_hosts=str(d / "known_hosts"))
    deadline = time.monotonic() + PING_DEADLINE_S
    try:
        while True:
            res = sender.run(["ping", "-c", "1", "-W", "1", address], check=False, timeout=10)
            if res.ok:
                say(f"sender reaches the receiver ({address}) through the emulator")
                return
            if time.monotonic() > deadline:
                raise TestbedError(f"the sender cannot ping the receiver {address} through the emulator "
                                   f"within {PING_DEADLINE_S:.0f} s: {(res.stdout + res.stderr).strip()[-300:]}")
    finally:
        sender.close()


# -- down -----------------------------------------------------------------------------------------
def down(name: str = "local", progress: bool = True) -> dict:
    """Stop the VMs and remove the namespaces (with their taps and bridge) of testbed ``name``.

    Works from the recorded state and, as a second net, from the names bbrlab gives its QEMU
    processes and namespaces; idempotent. Returns what was removed.
    """
    check_name(name)
    say = Progress(progress)
    state = State.load(name)
    removed: dict[str, list] = {"qemu_pids": [], "netns": [], "files": []}
    vms = state.vms if state else {}
    for role, vm in vms.items():
        if vm.get("pid") and qemu.stop_vm(vm["pid"], vm["vm_name"]):
            removed["qemu_pids"].append(vm["pid"])
            say(f"{role}: stopped QEMU pid {vm['pid']}")
    for role in ("sender", "emulator"):
        for pid in _qemu_pids_named(vm_name(name, role)):
            qemu.stop_vm(pid, vm_name(name, role))
            removed["qemu_pids"].append(pid)
            say(f"{role}: stopped unrecorded QEMU pid {pid}")
    names = (state.netns if state else []) + [plumbing.link_netns(name), plumbing.receiver_netns(name),
                                              plumbing.competitor_netns(name)]
    for ns in dict.fromkeys(names):
        if plumbing.remove_netns(ns):
            removed["netns"].append(ns)
            say(f"removed namespace {ns}")
    for vm in vms.values():
        for key in ("overlay", "qmp_socket"):
            path = Path(vm.get(key, ""))
            if vm.get(key) and path.exists():
                path.unlink()
                removed["files"].append(str(path))
    for part in _leftover_partitions(name):
        removed.setdefault("partitions", []).append(str(part.path))
        say(f"removed the CPU partition {part.path} a stopped campaign left")
    if state is not None:
        state.data.update(phase="down", vms={}, netns=[])
        state.save()
        testbed_file(name).unlink(missing_ok=True)
    return removed


def _leftover_partitions(name: str) -> list:
    """A CPU partition of this testbed left by a campaign over several testbeds that was killed."""
    import bbrlab.testbed.isolation as isolation

    try:
        return isolation.remove_leftovers([name])
    except (TestbedError, OSError) as e:
        print(f"bbrlab: warning: could not remove testbed {name}'s CPU partition: {e}", file=sys.stderr)
        return []


def _clear_partitions(name: str) -> list:
    """Leftover CPU partitions (this testbed's, and others' nobody uses) removed; raises
    :class:`TestbedError` when this testbed's belongs to a campaign that still runs."""
    import bbrlab.testbed.isolation as isolation

    return isolation.clear_leftovers(name) if isolation.flavour() else []


def _qemu_pids_named(name: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and qemu.is_our_qemu(int(entry), name):
            out.append(int(entry))
    return out
