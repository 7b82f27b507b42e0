"""From run directories to tables, figures and claims (README steps "tables" and "figures"): loading
(``data``), the tidy tables and their cache (``tables``, ``table_cache``), readers of both layouts
(``records_reader``, ``authors``), run identity (``identity``), the figures (``plots``), the paper's claims
(``fidelity``), interactive picking (``explore``) and the host's load during a folder's runs (``hostload``).

May import: ``bbrlab.core``, ``bbrlab.scenario``, ``bbrlab.sampling``, ``bbrlab.contention``, ``bbrlab.link``,
``bbrlab.run``, ``bbrlab.campaign``, ``bbrlab.calibration`` (the typed run record and its parts, the samplers' files,
the search's decisions, the ceilings). Never ``cli``.
"""
