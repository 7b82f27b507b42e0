"""SideBySide: context managers entered and exited at once, with ExitStack's semantics for errors and signals.

Side by side is shown without timing: the managers meet at a barrier that only opens when both are inside their
``__enter__`` (or ``__exit__``) at the same time; one after the other, the barrier breaks after its timeout."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager

import pytest

from bbrlab.core.sidebyside import SideBySide, run_side_by_side
from bbrlab.core.signals import Interrupted, interruptible


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, str, object]] = []
        self.lock = threading.Lock()

    def note(self, *event):
        with self.lock:
            self.events.append(event)

    @contextmanager
    def manager(self, name, *, meet=None, fail_enter=None, fail_exit=None, before_enter=None):
        if before_enter:
            before_enter()
        if meet:
            meet.wait()
        if fail_enter:
            raise fail_enter
        self.note("enter", name, threading.current_thread().name)
        try:
            yield name.upper()
        except BaseException as e:
            self.note("exit", name, type(e).__name__)
            raise
        else:
            self.note("exit", name, None)
        finally:
            if meet:
                meet.wait()
            if fail_exit:
                raise fail_exit


def test_two_managers_are_inside_enter_and_exit_at_the_same_time():
    rec, meet = Recorder(), threading.Barrier(2, timeout=10)
    with SideBySide(rec.manager("a", meet=meet), rec.manager("b", meet=meet)) as values:
        assert values == ["A", "B"]
    assert sorted(e[:2] for e in rec.events) == [("enter", "a"), ("enter", "b"), ("exit", "a"), ("exit", "b")]
    assert {e[2] for e in rec.events if e[0] == "enter"} == {"MainThread", "bbrlab-side-by-side-1"}


def test_one_after_the_other_would_break_the_barrier():
    # the control: the same managers in an ExitStack-like order never meet
    meet = threading.Barrier(2, timeout=0.2)
    with pytest.raises(threading.BrokenBarrierError):
        with Recorder().manager("a", meet=meet), Recorder().manager("b", meet=meet):
            pass


def test_a_failed_enter_exits_what_entered_with_that_error_and_raises_it():
    rec = Recorder()
    with pytest.raises(KeyError, match="b failed"):
        with SideBySide(rec.manager("a"), rec.manager("b", fail_enter=KeyError("b failed")), rec.manager("c")):
            pytest.fail("the body must not run")
    assert sorted(e[:2] for e in rec.events if e[0] == "enter") == [("enter", "a"), ("enter", "c")]
    assert sorted((e[1], e[2]) for e in rec.events if e[0] == "exit") == [("a", "KeyError"), ("c", "KeyError")]


def test_the_bodys_error_reaches_every_manager_and_is_not_swallowed():
    rec = Recorder()
    with pytest.raises(ValueError, match="body"):
        with SideBySide(rec.manager("a"), rec.manager("b")):
            raise ValueError("body")
    assert sorted((e[1], e[2]) for e in rec.events if e[0] == "exit") == [("a", "ValueError"), ("b", "ValueError")]


def test_an_exit_that_raises_does_not_keep_the_others_from_exiting():
    rec = Recorder()
    with pytest.raises(OSError, match="stop failed"):
        with SideBySide(rec.manager("a", fail_exit=OSError("stop failed")), rec.manager("b")):
            pass
    assert sorted(e[1] for e in rec.events if e[0] == "exit") == ["a", "b"]


def test_a_signal_while_waiting_for_the_threads_is_raised_once_everything_entered_is_exited():
    rec = Recorder()
    sent = threading.Event()

    def signal_main_thread():
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread, which waits in join()
        sent.set()
        time.sleep(0.2)  # this enter goes on after the signal: it must still be joined and exited

    with interruptible():
        with pytest.raises(Interrupted) as e:
            with SideBySide(rec.manager("a"), rec.manager("b", before_enter=signal_main_thread)):
                pytest.fail("the body must not run")
    assert e.value.signum == signal.SIGTERM and sent.is_set()
    # "a" may have been kept from starting (the signal can land while the thread starts); what entered, exited
    entered = sorted(e[1] for e in rec.events if e[0] == "enter")
    assert "b" in entered and sorted(e[1] for e in rec.events if e[0] == "exit") == entered, rec.events


def test_run_side_by_side_hands_back_values_and_errors_by_position():
    values, errors, interrupted = run_side_by_side([lambda: 1, lambda: 1 / 0, lambda: 3])
    assert values == [1, None, 3] and errors[0] is None and isinstance(errors[1], ZeroDivisionError)
    assert errors[2] is None and interrupted is None
    assert run_side_by_side([]) == ([], [], None)
