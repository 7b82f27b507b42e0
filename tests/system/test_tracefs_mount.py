"""The vCPU trace mounts tracefs itself on a machine that has not (a CI runner, a minimal host): the suite's
machines do not mount it at boot, and every sampled run traces the sender's vCPU by default."""

from __future__ import annotations

import os
import subprocess

import pytest

from bbrlab.core.hosts import LocalHost
from bbrlab.sampling import vcputrace

pytestmark = pytest.mark.system


def test_a_missing_tracefs_is_mounted_and_a_present_one_left_alone():
    if os.path.ismount(vcputrace.TRACEFS):
        gone = subprocess.run(["umount", vcputrace.TRACEFS], capture_output=True, text=True)
        assert gone.returncode == 0, f"tracefs busy at {vcputrace.TRACEFS}: {gone.stderr}"
    assert not os.path.isdir(vcputrace.INSTANCES)
    assert vcputrace.ensure_tracefs(LocalHost()) is True
    assert os.path.ismount(vcputrace.TRACEFS) and os.path.isdir(vcputrace.INSTANCES)
    assert vcputrace.ensure_tracefs(LocalHost()) is False  # mounted: nothing to do
