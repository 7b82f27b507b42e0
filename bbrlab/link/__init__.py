"""The emulated link (README step "emulate the link"): netem and the token bucket on the emulator's
bridge ports, described once (``qdisc``), set, read back and cleared (``emulator``), which queue limit is in
force (``bottleneck``), the ports' offloads (``offloads``), what one run did to it (``counters``: the qdiscs'
counters, netem's own loss and the queue held, a run record's typed ``metadata.link``). The paper's set-up
validation (configured versus measured) sends traffic, so it lives with the runs: :mod:`bbrlab.run.linkcheck`.

May import: ``bbrlab.core``, ``bbrlab.scenario``, ``bbrlab.testbed``. Never ``run``, ``campaign``, ``analysis``, ``cli``.
"""
