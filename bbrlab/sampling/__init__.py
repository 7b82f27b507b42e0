"""Sampling TCP socket state during a run: the sampler's life and the ``ss`` loop (``sampler``), the
netlink and BPF samplers (``sockdiag``: build, deploy, command, parsers) and their C sources (``native/``),
and what a run record keeps of any of them (``summary``: the typed ``metadata.sampling``, the data rows).

May import: ``bbrlab.core``, ``bbrlab.scenario``. Never a room above it (``contention``, ``testbed``, ``run``, ...).
"""
