"""One way in for every contention model: :func:`contended` picks the model's session from
``contention.model`` (:mod:`bbrlab.core.contention_models`) and gives every model the same discipline:
check, apply and read back, run the body, collect the evidence, restore on every exit (signals included).

``deadline`` is :func:`bbrlab.contention.deadline.contended` itself (its watch included); ``cfs-quota`` and
``cfs-burst`` are :class:`~bbrlab.contention.cfs.CfsSession`; ``credit`` is
:class:`~bbrlab.contention.credit.CreditSession`; ``competing-load`` is :class:`~bbrlab.contention.load.LoadSession`;
``none`` applies nothing and measures what the threads got. Each of the others runs its state watch
(:class:`~bbrlab.contention.watch.StateWatch`) every ``watch_interval_s`` while the body runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bbrlab.core.hosts import Host
from bbrlab.core.scenario import Contention

from . import deadline
from .cfs import CfsSession
from .credit import CreditSession
from .load import LoadSession
from .threadstat import ThreadIdentity


@contextmanager
def contended(host: Host, thread_ids: Sequence[int], contention: Contention, *, handle_signals: bool = True,
              watch_interval_s: float | None = 1.0, expected: dict[int, ThreadIdentity] | None = None,
              accelerator: str | None = None, **kwargs) -> Iterator:
    """Run the ``with`` body under ``contention`` (any model) on ``thread_ids`` of ``host``; restore afterwards.
    The yielded session has :meth:`record` (a ``ContentionRecord``) after the body, as deadline's has."""
    if contention.model in ("deadline", "none"):  # none: no policy, the threads' usage measured all the same
        with deadline.contended(host, thread_ids, contention, handle_signals=handle_signals, watch_interval_s=watch_interval_s,
                                expected=expected, accelerator=accelerator, **kwargs) as session:
            yield session
        return
    session = SESSIONS[contention.model](host, list(thread_ids), contention, accelerator=accelerator)
    session.prepare()
    with deadline.held(session, handle_signals=handle_signals, start=lambda: session.start_watch(watch_interval_s)):
        yield session


#: The session of each model that is not deadline's.
SESSIONS = {"cfs-quota": CfsSession, "cfs-burst": CfsSession, "credit": CreditSession, "competing-load": LoadSession}
