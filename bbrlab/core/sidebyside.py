"""Context managers that talk to different hosts, entered side by side and exited side by side.

A run starts a sampler in the sender guest and another in the emulator guest; each start and each stop is a few
SSH round trips into a TCG guest (a checksum of its binary, a private directory, its readiness; at the end its
stop file and the rest of its log). One after the other they add up; :class:`SideBySide` overlaps them, one
thread per manager beyond the first, which runs in the calling thread.

The semantics are those of entering the managers in order in an :class:`contextlib.ExitStack`, with what
threads change made explicit:

- Entering: every manager's ``__enter__`` runs to its end (a thread is always joined, so nothing is left
  half-started behind the caller's back). If any raised, the ones that entered are exited, with that error, and
  the first error (in the managers' order) is raised. ``__enter__`` returns the managers' values, in order.
- Exiting: every entered manager's ``__exit__`` runs, with the block's exception; none suppresses it. If any
  raised, the first error is raised after all have run.
- A signal's :class:`bbrlab.core.signals.Interrupted` (raised in the main thread only) that arrives while the
  threads are joined is kept; the threads are joined to their end all the same, and it is raised after (on
  entering: once the entered managers have been exited).

Only managers whose ``__enter__`` and ``__exit__`` may run in a thread other than the main one belong here:
nothing that installs a signal handler (which Python allows in the main thread only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any


class SideBySide:
    """Enter and exit ``managers`` side by side (see the module docstring); a context manager."""

    def __init__(self, *managers: AbstractContextManager):
        self.managers = list(managers)
        self._entered: list[AbstractContextManager] = []

    def __enter__(self) -> list[Any]:
        values, errors, interrupted = run_side_by_side([m.__enter__ for m in self.managers])
        self._entered = [m for m, e in zip(self.managers, errors, strict=True) if e is None]
        failure = interrupted or _first(errors)
        if failure is not None:
            try:
                self.__exit__(type(failure), failure, failure.__traceback__)
            except BaseException as e:  # noqa: BLE001 - the entering failure stays the one raised
                failure.add_note(f"and while exiting what had entered: {e!r}")
            raise failure
        return values

    def __exit__(self, exc_type, exc, tb) -> bool:
        entered, self._entered = self._entered, []
        _, errors, interrupted = run_side_by_side([_exiter(m, exc_type, exc, tb) for m in reversed(entered)])
        failure = _first(errors) or interrupted
        if failure is not None:
            raise failure
        return False  # the block's exception, if any, goes on


def _exiter(manager: AbstractContextManager, exc_type, exc, tb) -> Callable[[], Any]:
    return lambda: manager.__exit__(exc_type, exc, tb)


def _first(errors: Sequence[BaseException | None]) -> BaseException | None:
    return next((e for e in errors if e is not None), None)


class NotRun(Exception):
    """The place of a call that a signal kept from starting."""


def run_side_by_side(calls: Sequence[Callable[[], Any]]) -> tuple[list[Any], list[BaseException | None],
                                                                     BaseException | None]:
    """Run ``calls`` at once, the first in this thread and each other one in a thread of its own, all to their
    end; ``(values, errors, interrupted)``: values and errors by position (an error is what the call raised, else
    None; :class:`NotRun` for a call a signal kept from starting), and the exception a signal raised here while
    threads started or were waited for (it does not cut the waiting short: every thread started is joined)."""
    values: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [NotRun(f"call {i} did not start") for i in range(len(calls))]

    def work(i: int) -> None:
        try:
            values[i] = calls[i]()
            errors[i] = None
        except BaseException as e:  # noqa: BLE001 - handed back by position
            errors[i] = e

    threads = [threading.Thread(target=work, args=(i,), name=f"bbrlab-side-by-side-{i}", daemon=True)
               for i in range(1, len(calls))]
    interrupted: BaseException | None = None
    try:
        for t in threads:
            t.start()
        if calls:
            work(0)
    except BaseException as e:  # noqa: BLE001 - a signal between two steps: kept, the threads still joined
        interrupted = e
    for t in threads:
        while t.is_alive():
            try:
                t.join()
            except BaseException as e:  # noqa: BLE001 - a signal while waiting: kept, the thread still joined
                interrupted = interrupted or e
    return values, errors, interrupted
