"""The ``bbrlab`` command. Each subcommand lives in its own module here and exposes
``register(subparsers)``; :data:`bbrlab.cli.main.COMMANDS` lists them. Handlers are named ``run_<verb>``
(``bbrlab link set`` -> :func:`bbrlab.cli.link.run_set`), or ``run`` for a command without verbs;
:mod:`bbrlab.cli.common` holds what they share (``--testbed``, the testbed's lock).

May import: every other room.
"""
