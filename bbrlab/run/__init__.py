"""One measurement run (README step "measure a grid", per run): the recipe (``runner``), what lasts
between runs on one testbed (``session``), the workloads (``workloads``, ``iperf``, ``transfer``,
``sshd``, ``progress``), the sender prepared (``sender``), what must hold (``checks``), the record and its
metadata (``record``, ``runmeta``), the calibration file it is checked against (``ceiling``) and
recovery after a killed process (``recovery``).

May import: ``bbrlab.core``, ``bbrlab.scenario``, ``bbrlab.kernel``, ``bbrlab.sampling``, ``bbrlab.contention``, ``bbrlab.testbed``, ``bbrlab.link``.
Never ``campaign``, ``analysis``, ``cli``.
"""
