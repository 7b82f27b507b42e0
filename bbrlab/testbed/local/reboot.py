"""Booting a running local testbed's sender and/or emulator afresh into what they run (:func:`reboot`): what a
campaign's block of repetitions starts with (:mod:`bbrlab.campaign.blocks`). The namespaces, taps and bridges
stay; each VM gets a fresh host key, pinned anew. (A sender booted into another kernel is ``lifecycle.up``'s.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bbrlab.core.errors import TestbedError
from bbrlab.kernel import sender as sender_kernel

from . import image, kernelboot, plumbing, qemu
from .lifecycle import (
    RECEIVER_IP,
    SUBNET_PREFIX,
    Progress,
    _emulator_spec,
    _launch,
    _reboot_sender,
    _reopen_tap,
    _settle_reboot,
    down,
    resolve_sender_kernel,
    running,
)
from .state import State, check_name


def reboot(name: str, *, sender: bool = True, emulator: bool = False, progress: bool = True,
           sender_vcpus: int | None = None) -> sender_kernel.ResolvedKernel:
    """Boot the running testbed ``name``'s sender (into the kernel it runs; with ``sender_vcpus`` vCPUs, None: as
    many as it has) and/or its emulator afresh; return the sender's kernel, resolved again. Refused when the
    testbed is not up; a failed boot removes the testbed, as in :func:`up`."""
    check_name(name)
    say = Progress(progress)
    state = State.load(name)
    if not running(state):
        raise TestbedError(f"the local testbed '{name}' is not up: nothing to reboot (bbrlab testbed up)")
    known = sender_kernel.SenderKernel.from_dict(state.data["sender_kernel"])
    resolved = resolve_sender_kernel(known.path or known.name, say)
    try:
        if emulator:
            _reboot_emulator(state, say)
        if sender:
            boot = kernelboot.boot_files(resolved, say)
            _reboot_sender(state, sender_vcpus or state.data["sender_vcpus"], resolved, boot, say)
    except BaseException:
        say("reboot failed: removing the testbed")
        down(name, progress=progress)
        raise
    return resolved


def _reboot_emulator(state: State, say: Progress) -> None:
    """Stop the emulator VM and boot it again; its taps are made anew (they went with the old QEMU), bridged
    and addressed as at the testbed's start, the receiver's with its old MAC address (a new one left the sender's
    neighbour entry stale: the first ping then took about 25 s more). The sender, namespaces and bridge stay."""
    t_start = time.monotonic()
    img = image.GuestImage(Path(state.data["image"]))
    vm = state.vms["emulator"]
    state.data.update(phase="starting")
    state.save()
    link_ns, rx_ns = plumbing.link_netns(state.name), plumbing.receiver_netns(state.name)
    receiver_mac = plumbing.link_address(rx_ns, "rx0")  # the sender's neighbour cache knows the receiver by it
    if qemu.stop_vm(vm["pid"], vm["vm_name"]):
        say(f"emulator: stopped QEMU pid {vm['pid']}")
    fds = {"ea": _reopen_tap(link_ns, "tap-ea"), "eb": _reopen_tap(rx_ns, "rx0")}
    try:
        if receiver_mac:
            plumbing.set_link_address(rx_ns, "rx0", receiver_mac)
        plumbing.make_bridge(link_ns, "br-a", ["tap-ea"])
        plumbing.set_address(rx_ns, "rx0", RECEIVER_IP, SUBNET_PREFIX)
        spec = _emulator_spec(state, state.data["accelerator"], state.dir / "id_ed25519", fds, vm["ssh_port"])
        _launch(state, "emulator", spec, img, say)
    finally:
        for fd in fds.values():
            os.close(fd)
    say(f"emulator rebooted in {_settle_reboot(state, 'emulator', spec, say, t_start):.1f} s")
