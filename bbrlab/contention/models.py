"""One way in for every contention model: :func:`contended` finds the model's session in :data:`SESSIONS` (by the
model's name, :mod:`bbrlab.scenario.cpumodels`) and gives every model the same discipline: check, apply and read back,
run the body, collect the evidence, restore on every exit (signals included).

The scenario's side of a model (its parameters and their checks) is :mod:`bbrlab.scenario.cpumodels`, one module each;
this is the applying side, one session module per mechanism, each naming the models it applies (its ``MODELS``):
``deadline`` and ``none`` are :class:`bbrlab.contention.deadline.ContentionSession`, opened by
:func:`bbrlab.contention.deadline.contended` (its watch included; none applies nothing and measures what the
threads got); ``cfs-quota`` and ``cfs-burst`` are :class:`~bbrlab.contention.cfs.CfsSession`; ``credit`` is
:class:`~bbrlab.contention.credit.CreditSession`; ``competing-load`` is :class:`~bbrlab.contention.load.LoadSession`.
Each of those runs its state watch (:class:`~bbrlab.contention.watch.StateWatch`) every ``watch_interval_s`` while
the body runs. Every session has the steps of :class:`ContentionSession`. Recovery after a killed run is per
mechanism, not per model (a predecessor may have used any model): :func:`bbrlab.run.recovery.recover` calls each
session module's clearing (``deadline.clear_deadline``, ``cgroups.clear_leftovers``, ``load.clear_leftovers``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from bbrlab.core.hosts import Host
from bbrlab.scenario.scenario import Contention

from . import deadline
from .cfs import CfsSession
from .credit import CreditSession
from .evidence import ContentionEvidence, ContentionRecord
from .load import LoadSession
from .threadstat import ThreadIdentity


class ContentionSession(Protocol):
    """What each model's session does, in :func:`contended`'s order."""

    contention: Contention

    def prepare(self) -> None:
        """Read what the threads have now and check everything; changes nothing."""

    def apply(self) -> None:
        """Apply the contention and read it back (a read-back that differs raises, everything undone)."""

    def start_watch(self, interval_s: float | None) -> None:
        """Check every ``interval_s`` while the body runs that the contention still holds."""

    def finish(self) -> ContentionEvidence:
        """Stop the watch; the evidence of what the threads got and whether the contention held."""

    def restore(self) -> None:
        """Give back what was found; safe to call more than once."""

    @property
    def unrestored(self) -> list[int]:
        """Threads still under this session's contention."""

    def record(self) -> ContentionRecord:
        """The ``metadata.contention`` part of a run record."""


#: The session of each model, by the model's name (each session type lists the models it applies).
SESSIONS: dict[str, type] = {name: session for session in (deadline.ContentionSession, CfsSession, CreditSession,
                                                           LoadSession) for name in session.MODELS}


@contextmanager
def contended(host: Host, thread_ids: Sequence[int], contention: Contention, *, handle_signals: bool = True,
              watch_interval_s: float | None = 1.0, expected: dict[int, ThreadIdentity] | None = None,
              accelerator: str | None = None, **kwargs) -> Iterator:
    """Run the ``with`` body under ``contention`` (any model) on ``thread_ids`` of ``host``; restore afterwards.
    The yielded session has :meth:`record` (a ``ContentionRecord``) after the body, as deadline's has."""
    session_type = SESSIONS[contention.model]
    if session_type is deadline.ContentionSession:
        with deadline.contended(host, thread_ids, contention, handle_signals=handle_signals, watch_interval_s=watch_interval_s,
                                expected=expected, accelerator=accelerator, **kwargs) as session:
            yield session
        return
    session = session_type(host, list(thread_ids), contention, accelerator=accelerator)
    session.prepare()
    with deadline.held(session, handle_signals=handle_signals, start=lambda: session.start_watch(watch_interval_s)):
        yield session
