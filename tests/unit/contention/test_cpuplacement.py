"""Issue 24 item 2: where a testbed's QEMU threads may run, read from /proc for the run record.

Read for real on this process's own threads: on this machine (Python) and through the shell script a lab's
hypervisor host runs (here on a LocalHost, the same script an SSHHost runs); both must agree with the kernel.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from bbrlab.contention import placement as cpuplacement
from bbrlab.core.hosts import LocalHost


def _own(tid: int) -> dict:
    status = Path(f"/proc/{os.getpid()}/task/{tid}/status").read_text()
    cpus = next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list:"))
    return {"cpus_allowed": cpus, "cpuset": Path(f"/proc/{os.getpid()}/task/{tid}/cpuset").read_text().strip()}


def test_every_thread_is_read_here_and_through_the_shell_alike():
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait)
    extra.start()
    try:
        os.sched_setaffinity(extra.native_id, {min(os.sched_getaffinity(0))})  # one thread pinned differently
        here = cpuplacement.local_threads(os.getpid())
        there = cpuplacement.remote_threads(LocalHost(), sorted(here))
    finally:
        stop.set()
        extra.join()
    assert extra.native_id in here and len(here) >= 2
    assert here[extra.native_id]["cpus_allowed"] == str(min(os.sched_getaffinity(0)))
    assert {tid: v for tid, v in here.items() if tid != extra.native_id} == {
        tid: _own(tid) for tid in here if tid != extra.native_id}
    assert there == here
    summary = cpuplacement.summary(here)
    assert summary["threads"] == len(here) and str(min(os.sched_getaffinity(0))) in summary["cpus_allowed"]


def test_a_lab_whose_threads_cannot_be_read_is_recorded_not_fatal():
    class Lab:
        kind, local = "lab", None

        class sender:  # noqa: N801 - the attribute path a testbed has
            class hypervisor:  # noqa: N801
                @staticmethod
                def output(argv):
                    raise OSError("host unreachable")

    assert cpuplacement.of_testbed(Lab(), [1234]) == cpuplacement.QemuCpus(error="OSError: host unreachable")


def test_a_local_testbeds_qemus_and_a_labs_sender_are_written_as_records_hold_them():
    from types import SimpleNamespace

    from bbrlab.core import recordjson

    tid = threading.get_native_id()
    local = SimpleNamespace(kind="local", local=SimpleNamespace(qemu_pids={"sender": os.getpid(), "emulator": os.getpid(),
                                                                          "receiver": None}))
    got = recordjson.to_json(cpuplacement.of_testbed(local, [tid]))
    assert list(got) == ["emulator", "sender"] and list(got["emulator"]) == ["pid", "threads", "cpus_allowed", "cpusets"]
    assert got["sender"]["vcpu_threads"] == {str(tid): _own(tid)}
    lab = SimpleNamespace(kind="lab", local=None, sender=SimpleNamespace(hypervisor=LocalHost()))
    got = recordjson.to_json(cpuplacement.of_testbed(lab, [tid]))
    assert list(got) == ["sender"] and list(got["sender"]) == ["threads", "cpus_allowed", "cpusets", "vcpu_threads"]
    assert recordjson.from_json(cpuplacement.QemuCpus, got).sender.vcpu_threads[str(tid)].cpus_allowed == _own(tid)["cpus_allowed"]
