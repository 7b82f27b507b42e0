"""Shared pytest fixtures.

``testbed``: the local testbed (sender VM, emulator VM, receiver namespace), brought up or
attached to ONCE per pytest session. The session holds that testbed's lock (bbrlab.testbed.lock)
from the first test that asks for it until the end, so two sessions never boot or tear down the
same testbed under each other. At the end it is brought down,
unless ``BBRLAB_KEEP_TESTBED=1`` (then the next session attaches to it in seconds).
``BBRLAB_TESTBED`` names another local testbed, or a lab's testbed file (then nothing is
brought up or down: the lab is used as it is).

Tests that use it are marked ``system`` and ``testbed``::

    pytestmark = [pytest.mark.system, pytest.mark.testbed]

    def test_something(testbed):
        testbed.sender.host.run(["uname", "-r"])
"""

from __future__ import annotations

import contextlib
import os

import pytest


@pytest.fixture(scope="session")
def testbed():
    """A running local testbed (:class:`bbrlab.testbed.Testbed`), shared by the whole session."""
    import bbrlab.testbed as tbmod

    name = os.environ.get("BBRLAB_TESTBED", "local")
    if os.path.isfile(name):
        tb = tbmod.load(name)
        yield tb
        tb.close()
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(tbmod.testbed_lock(name))
        tb = tbmod.up(name, progress=True)
        yield tb
        tb.close()
        if os.environ.get("BBRLAB_KEEP_TESTBED") != "1":
            tbmod.down(name, progress=False)
