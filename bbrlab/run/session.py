"""What lasts between the runs of a campaign on one testbed (a :class:`TestbedSession`).

The run recipe (:mod:`bbrlab.run.runner`) takes the testbed as it finds it; the session keeps what outlives one
run: the link held on the emulator, the sender kernel it booted, the identities of the sender's congestion
controls, what is measured once per sender boot (testbed description, versions, offloads) and the first
run's recovery of a testbed left dirty by an earlier process.
"""

from __future__ import annotations

from bbrlab import __version__
from bbrlab.contention import deadline as contention
from bbrlab.contention import outside
from bbrlab.core.errors import RunFailed
from bbrlab.kernel.ccaprobe import CcaIdentities
from bbrlab.link import emulator as link

from . import record as rec
from . import sender
from .recovery import recover
from .runmeta import RunMetadata


class TestbedSession:
    """One testbed as a campaign's runs use it, one run after the other."""

    def __init__(self, testbed):
        self.testbed = testbed
        self.link = link.EmulatorLink(testbed.emulator.host, testbed.emulator.ports)
        self.identities = CcaIdentities()
        self._kernel: str | None = None  # the kernel this session made sure the sender runs
        self._static: dict | None = None  # measured once per sender boot
        self._recovered: dict | None = None  # what the first run found and restored
        self.recovery_recorded = False  # an ok run's record carries it (a failed attempt's may be replaced)

    def boot(self, kernel: str | None, meta: RunMetadata) -> None:
        """Make the sender run ``kernel`` (None: whatever it runs). A plan keeps each kernel's runs together,
        so the sender reboots once per kernel block; the first run of a process checks it (a resumed
        campaign boots into the kernel of its next run). Only the sender reboots; the link stays."""
        if kernel is None or kernel == self._kernel:
            return
        if self.testbed.kind != "local":
            raise RunFailed(f"the scenario asks for sender kernel {kernel!r}, but a lab's sender kernel is the lab's "
                            "own: leave kernels out of a lab's spec")
        from bbrlab import testbed as testbed_mod

        with meta.timed("kernel_boot"):
            name, vcpus = self.testbed.name, self.testbed.local.sender_vcpus or 1
            self.testbed.close()
            self.testbed = testbed_mod.up(name, sender_vcpus=vcpus, kernel=kernel, progress=False)
        current = self.link.current
        self.link = link.EmulatorLink(self.testbed.emulator.host, self.testbed.emulator.ports)
        self.link.current = current  # the emulator did not reboot: its qdiscs are as they were
        self._kernel, self._static = kernel, None

    def describe(self, meta: RunMetadata) -> None:
        """Fill what is measured once per sender boot (testbed, kernel, versions, offloads) into ``meta``, and
        the recovery made before the first run (on every record until a run succeeds, so a retried failure does
        not take it along to ``failed/``)."""
        tb = self.testbed
        if self._static is None:
            identity = tb.local.sender_kernel_identity if tb.local else None
            self._static = {"testbed": tb.describe(), "offloads": {"sender": sender.offloads(
                tb.sender.host, tb.receiver.experiment_ip)}, "versions": {
                "hypervisor": tb.hypervisor_name, "bbrlab": __version__, "bbrlab_git": rec.git_commit(),
                **sender.tool_versions(tb.sender.host)},
                "kernel": identity.to_dict() if identity else {"origin": tb.kind}}
        meta.testbed, meta.offloads = dict(self._static["testbed"]), self._static["offloads"]
        meta.versions, meta.kernel = dict(self._static["versions"]), dict(self._static["kernel"])
        if self._recovered is None:
            self._recovered = recover(tb)
        if not self.recovery_recorded:  # every record until one run succeeds: a failed one may be retried
            meta.recovered = self._recovered

    def hosts_retaken(self) -> None:
        """A lab host's lock was lost and taken again: another driver may have changed the emulator meanwhile,
        so the next run sets the link again rather than trusting what this session set."""
        self.link.current, self.link.offloads = None, None

    def clear_deadline(self) -> dict:
        """Put every sender vCPU thread still under SCHED_DEADLINE back to SCHED_OTHER (after a failed run);
        what was cleared, or why it could not be (the next attempt then refuses the leftover)."""
        tb = self.testbed
        try:
            return {"deadline_cleared_tids": contention.clear_deadline(tb.sender.hypervisor, tb.sender.vcpu_threads())}
        except Exception as e:  # noqa: BLE001 - the run's own failure is the one to report; this is noted
            return {"error": f"could not clear the deadline policy: {e}"[:500]}

    def watched_hosts(self) -> dict:
        """The hosts whose CPU load a run records (:func:`bbrlab.contention.hostcpu.watching`)."""
        return {"emulator": self.testbed.emulator.host, "sender_hypervisor": self.testbed.sender.hypervisor}

    def testbed_processes(self) -> outside.Ours | None:
        """The testbed's processes on this machine, whose CPU a run tells apart from the rest of the host's
        (:mod:`bbrlab.contention.outside`); None when the sender's hypervisor is another machine."""
        if not self.testbed.sender.hypervisor.is_local:
            return None
        return outside.of_testbed(self.testbed)
