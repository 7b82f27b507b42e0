"""A testbed worker does not run Dask's statistical profiler, which deadlocks a Python 3.11 worker that starts
threads (CPython gh-106883, dask/distributed#8616): issue 35's hang, a worker's task thread stuck in
``Thread.start()`` for 10 min 46 s while its main thread was in ``Worker.trigger_profile``.

The profiler calls ``sys._current_frames()`` every 10 ms; that call holds the interpreter's thread-list lock
while it allocates, an allocation may run the cyclic collector, a finalizer releases the GIL, and a thread
that is being started (or ends) takes the GIL and waits for the thread-list lock: neither ever moves, and
no thread of the process (the command's timeout timer included) runs Python again."""

from __future__ import annotations

import os
import signal

import pytest

from tests.thread_churn import churn_threads

pytestmark = pytest.mark.system

#: Seconds of thread churn. With the profiler on, a worker of this machine deadlocked within it in 3 of 3 tries.
CHURN_S = 10.0


def test_a_testbed_worker_starting_threads_does_not_deadlock(tmp_path):
    from distributed import Client

    from bbrlab.campaign import distributed as d
    from tests.engine_runs import slow_run

    with d.local_cluster(["a"], run_function=slow_run) as cluster, Client(cluster) as client:
        d.wait_for_workers(client, 1)
        (address,) = d.testbed_workers(client)
        pid = client.run(os.getpid, workers=[address])[address]
        profiling = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks, workers=[address])
        future = client.submit(churn_threads, CHURN_S, pure=False)
        try:
            started = future.result(timeout=CHURN_S + 30)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)  # deadlocked: nothing in it can end it, and the cluster must close
            pytest.fail(f"the worker deadlocked starting threads (its profiler on: {profiling[address]})")
    assert started > 100
    assert profiling[address] is False
