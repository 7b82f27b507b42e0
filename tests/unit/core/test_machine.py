"""The machine a record names (bbrlab.core.machine): parsed from this machine's own files for real, the raw ids
never written, and the runs table's machine columns (<NA> for records made before bbrlab named the machine)."""

from __future__ import annotations

import copy
import json
import os
import platform
import re
from pathlib import Path

import pandas as pd

from bbrlab.analysis import records_reader
from bbrlab.core import machine
from bbrlab.core.hosts import LocalHost

ROOT = Path(__file__).parents[3]
DEMO_RUN = sorted((ROOT / "data" / "fq-local" / "runs").iterdir())[0]  # recorded before records named the machine

SYNTHETIC_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz
cpu MHz\t\t: 2999.000

processor\t: 1
model name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz
cpu MHz\t\t: 1001.000
"""


def test_synthetic_cpuinfo_gives_model_mean_speed_and_count():
    assert machine.parse_cpuinfo(SYNTHETIC_CPUINFO) == ("Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz", 2000.0, 2)


def test_synthetic_label_prefers_nominal_then_maximum_then_current_to_10_mhz():
    assert machine.label("X", 2100.0, 3900.0, 2999.0) == "X @ 2100 MHz"
    assert machine.label("X", None, 3900.0, 2999.0) == "X @ 3900 MHz"
    assert machine.label("AMD EPYC", None, None, 2596.138) == "AMD EPYC @ 2600 MHz"
    assert machine.label(None, None, None, None) == "unknown CPU @ unknown speed"
    files = {"/proc/cpuinfo": SYNTHETIC_CPUINFO, "/etc/machine-id": "0123456789abcdef0123456789abcdef", "uname": "6.1.0"}
    m = machine.of_files(files)
    assert m.cpu_mhz_nominal == 2100.0 and m.label == "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz @ 2100 MHz"
    assert m.machine_id_source == "/etc/machine-id" and m.boot_id is None and m.kernel == "6.1.0"


def test_this_machine_is_read_for_real_and_its_ids_are_not_written_raw():
    m = machine.measure(LocalHost("hypervisor"))
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    assert m.cpu_model == (" ".join(model.group(1).split()) if model else None)
    assert m.cpus == len(re.findall(r"^processor\s*:", cpuinfo, re.M)) == os.cpu_count()
    assert m.kernel == platform.release()
    raw_id = Path("/etc/machine-id").read_text().strip()
    raw_boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert m.machine_id == machine.anonymised(raw_id) and re.fullmatch(r"[0-9a-f]{16}", m.machine_id)
    assert m.boot_id == machine.anonymised(raw_boot)
    written = json.dumps(m.to_dict())
    assert raw_id not in written and raw_boot not in written and raw_id[:16] not in written
    assert m.label.startswith(f"{m.cpu_model} @ ") and m.label.endswith(" MHz")


def _row(record: dict) -> dict:
    report = json.loads((DEMO_RUN / "iperf.json").read_text())
    return records_reader.run_row(record, records_reader.iperf_summary(report), str(DEMO_RUN))


def test_runs_table_reads_the_machine_and_na_for_a_committed_record_made_before_it():
    """data/fq-local's records predate the machine: its three columns read <NA>; the same record with a machine reads
    its label, ids and the sender boot it already carried."""
    record = json.loads((DEMO_RUN / "record.json").read_text())
    old = _row(record)
    assert all(pd.isna(old[c]) for c in ("machine", "machine_id", "host_boot_id"))
    assert old["sender_boot_id"] == record["metadata"]["testbed"]["sender_boot_id"]
    named = copy.deepcopy(record)
    m = machine.measure(LocalHost("hypervisor"))
    named["metadata"]["testbed"]["machine"] = m.to_dict()
    row = _row(named)
    assert (row["machine"], row["machine_id"], row["host_boot_id"]) == (m.label, m.machine_id, m.boot_id)
