"""A task for a Dask worker that starts threads the way a run does (invoke starts three or four for every
command) while garbage whose finalizers release the GIL is being collected: two of the three ingredients of
CPython's lock-order deadlock gh-106883 (3.11); the third is ``sys._current_frames()`` in another thread (Dask's
profiler). In a run the race is rare (once in a suite); here every allocation starts a collection and there
is always a finalizer to run, so it is met within seconds when the third ingredient is there."""

from __future__ import annotations

import gc
import threading
import time

_churning = threading.Event()


class _Cycle:
    """Garbage only the cyclic collector frees. Its finalizer releases the GIL, as a socket's close does, and
    leaves the next such garbage behind while the churn goes on, so every collection has a finalizer to run."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        if _churning.is_set():
            _Cycle()
        time.sleep(0.0005)


def churn_threads(seconds: float) -> int:
    """Start and join threads for ``seconds`` while every allocation collects garbage that releases the GIL;
    the number of threads started. The collector's thresholds are restored at the end."""
    thresholds = gc.get_threshold()
    started, end = 0, time.monotonic() + seconds
    _churning.set()
    gc.set_threshold(1, 1, 1)
    try:
        _Cycle()
        while time.monotonic() < end:
            thread = threading.Thread(target=time.sleep, args=(0,))
            thread.start()
            thread.join()
            started += 1
    finally:
        _churning.clear()
        gc.set_threshold(*thresholds)
        gc.collect()
    return started
