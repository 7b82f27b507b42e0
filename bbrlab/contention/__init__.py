"""CPU contention for the sender VM (README step "contend for the CPU"): SCHED_DEADLINE on its vCPU
threads (``deadline``: applying and restoring), the host's limits for it (``limits``), talking to the
scheduler (``schedulers``: syscalls here or chrt on a host; ``sched``: the syscalls themselves), the policy
watch and stall guard (``watch``), finding the vCPU threads (``vcpu``), which host CPUs a testbed's QEMU
threads may run on (``placement``), what a thread and the host's CPUs really got (``threadstat``,
``hostcpu``), and what the host spent outside the testbed (``outside``).

May import: ``bbrlab.core``, ``bbrlab.scenario``. Never ``testbed``, ``run``, ``campaign``, ``analysis``, ``cli``
(the testbed finds its vCPU threads through this room, not the other way round).
"""
