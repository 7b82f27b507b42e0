"""QMP on a real QEMU: while another client holds the monitor, asking for the vCPU threads ends within
its deadline with a reason, instead of waiting forever for a greeting that never comes."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from bbrlab.contention.vcpu import VcpuDiscoveryError, qmp_vcpu_threads

pytestmark = pytest.mark.system


@pytest.fixture
def qmp(tmp_path):
    path = str(tmp_path / "qmp.sock")
    proc = subprocess.Popen(["qemu-system-x86_64", "-name", "bbrlab-qmptest,debug-threads=on", "-display", "none",
                             "-nodefaults", "-qmp", f"unix:{path},server=on,wait=off", "-m", "64", "-smp", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "QEMU made no QMP socket"
            time.sleep(0.05)
        yield path
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_vcpu_threads_from_qmp(qmp):
    tids = qmp_vcpu_threads(qmp)
    assert len(tids) == 2 and all(os.path.exists(f"/proc/{t}") for t in tids)


def test_a_busy_monitor_gives_a_clear_error_within_the_deadline(qmp):
    other = socket.socket(socket.AF_UNIX)
    other.connect(qmp)
    assert b'"QMP"' in other.recv(4096)  # the other client has the monitor now
    outcome: list = []

    def ask():
        t0 = time.monotonic()
        try:
            outcome.append(qmp_vcpu_threads(qmp, timeout_s=2))
        except VcpuDiscoveryError as e:
            outcome.append(e)
        outcome.append(time.monotonic() - t0)

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "qmp_vcpu_threads still waiting for QEMU's greeting"
    error, took = outcome
    assert isinstance(error, VcpuDiscoveryError) and "another one connected" in str(error)
    assert 1.5 < took < 5
    other.close()
    assert len(qmp_vcpu_threads(qmp)) == 2  # free again: answered
