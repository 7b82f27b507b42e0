"""What lasts between the runs of a campaign on one testbed (a :class:`TestbedSession`).

The run recipe (:mod:`bbrlab.run.runner`) takes the testbed as it finds it; the session keeps what outlives one
run: the link held on the emulator, the sender kernel it booted, the identities of the sender's congestion
controls, what is measured once per sender boot (testbed description, versions, offloads) and the first
run's recovery of a testbed left dirty by an earlier process.
"""

from __future__ import annotations

import copy

from bbrlab import __version__
from bbrlab.contention import deadline as contention
from bbrlab.contention import outside
from bbrlab.core.errors import RunFailed
from bbrlab.kernel.ccaprobe import CcaIdentities
from bbrlab.kernel.sender import KernelOrigin
from bbrlab.link import emulator as link

from . import record as rec
from . import sender
from .blockboot import BlockBoot, needs_fresh_boot
from .recovery import recover
from .recoveryrecord import Recovered
from .runmeta import RunMetadata


class TestbedSession:
    """One testbed as a campaign's runs use it, one run after the other."""

    def __init__(self, testbed):
        self.testbed = testbed
        self.link = link.EmulatorLink(testbed.emulator.host, testbed.emulator.ports)
        self.identities = CcaIdentities()
        self._kernel: str | None = None  # the kernel this session made sure the sender runs
        self._block: int | None = None  # the block whose boot this session made or found (blocks: K)
        self._static: dict | None = None  # measured once per sender boot
        self._recovered: Recovered | None = None  # what the first run found and restored
        self.recovery_recorded = False  # an ok run's record carries it (a failed attempt's may be replaced)

    def boot(self, kernel: str | None, meta: RunMetadata, block: BlockBoot | None = None,
             sender_vcpus: int | None = None) -> None:
        """Make the sender run ``kernel`` (None: whatever it runs) with ``sender_vcpus`` vCPUs (None: as many as
        it has), on a boot of the run's ``block`` when the campaign has blocks
        (:func:`bbrlab.run.blockboot.needs_fresh_boot`; ``metadata.block`` says whether this run booted afresh).
        A plan keeps each kernel's and vCPU count's runs together, so the sender reboots once per such group; the
        first run of a process checks it (a resumed campaign boots into the kernel and count of its next run).
        A kernel or vCPU switch is itself a fresh boot. Only the sender reboots (and the emulator when the block
        asks); the link stays, or is set again after the emulator rebooted."""
        new_block = block is not None and block.block != self._block
        before = self._boot_id() if new_block else None
        switch_kernel = kernel is not None and kernel != self._kernel
        switch_vcpus = sender_vcpus is not None and sender_vcpus != self._sender_vcpus()
        if switch_kernel or switch_vcpus:
            self._check_local(kernel if switch_kernel else None, None, sender_vcpus if switch_vcpus else None)
        if switch_kernel:
            with meta.timed("kernel_boot"):  # a sender already on the kernel is reused (the first run of a process)
                self._reboot(lambda name, vcpus: self._testbed_mod().up(name, sender_vcpus=vcpus, kernel=kernel,
                                                                        progress=False), sender_vcpus)
            self._kernel = kernel
        elif switch_vcpus:
            with meta.timed("vcpus_boot"):  # the kernel it runs, with the run's vCPUs
                self._reboot(lambda name, vcpus: self._testbed_mod().reboot(
                    name, sender=True, emulator=False, sender_vcpus=vcpus, progress=False), sender_vcpus)
        booted = new_block and self._boot_id() != before  # a kernel's real boot is the block's boot too
        if new_block and ((not booted and needs_fresh_boot(block, self._block, before)) or (booted and block.emulator)):
            self._check_local(None, block)
            with meta.timed("block_boot"):
                self._reboot(lambda name, vcpus: self._testbed_mod().reboot(
                    name, sender=not booted, emulator=block.emulator, progress=False))
            booted = True
        if block is not None:
            meta.block = block.record(booted=booted)
            self._block = block.block

    def _sender_vcpus(self) -> int | None:
        """The sender's vCPUs as the local testbed started it; None for a lab's (whose count is the lab's)."""
        local = getattr(self.testbed, "local", None)
        return getattr(local, "sender_vcpus", None) if local is not None else None

    @staticmethod
    def _testbed_mod():
        from bbrlab import testbed as testbed_mod

        return testbed_mod

    def _check_local(self, kernel: str | None, block: BlockBoot | None, sender_vcpus: int | None = None) -> None:
        if self.testbed.kind == "local":
            return
        if kernel is not None:
            raise RunFailed(f"the scenario asks for sender kernel {kernel!r}, but a lab's sender kernel is the lab's "
                            "own: leave kernels out of a lab's spec")
        if sender_vcpus is not None:
            raise RunFailed(f"the scenario asks for {sender_vcpus} sender vCPU(s), but a lab's sender VM has the "
                            "lab's own: leave sender_vcpus out of a lab's spec")
        raise RunFailed(f"block {block.block} of {block.blocks} asks for a fresh boot of the sender, which bbrlab "
                        "makes only on a local testbed: leave blocks out of a lab's spec (or give 1)")

    def _boot_id(self) -> str:
        """The sender's boot id now (one command)."""
        return self.testbed.sender.host.output(["cat", "/proc/sys/kernel/random/boot_id"]).strip()

    def _reboot(self, boot, sender_vcpus: int | None = None) -> None:
        """``boot(name, vcpus)`` brings up the testbed anew (a new object), the sender with ``sender_vcpus`` vCPUs
        (None: as many as it has); the link is kept on an emulator that did not reboot and set again on one that
        did (its boot id changed)."""
        name, vcpus = self.testbed.name, sender_vcpus or self.testbed.local.sender_vcpus or 1
        emulator_before = self._emulator_boot_id()
        self.testbed.close()
        self.testbed = boot(name, vcpus)
        current = self.link.current
        self.link = link.EmulatorLink(self.testbed.emulator.host, self.testbed.emulator.ports)
        if self._emulator_boot_id() == emulator_before:
            self.link.current = current  # the emulator did not reboot: its qdiscs are as they were
        self._static = None

    def _emulator_boot_id(self) -> str | None:
        try:
            return self.testbed.emulator.host.output(["cat", "/proc/sys/kernel/random/boot_id"]).strip()
        except Exception:  # noqa: BLE001 - unknown: the link is then set again, which is always safe
            return None

    def describe(self, meta: RunMetadata) -> None:
        """Fill what is measured once per sender boot (testbed, kernel, versions, offloads) into ``meta``, and
        the recovery made before the first run (on every record until a run succeeds, so a retried failure does
        not take it along to ``failed/``)."""
        tb = self.testbed
        if self._static is None:
            identity = tb.local.sender_kernel_identity if tb.local else None
            self._static = {"testbed": tb.record(), "offloads": sender.SenderOffloads(sender.offloads(
                tb.sender.host, tb.receiver.experiment_ip)), "versions": sender.tool_versions(
                tb.sender.host, hypervisor=tb.hypervisor_name, bbrlab=__version__, bbrlab_git=rec.git_commit()),
                "kernel": identity or KernelOrigin(tb.kind)}
            self._static["testbed"].update(emulator_boot_id=self._emulator_boot_id())
        meta.testbed, meta.offloads = copy.copy(self._static["testbed"]), self._static["offloads"]
        meta.versions, meta.kernel = self._static["versions"], self._static["kernel"]
        self.recover_first()
        if not self.recovery_recorded:  # every record until one run succeeds: a failed one may be retried
            meta.recovered = self._recovered

    def recover_first(self) -> Recovered:
        """Clear what a killed predecessor left (:func:`~bbrlab.run.recovery.recover`) now, once per session, so
        that nothing measured before the first run (the testbed's description) meets its leftovers: a vCPU left
        under SCHED_DEADLINE at a 25 % share can make the sender too slow to answer SSH. The first record
        carries it."""
        if self._recovered is None:
            self._recovered = recover(self.testbed)
        return self._recovered

    def hosts_retaken(self) -> None:
        """A lab host's lock was lost and taken again: another driver may have changed the emulator meanwhile,
        so the next run sets the link again rather than trusting what this session set."""
        self.link.current, self.link.offloads = None, None

    def clear_deadline(self) -> contention.DeadlineCleared:
        """Put every sender vCPU thread still under SCHED_DEADLINE back to SCHED_OTHER (after a failed run);
        what was cleared, or why it could not be (the next attempt then refuses the leftover)."""
        tb = self.testbed
        try:
            return contention.DeadlineCleared(contention.clear_deadline(tb.sender.hypervisor, tb.sender.vcpu_threads()))
        except Exception as e:  # noqa: BLE001 - the run's own failure is the one to report; this is noted
            return contention.DeadlineCleared(error=f"could not clear the deadline policy: {e}"[:500])

    def watched_hosts(self) -> dict:
        """The hosts whose CPU load a run records (:func:`bbrlab.contention.hostcpu.watching`)."""
        return {"emulator": self.testbed.emulator.host, "sender_hypervisor": self.testbed.sender.hypervisor}

    def testbed_processes(self) -> outside.Ours | None:
        """The testbed's processes on this machine, whose CPU a run tells apart from the rest of the host's
        (:mod:`bbrlab.contention.outside`); None when the sender's hypervisor is another machine."""
        if not self.testbed.sender.hypervisor.is_local:
            return None
        return outside.of_testbed(self.testbed)
