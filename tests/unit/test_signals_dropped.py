"""A signal whose exception Python dropped still ends the work (bbrlab.core.signals.checkpoint).

Python runs a signal handler between two bytecodes of the main thread; when those are inside a weakref
callback, the exception the handler raises is printed ("Exception ignored in") and dropped. A fresh clone's
make test saw exactly that: the README's demo campaign went on for 20 runs after its Ctrl-C.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import traceback
import weakref

import pytest

from bbrlab.core import signals


class _Thing:
    pass


def _signal_inside_a_weakref_callback() -> None:
    thing = _Thing()

    def callback(_ref) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs at one of these bytecodes, inside the callback
            pass

    ref = weakref.ref(thing, callback)
    del thing
    gc.collect()
    assert ref() is None


def test_a_signal_dropped_inside_a_weakref_callback_is_raised_at_the_next_checkpoint(monkeypatch):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    with pytest.raises(signals.Interrupted) as caught, signals.interruptible():
        _signal_inside_a_weakref_callback()
        assert dropped == [signals.Interrupted]  # Python reported it as unraisable and went on
        signals.checkpoint()
    assert caught.value.signum == signal.SIGINT
    assert traceback.extract_tb(caught.tb)[-1].name == "checkpoint"


def test_a_checkpoint_without_a_signal_or_outside_interruptible_does_nothing():
    with signals.interruptible():
        signals.checkpoint()
    signals.checkpoint()
