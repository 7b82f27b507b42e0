"""CPU contention for the sender VM (README step "contend for the CPU"): SCHED_DEADLINE on its vCPU
threads (``deadline``), the scheduler syscalls (``sched``), finding the vCPU threads (``vcpu``), which
host CPUs a testbed's QEMU threads may run on (``placement``), what a thread and the host's CPUs really
got (``threadstat``, ``hostcpu``).

May import: ``bbrlab.core``, ``bbrlab.testbed``. Never ``run``, ``campaign``, ``analysis``, ``cli``.
"""
