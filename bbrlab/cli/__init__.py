"""The ``bbrlab`` command. Each subcommand lives in its own module here and exposes
``register(subparsers)``; :mod:`bbrlab.cli.main` finds them, so adding a command touches one file."""
