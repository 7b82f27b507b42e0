"""What a killed campaign process (SIGKILL, power loss) may have left on its testbed, cleared before the
first run of the next one. Nothing that belongs to another process is touched:

- SCHED_DEADLINE still on the sender's vCPU threads (its context manager never got to restore it);
- iperf3 processes with a socket on the iperf3 port in the sender's or the receiver's network namespace
  (found with ``ss -p``, so nothing else on a shared host is seen);
- samplers still running on the sender (asked to stop through the stop file in their private directory);
- an rsync run's sshd on the receiver and ssh clients on the sender (:func:`bbrlab.transfer.recover`).

The emulator's qdiscs need no recovery: the next run sets the link it needs before it starts.
"""

from __future__ import annotations

from . import contention, iperf, sampling, transfer


def recover(testbed) -> dict:
    """Clear what a killed predecessor left on ``testbed``; return what was found (for the run record)."""
    cleared = contention.clear_deadline(testbed.sender.hypervisor, testbed.sender.vcpu_threads())
    killed = {"sender": iperf.kill_port_users(testbed.sender.host, iperf.DEFAULT_PORT, listening=False),
              "receiver": iperf.kill_port_users(testbed.receiver.host, iperf.DEFAULT_PORT, listening=True)}
    samplers = sampling.stop_strays(testbed.sender.host)
    return {"deadline_cleared_tids": cleared, "iperf3_killed": killed, "samplers_stopped": samplers,
            **transfer.recover(testbed)}
