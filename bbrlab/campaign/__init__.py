"""Campaigns (README steps "measure a grid" and "the sender's CPU ceiling"): the spec, the plan, the
campaign directory and its records, the loop and its executors (this process; Dask: ``distributed``,
``scaleout``, ``worker``, and the Dask engine's mutual TLS: ``tls``), the one way both run an attempt
(``attempt``), the campaign's options (``options``), calibration, and the host guard (``hostguard``).

May import: ``bbrlab.core``, ``bbrlab.scenario``, ``bbrlab.kernel``, ``bbrlab.sampling``, ``bbrlab.contention``, ``bbrlab.testbed``, ``bbrlab.link``, ``bbrlab.run``.
Never ``analysis``, ``cli``.
"""
