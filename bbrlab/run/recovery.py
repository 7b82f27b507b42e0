"""What a killed campaign process (SIGKILL, power loss) may have left on its testbed, cleared before the
first run of the next one. Nothing that belongs to another process is touched:

- SCHED_DEADLINE still on the sender's vCPU threads (its context manager never got to restore it);
- a cfs-quota, cfs-burst or credit cgroup (``bbrlab/bbrlab-cfs-<pid>-<n>``) whose maker is gone, on this machine:
  its threads moved back to their cgroup, the cgroup removed (:func:`bbrlab.contention.cgroups.clear_leftovers`);
- competing-load's busy loops whose maker is gone, on this machine: killed, and the vCPU threads they competed
  with given their CPU mask back (:func:`bbrlab.contention.load.clear_leftovers`). Both act only on what a
  ledger entry bbrlab wrote names (:mod:`bbrlab.contention.ledger`: root's, 0600, with its owner's pid, start
  time and boot), never on a command line or a cgroup name; an entry that is not root's 0600 file is refused
  and listed (``ledger_refused``);
- iperf3 processes with a socket on the iperf3 port in the sender's or the receiver's network namespace
  (found with ``ss -p``, so nothing else on a shared host is seen), and on the receiver the servers of
  extra flows (the ports after it, :mod:`bbrlab.run.flows`);
- samplers still running on the sender (asked to stop through the stop file in their private directory);
- tracefs instances of the vCPU trace (``bbrlab-<machine>-<pid>-<ticks>-<n>``) on the sender's hypervisor
  host whose owner process is gone: turned off, their reader stopped, removed
  (:func:`bbrlab.sampling.vcputrace.clear_leftovers`);
- an rsync run's sshd on the receiver and ssh clients on the sender (:func:`bbrlab.run.transfer.recover`);
- the private directories of its runs (:func:`bbrlab.core.leftdirs.sweep`: each stamped with the process that
  made it, removed when that process is gone): iperf3's server log and the progress poller's on the receiver,
  the samplers' on the sender and the emulator, the vCPU trace's on the hypervisor host, with what still works
  in them;
- a CPU partition (cpuset) a killed multi-testbed campaign left on this machine, its QEMU threads
  confined to a few CPUs (:func:`bbrlab.testbed.isolation.clear_leftovers`): removed, after the deadline
  policies (a deadline thread cannot leave its root domain). One whose campaign still runs is refused.

The emulator's qdiscs need no recovery: the next run sets the link it needs before it starts.
"""

from __future__ import annotations

from bbrlab.contention import cgroups, ledger, load
from bbrlab.contention import deadline as contention
from bbrlab.core import leftdirs
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling import vcputrace
from bbrlab.scenario.competition import MAX_EXTRA_FLOWS
from bbrlab.testbed import isolation

from . import iperf, transfer
from .recoveryrecord import IperfKilled, PrivateDirsRemoved, Recovered


def recover(testbed) -> Recovered:
    """Clear what a killed predecessor left on ``testbed``; return what was found (the run record's
    ``metadata.recovered``).

    Raises :class:`~bbrlab.core.errors.TestbedError` when the testbed's CPU partition belongs to a campaign that
    still runs."""
    cleared = contention.clear_deadline(testbed.sender.hypervisor, testbed.sender.vcpu_threads())
    cfs_cgroups = cgroups.clear_leftovers() if testbed.kind == "local" else []
    load_loops = load.clear_leftovers() if testbed.kind == "local" else []
    refused = [r for kind in ledger.KINDS for r in ledger.left(kind).refused] if testbed.kind == "local" else []
    partitions = clear_partitions(testbed)
    killed = IperfKilled(
        sender=iperf.kill_port_users(testbed.sender.host, iperf.DEFAULT_PORT, listening=False),
        receiver=[pid for port in range(iperf.DEFAULT_PORT, iperf.DEFAULT_PORT + MAX_EXTRA_FLOWS + 1)
                  for pid in iperf.kill_port_users(testbed.receiver.host, port, listening=True)])
    # the socket sampler in the sender, the bottleneck sampler in the emulator (same private directories)
    samplers = sampling.stop_strays(testbed.sender.host) + sampling.stop_strays(testbed.emulator.host)
    traces = vcputrace.clear_leftovers(testbed.sender.hypervisor)
    private_dirs = sweep_private_dirs(testbed)
    rsync = transfer.recover(testbed)
    return Recovered(trace_instances_removed=traces, private_dirs_removed=private_dirs, deadline_cleared_tids=cleared,
                     cfs_cgroups_removed=cfs_cgroups, load_loops_killed=load_loops, ledger_refused=refused,
                     partitions_removed=partitions, iperf3_killed=killed, samplers_stopped=samplers,
                     sshd_killed=rsync.sshd_killed, ssh_clients_killed=rsync.ssh_clients_killed,
                     run_dirs_removed=rsync.run_dirs_removed)


def clear_partitions(testbed) -> list[str]:
    """The cpuset paths of leftover CPU partitions removed on this machine (a local testbed's own, and other
    testbeds' that nobody uses); none for a lab's testbed, whose QEMU does not run here."""
    if testbed.kind != "local" or isolation.flavour() is None:
        return []
    return [str(p.path) for p in isolation.clear_leftovers(testbed.name)]


#: Which host keeps which purpose's private directories (:meth:`bbrlab.core.hosts.Host.private_dir`); the
#: rsync run's (``sshd``, ``rsync``) are swept by :func:`bbrlab.run.transfer.recover`.
RUN_DIRS = {"receiver": ("iperf3", "progress"), "sender": ("sampler",), "emulator": ("sampler",),
            "hypervisor": ("vcputrace",)}


def sweep_private_dirs(testbed) -> PrivateDirsRemoved:
    """The private directories of killed runs removed from each of ``testbed``'s hosts (after the samplers were
    asked to stop, so that a stray one's stop file was still there to be read)."""
    hosts = {"receiver": testbed.receiver.host, "sender": testbed.sender.host, "emulator": testbed.emulator.host,
             "hypervisor": testbed.sender.hypervisor}
    return PrivateDirsRemoved(**{role: leftdirs.sweep(hosts[role], *purposes) for role, purposes in RUN_DIRS.items()})
