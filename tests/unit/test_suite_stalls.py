"""The suite's own check for a run that met the host's lost deadline replenishment (tests/stalls.py), on files."""

from __future__ import annotations

import json
import os

from bbrlab.run.checks import LOST_REPLENISHMENT
from tests.stalls import met_during


def _record(path, status: str, reason: str | None, mtime_s: float):
    path.mkdir(parents=True)
    (path / "record.json").write_text(json.dumps({"status": status, "reason": reason}))
    os.utime(path / "record.json", (mtime_s, mtime_s))


def test_only_failed_records_written_since_the_start_that_name_the_lost_replenishment(tmp_path):
    stall = f"vCPU thread 7 stayed runnable without CPU for 2.0 s under SCHED_DEADLINE ({LOST_REPLENISHMENT}; ...)"
    _record(tmp_path / "a" / "failed" / "r1.a1", "failed", stall, 1000.0)
    _record(tmp_path / "a" / "failed" / "r2.a1", "failed", stall, 500.0)  # before the test started
    _record(tmp_path / "b" / "failed" / "r3.a1", "failed", "receiver unreachable", 1000.0)
    _record(tmp_path / "b" / "runs" / "r4", "ok", None, 1000.0)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "record.json").write_text("{half")
    got = met_during(tmp_path, 900.0)
    assert len(got) == 1 and got[0].startswith(str(tmp_path / "a" / "failed" / "r1.a1")) and stall in got[0]
    assert met_during(tmp_path, 1001.0) == []
