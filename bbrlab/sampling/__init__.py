"""Sampling TCP socket state during a run: the sampler's life and the ``ss`` loop (``sampler``), the
netlink and BPF samplers (``sockdiag``: build, deploy, command, parsers) and their C sources (``native/``).

May import: ``bbrlab.core``. Never ``run``, ``campaign``, ``analysis``, ``cli``.
"""
