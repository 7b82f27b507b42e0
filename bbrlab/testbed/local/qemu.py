"""Launching and stopping the local testbed's QEMU VMs.

Each VM boots a kernel directly (``-kernel/-initrd``) with bbrlab's init script as PID 1, on a
qcow2 overlay of the raw base image (the base stays clean). The kernel is the guest image's own
unless the VM's :class:`BootFiles` name another (the sender's kernel, see :mod:`.kernelboot`),
which then also brings a read-only modules disk. Management is
QEMU user-mode networking restricted to a host forward ``127.0.0.1:<port> -> :22``, so a guest is
reachable only from this machine; experiment NICs are tap descriptors opened by
:mod:`.plumbing`. The role's SSH key, its own SSH host key, hostname and setup script reach the guest
through fw_cfg.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.core import ownedpids, owners
from bbrlab.core.errors import TestbedError

from .image import INIT_PATH, GuestImage

MEMORY_MB = 1024
EXEC_DEADLINE_S = 10.0
MODULES_DISK_SERIAL = "bbrlab-modules"  # how the initramfs finds the modules disk
MODULES_DISK_PCI_ADDR = 0x8  # after the root disk, the management NIC (0x3) and experiment NICs (0x4..)


@dataclass(frozen=True)
class BootFiles:
    """What a VM boots: kernel image, initrd, and (for a kernel not in the image) its modules disk."""

    kernel: Path
    initrd: Path
    modules_disk: Path | None = None

    @classmethod
    def of_image(cls, image: GuestImage) -> BootFiles:
        """The guest image's own kernel and initrd, without a modules disk."""
        return cls(image.kernel, image.initrd)


@dataclass
class VmSpec:
    """What one VM needs; ``tap_fds`` become its experiment NICs eth1, eth2, ... in order."""

    vm_name: str  # QEMU -name, also how down() recognises the process
    hostname: str
    folder: Path  # the testbed's state dir: overlay, QMP socket, console log live here
    vcpus: int = 1
    accelerator: str = "tcg"
    ssh_port: int = 0
    authorized_key_file: Path | None = None
    #: This VM's own SSH host key (private half), handed in through fw_cfg and installed by the role's setup
    #: script before sshd starts (see lifecycle.HOST_KEY_SETUP): no two VMs share a host key.
    host_key_file: Path | None = None
    setup_script: Path | None = None
    tap_fds: list[int] = field(default_factory=list)
    mac_tag: int = 1  # distinct per VM of a testbed: experiment MACs are 52:54:00:77:<tag>:1<n>
    boot: BootFiles | None = None  # None: the guest image's kernel and initrd
    #: Whether the experiment NICs accept segmentation-offloaded (GSO) frames. The emulator's must not: netem
    #: applies delay and loss per packet it sees, and a 64 KB aggregate of the sender's TSO would lose ~40
    #: segments at once where the scenario asks for independent losses. Off, the host segments before delivery.
    receive_offloads: bool = True
    #: ``quiet`` on the kernel's command line (its boot messages off the console). The KVM probe turns it off:
    #: a kernel that starts prints its banner at once, so a silent console tells a guest that never started.
    quiet_console: bool = True

    @property
    def overlay(self) -> Path:
        """The VM's qcow2 overlay on the base image, ``<folder>/<hostname>.qcow2``."""
        return self.folder / f"{self.hostname}.qcow2"

    @property
    def qmp_socket(self) -> Path:
        """The VM's QMP unix socket, ``<folder>/<hostname>.qmp``."""
        return self.folder / f"{self.hostname}.qmp"

    @property
    def console_log(self) -> Path:
        """Where QEMU writes the VM's serial console, ``<folder>/<hostname>.console.log``."""
        return self.folder / f"{self.hostname}.console.log"


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_overlay(image: GuestImage, overlay: Path) -> None:
    """A fresh qcow2 overlay on the raw base image (replacing an old one)."""
    overlay.unlink(missing_ok=True)
    p = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image.disk), "-F", "raw",
                        str(overlay)], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise TestbedError(f"qemu-img create {overlay} failed: {p.stderr.strip()}")


def kernel_cmdline(quiet: bool = True) -> str:
    """The guest kernel's command line: root on ``/dev/vda``, console on ttyS0, bbrlab's init as PID 1,
    ``ethN`` names, a reboot 1 s after a panic (QEMU runs with ``-no-reboot``, so it then exits); with ``quiet``,
    the kernel's own boot messages kept off the console."""
    return f"root=/dev/vda rw console=ttyS0 init={INIT_PATH} net.ifnames=0{' quiet' if quiet else ''} panic=1"


def qemu_argv(spec: VmSpec, image: GuestImage) -> list[str]:
    """The full QEMU command line for ``spec``."""
    boot = spec.boot or BootFiles.of_image(image)
    if spec.accelerator == "kvm":
        accel = ["-accel", "kvm", "-cpu", "host"]
    else:
        accel = ["-accel", "tcg,thread=multi"]
    argv = [
        "qemu-system-x86_64", "-name", f"{spec.vm_name},debug-threads=on", *accel,
        "-smp", str(spec.vcpus), "-m", str(MEMORY_MB),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-serial", f"file:{spec.console_log}",
        "-kernel", str(boot.kernel), "-initrd", str(boot.initrd), "-append", kernel_cmdline(spec.quiet_console),
        "-drive", f"file={spec.overlay},if=virtio,format=qcow2,cache=unsafe",
        "-qmp", f"unix:{spec.qmp_socket},server=on,wait=off",
        "-fw_cfg", f"name=opt/bbrlab/hostname,string={spec.hostname}",
    ]
    if boot.modules_disk is not None:
        argv += ["-drive", f"file={boot.modules_disk},if=none,id=modules,format=raw,readonly=on",
                 "-device", f"virtio-blk-pci,drive=modules,serial={MODULES_DISK_SERIAL},"
                 f"addr={MODULES_DISK_PCI_ADDR:#x}"]
    if spec.ssh_port:
        argv += ["-netdev", f"user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
                 "-device", "virtio-net-pci,netdev=mgmt,addr=0x3"]
    for i, fd in enumerate(spec.tap_fds):
        offloads = "" if spec.receive_offloads else ",guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off"
        argv += ["-netdev", f"tap,id=exp{i + 1},fd={fd}",
                 "-device", f"virtio-net-pci,netdev=exp{i + 1},mac=52:54:00:77:{spec.mac_tag:02x}:{0x10 + i:02x}"
                 f",addr={0x4 + i:#x}{offloads}"]
    if spec.authorized_key_file:
        argv += ["-fw_cfg", f"name=opt/bbrlab/authorized_keys,file={spec.authorized_key_file}"]
    if spec.host_key_file:
        argv += ["-fw_cfg", f"name=opt/bbrlab/host_key,file={spec.host_key_file}"]
    if spec.setup_script:
        argv += ["-fw_cfg", f"name=opt/bbrlab/setup,file={spec.setup_script}"]
    return argv


def start_vm(spec: VmSpec, image: GuestImage) -> int:
    """Start QEMU detached (own session, survives this process); return its pid."""
    for stale in (spec.qmp_socket, spec.console_log):
        stale.unlink(missing_ok=True)
    log = open(spec.folder / f"{spec.hostname}.qemu.log", "w")
    try:
        proc = subprocess.Popen(qemu_argv(spec, image), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                pass_fds=spec.tap_fds, start_new_session=True)
    finally:
        log.close()
    # Until the child has exec'd, /proc/<pid>/cmdline is still Python's and is_our_qemu() says no:
    # wait for the exec (or the exit) so callers never mistake a starting VM for a dead one.
    deadline = time.monotonic() + EXEC_DEADLINE_S
    while not is_our_qemu(proc.pid, spec.vm_name) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc.pid


def is_our_qemu(pid: int, vm_name: str) -> bool:
    """True when ``pid`` is a live QEMU started with ``-name vm_name,...`` (never trust a bare pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not argv or b"qemu-system" not in argv[0]:
        return False
    return f"{vm_name},debug-threads=on".encode() in argv


#: Seconds to wait for QEMU to vanish after SIGKILL (it can hang in the kernel, e.g. on a stuck disk).
KILL_WAIT_S = 10.0


def stop_vm(pid: int, vm_name: str, timeout_s: float = 10.0, kill_wait_s: float | None = None) -> bool:
    """Stop the VM's QEMU if it is still ours (its command line names ``vm_name``; each signal goes only while
    ``pid`` names the process that started when the check was made): SIGTERM, after ``timeout_s`` SIGKILL,
    then wait at most ``kill_wait_s`` (default :data:`KILL_WAIT_S`) more. False when nothing ran;
    :class:`TestbedError` when it will not go away."""
    kill_wait_s = KILL_WAIT_S if kill_wait_s is None else kill_wait_s
    ticks = owners.start_ticks(pid)
    if ticks is None or not is_our_qemu(pid, vm_name):
        return False
    _signal(pid, ticks, signal.SIGTERM)
    if _gone_within(pid, ticks, vm_name, timeout_s):
        return True
    _signal(pid, ticks, signal.SIGKILL)
    if _gone_within(pid, ticks, vm_name, kill_wait_s):
        return True
    raise TestbedError(f"QEMU pid {pid} ({vm_name}) is still there {kill_wait_s:g} s after SIGKILL (state "
                       f"{_proc_state(pid)}: stuck in the kernel?); it may need a reboot to go away")


def _signal(pid: int, ticks: int, sig: int) -> None:
    """``sig`` to ``pid`` while it is the QEMU that started at ``ticks`` (a pid handed on since is left alone)."""
    ownedpids.signal_if_same(pid, ticks, sig)


def _gone_within(pid: int, ticks: int, vm_name: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        _reap(pid)
        if owners.start_ticks(pid) != ticks or not is_our_qemu(pid, vm_name):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _reap(pid: int) -> None:
    """Collect the exit status when QEMU is our own child (else it lingers as a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def console_tail(spec_or_path: VmSpec | Path, chars: int = 1500) -> str:
    """The last ``chars`` characters of a VM's console log (given its spec or the log's path); "" when it
    cannot be read."""
    path = spec_or_path.console_log if isinstance(spec_or_path, VmSpec) else spec_or_path
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def qemu_version() -> str:
    """The version ``qemu-system-x86_64 --version`` reports (e.g. ``7.2.22 (Debian ...)``), "" when it prints
    nothing; raises ``FileNotFoundError`` when QEMU is not installed."""
    p = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True, timeout=10)
    first = p.stdout.splitlines()[0] if p.stdout else ""
    return first.removeprefix("QEMU emulator version ").strip()
