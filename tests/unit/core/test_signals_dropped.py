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
    assert caught.value.signum == signal.SIGINT and caught.value.between_runs  # no run was in flight
    assert traceback.extract_tb(caught.tb)[-1].name == "checkpoint"


def test_a_stop_between_runs_says_no_run_was_lost(tmp_path, capsys, monkeypatch):
    """`bbrlab campaign run` stopped by a checkpoint (after a committed run, none in flight) does not say a run in
    flight was lost; a stop mid-run still does. The campaign is a stand-in that raises as the loop would."""
    import shutil
    from pathlib import Path
    from types import SimpleNamespace

    from bbrlab.campaign import single
    from bbrlab.cli import campaign

    out = tmp_path / "c"
    shutil.copytree(Path(__file__).parents[2] / "fixtures" / "campaign", out)
    args = SimpleNamespace(out=out, no_progress=True, retry_failed=False, keep_link=False, allow_mixed=False)
    for between, said in ((True, "no run was lost"), (False, "the run in flight was not recorded")):
        def stop(*_a, between=between, **_k):
            raise signals.Interrupted(signal.SIGINT, between_runs=between)

        monkeypatch.setattr(single, "run_campaign_on", stop)
        monkeypatch.setattr(campaign, "run_campaign_on", stop, raising=False)
        with pytest.raises(signals.Interrupted):
            campaign._run_one(args, SimpleNamespace(name="demo"), None, None)
        assert said in capsys.readouterr().err


def test_a_checkpoint_without_a_signal_or_outside_interruptible_does_nothing():
    with signals.interruptible():
        signals.checkpoint()
    signals.checkpoint()
