"""Holding a testbed while a command or a notebook changes it: its lock first, then (for a lab) the lock on its
own hosts, and a word to anyone who looks (``bbrlab testbed status``) about what the holder is doing.

Used by every command that drives a testbed (``bbrlab campaign run``, ``calibrate``, ``link set`` ...) and by
the notebook API (:mod:`bbrlab.campaign.notebook`): nothing of a testbed (its state, its vCPU threads, the
hypervisor's limits) is read while another process may be changing it.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator

from . import hostlock, load, target
from .holder import busy_elsewhere, describe_holder
from .lock import set_activity, testbed_lock


@contextlib.contextmanager
def changing(name: str, activity: str, **details) -> Iterator[None]:
    """Hold testbed ``name``'s lock for a change and say so (:func:`bbrlab.testbed.lock.set_activity`).

    When another process holds it, say who and what it is doing, then wait for it (Ctrl-C gives up).
    """
    busy = busy_elsewhere(name)
    if busy is not None:
        print(f"testbed '{name}' is in use by {describe_holder(busy)}; waiting for it (Ctrl-C to give up)",
              file=sys.stderr, flush=True)
    with testbed_lock(name, note=io.StringIO()):
        set_activity(name, activity, **details)
        yield


def lock_name(ref: str) -> str:
    """The name testbed ``ref``'s lock on this machine goes by: a local testbed's own name, or the name a lab's
    testbed file gives (read from that file; no testbed state is read)."""
    return target.lock_name(ref)


@contextlib.contextmanager
def driving(ref: str, activity: str, **details) -> Iterator:
    """For a command that drives testbed ``ref``: hold its lock first (:func:`changing`), only then read it
    (a local testbed's state, a lab's hosts), then hold the lock on a lab's own hosts
    (:func:`bbrlab.testbed.hostlock.holding`: a driver on another machine waits too); yields the
    :class:`~bbrlab.testbed.Testbed` and closes it at the end."""
    with changing(lock_name(ref), activity, **details):
        tb = load(ref)
        try:
            with hostlock.holding(tb, activity=activity):
                yield tb
        finally:
            tb.close()
