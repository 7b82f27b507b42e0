"""Campaigns (README step "measure a grid"): the spec, the plan, the
campaign directory and its records, the loop and its executors (this process; Dask: ``distributed``,
``scaleout``, ``worker``, and the Dask engine's mutual TLS: ``tls``), the one way both run an attempt
(``attempt``), the campaign's options (``options``) and the host guard (``hostguard``). Calibration is a campaign
of its own kind, in :mod:`bbrlab.calibration`.

May import: ``bbrlab.core``, ``bbrlab.scenario``, ``bbrlab.kernel``, ``bbrlab.sampling``, ``bbrlab.contention``, ``bbrlab.testbed``, ``bbrlab.link``, ``bbrlab.run``.
Never ``calibration``, ``analysis``, ``cli``.
"""
