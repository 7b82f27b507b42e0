"""The sender's CPU ceiling (README step "the sender's CPU ceiling", ``bbrlab calibrate``): the plan of a
calibration (``plan``), measuring it on a testbed as a campaign (``calibrate``), the runs turned into ceilings and the
limit each point measured (``ceilings``), and whether a campaign's runs stayed below their ceilings (``check``).
The calibration file a run is checked against while it runs is the run's own format, :mod:`bbrlab.run.ceiling`.

May import: ``bbrlab.core``, ``bbrlab.scenario``, ``bbrlab.contention`` (the typed parts a run record holds),
``bbrlab.testbed``, ``bbrlab.run``, ``bbrlab.campaign``. Never ``analysis``, ``cli``.
"""
