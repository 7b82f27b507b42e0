"""What the subcommands share: naming the testbed, and holding or respecting its lock.

Every command that acts on a testbed has ``--testbed NAME|FILE`` (:func:`add_testbed_option`), with
the default of :func:`bbrlab.testbed.target.default_testbed`. Commands that change a testbed hold its
lock while they do (:func:`bbrlab.testbed.driving.changing`) and say what they are doing; read-only commands
that would run commands on its guests first ask whether someone else holds it (:func:`busy_elsewhere`), so a look at
the testbed does not steal CPU from a contended sender in the middle of a campaign. Commands that drive
a testbed (a campaign, calibration, setting the link) take its lock before they read anything of it, and
on a lab also the lock on its own hosts (:func:`bbrlab.testbed.driving.driving`).
"""

from __future__ import annotations

import argparse

from bbrlab.testbed.holder import busy_elsewhere, describe_holder

TESTBED_HELP = ("a local testbed's name or a testbed file (default: $BBRLAB_TESTBED, else the local testbed "
                "that is up: 'local', or the only one)")


def add_testbed_option(p: argparse.ArgumentParser, extra_help: str = "") -> None:
    """``--testbed NAME|FILE`` with the shared default (resolved when the command runs)."""
    p.add_argument("--testbed", metavar="NAME|FILE", default=None, help=TESTBED_HELP + extra_help)


def add_force_option(p: argparse.ArgumentParser) -> None:
    """``--force``: run commands on the guests even while another process holds the testbed (see
    :func:`refuse_if_busy`)."""
    p.add_argument("--force", action="store_true",
                   help="run commands on the guests even while another process (a campaign) holds the testbed")


def testbed_arg(args: argparse.Namespace) -> str:
    """The testbed the command acts on: ``--testbed`` or the default."""
    from bbrlab.testbed.target import resolve

    return resolve(getattr(args, "testbed", None))


def load_testbed(args: argparse.Namespace):
    """The :class:`~bbrlab.testbed.Testbed` named by ``--testbed`` (or the default)."""
    from bbrlab.testbed import load

    return load(testbed_arg(args))


def refuse_if_busy(name: str, force: bool, what: str = "run commands on its guests") -> None:
    """Raise :class:`~bbrlab.core.errors.TestbedError` when another process holds testbed ``name`` (unless
    ``force``): looking at a testbed takes CPU from the sender a campaign is measuring."""
    from bbrlab.core.errors import TestbedError

    busy = None if force else busy_elsewhere(name)
    if busy is not None:
        raise TestbedError(f"testbed '{name}' is in use by {describe_holder(busy)}; not going to {what} "
                           "now (add --force to do it anyway)")
