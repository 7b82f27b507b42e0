"""The cgroup models' throttling evidence: ``cpu.stat`` of both cgroup versions parsed into one unit, the deltas
a run records, a file that is missing or lacks the counters, and the evidence's JSON with and without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bbrlab.analysis.records_reader import run_row
from bbrlab.contention import cpustat
from bbrlab.contention.cgroups import Hierarchy
from bbrlab.contention.cpustat import CfsThrottling, CpuStat
from bbrlab.contention.evidence import ContentionEvidence
from bbrlab.run.runmeta import RunMetadata

ROOT = Path(__file__).resolve().parents[3]
#: A committed cfs-quota run (made before throttling was recorded).
CFS_RECORD = ROOT / "data/contention-models-local/runs/bbr-cfs100ms-sh25-rtt20ms-20mbit-r00-6f28cad813/record.json"

#: cgroup v1 (this project's host, kernel 6.18): throttled_time and burst_time in nanoseconds.
V1 = "nr_periods 30\nnr_throttled 22\nthrottled_time 1650123456\nnr_bursts 2\nburst_time 20000000\n"
#: cgroup v2 (Debian 12's 6.1 in the sender guest): microseconds, usage lines before.
V2 = ("usage_usec 760000\nuser_usec 750000\nsystem_usec 10000\nnr_periods 30\nnr_throttled 22\n"
      "throttled_usec 1650123\nnr_bursts 0\nburst_usec 0\n")


def test_v1_and_v2_read_into_one_unit():
    assert cpustat.parse(V1, 1) == CpuStat(30, 22, 1650123.456, 2, 20000.0)
    assert cpustat.parse(V2, 2) == CpuStat(30, 22, 1650123.0, 0, 0.0)


def test_a_kernel_without_burst_reads_none_for_it():
    assert cpustat.parse("nr_periods 3\nnr_throttled 1\nthrottled_time 5000\n", 1) == CpuStat(3, 1, 5.0, None, None)


@pytest.mark.parametrize("text, version", [
    ("usage_usec 10\nuser_usec 5\nsystem_usec 5\n", 2),  # v2's root cgroup: no bandwidth counters
    ("", 1), ("nr_periods 3\nnr_throttled 1\n", 1),  # empty; a time missing
    (V1, 2), (V2, 1),  # the other version's unit key is not taken for this one's
])
def test_text_without_the_counters_reads_none(text, version):
    assert cpustat.parse(text, version) is None


def test_an_unknown_version_is_refused():
    with pytest.raises(ValueError, match="1 or 2"):
        cpustat.parse(V1, 3)


def test_the_delta_is_in_milliseconds_and_names_its_cgroup():
    start, end = CpuStat(5, 1, 1000.0, 0, 0.0), CpuStat(35, 23, 1651123.456, 2, 20000.0)
    assert cpustat.between(start, end, "/sys/fs/cgroup/cpu/x") == CfsThrottling(30, 22, 1650.123, 2, 20.0,
                                                                                 "/sys/fs/cgroup/cpu/x")
    assert cpustat.between(None, end, "x") is None and cpustat.between(start, None, "x") is None
    assert cpustat.between(CpuStat(1, 0, 0.0), CpuStat(2, 0, 0.0), "x").nr_bursts is None


@pytest.mark.parametrize("version, text", [(1, V1), (2, V2)])
def test_a_hierarchy_reads_its_cgroups_cpu_stat_and_none_where_it_is_missing(tmp_path, version, text):
    h = Hierarchy(version, tmp_path)
    assert h.cpu_stat(tmp_path) is None  # no cpu.stat (a cgroup removed meanwhile)
    (tmp_path / "cpu.stat").write_text(text)
    assert h.cpu_stat(tmp_path).nr_throttled == 22


def _evidence(throttling: CfsThrottling | None) -> ContentionEvidence:
    return ContentionEvidence("cgroup-v1", True, 25.0, [], None, None, None, [], throttling)


def test_the_evidence_writes_throttling_only_when_measured_and_reads_it_back():
    measured = _evidence(CfsThrottling(30, 22, 1650.123, None, None, "/sys/fs/cgroup/cpu/bbrlab/bbrlab-cfs-1-1"))
    d = measured.to_dict()
    assert d["throttling"] == {"nr_periods": 30, "nr_throttled": 22, "throttled_ms": 1650.123, "nr_bursts": None,
                               "burst_ms": None, "cgroup": "/sys/fs/cgroup/cpu/bbrlab/bbrlab-cfs-1-1"}
    assert ContentionEvidence.from_dict(json.loads(json.dumps(d))) == measured
    assert "throttling" not in _evidence(None).to_dict()
    assert ContentionEvidence.from_dict(_evidence(None).to_dict()).throttling is None


def test_a_committed_cfs_record_reads_without_throttling_and_the_columns_show_it_once_recorded():
    record = json.loads(CFS_RECORD.read_text())
    assert "throttling" not in record["metadata"]["contention"]["evidence"]
    meta = RunMetadata.from_dict(record["metadata"])
    assert meta.contention.evidence.throttling is None and meta.to_dict() == record["metadata"]
    row = run_row(record, {}, "r", meta=meta)
    assert row["cfs_nr_periods"] is None and row["cfs_nr_throttled"] is None and row["cfs_throttled_ms"] is None
    evidence = record["metadata"]["contention"]["evidence"]
    evidence["throttling"] = {"nr_periods": 200, "nr_throttled": 150, "throttled_ms": 14000.5, "nr_bursts": 0,
                              "burst_ms": 0.0, "cgroup": "/sys/fs/cgroup/cpu/bbrlab/bbrlab-cfs-1-1"}
    meta = RunMetadata.from_dict(record["metadata"])
    assert meta.to_dict() == record["metadata"]
    row = run_row(record, {}, "r", meta=meta)
    assert (row["cfs_nr_periods"], row["cfs_nr_throttled"], row["cfs_throttled_ms"]) == (200, 150, 14000.5)
