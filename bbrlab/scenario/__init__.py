"""The scenario of one run, as typed values (README step "measure a grid", per run): the link (``link``, with
the sizes of the emulator's queues: ``linksizing``), the CPU contention and its models (``cpumodels``, one module
per model; ``contention_models``: their constants), the flow and its workloads' parameters (``workload_params``),
the flows that compete beside it (``competition``), what the run sets in the sender (``knobs``: its CCA's
module parameters and sysctls), the sampler's limits (``sampling_limits``), and the run that
joins them (``scenario``: ``Scenario``, ``Contention``, ``Flow``, the run id). Every constructor validates, so a
scenario that exists is one the testbed can run; errors name the field and the allowed range (``ranges``).

May import: ``bbrlab.core``. Never a room above it.
"""
