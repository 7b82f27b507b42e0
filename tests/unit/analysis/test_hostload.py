"""The host load of a data folder's runs (bbrlab.analysis.hostload) on the committed data/: the table in
data/README.md's section "Host load during the runs" is what ``summarise`` prints, row for row, and the
summary of one folder agrees with its records read here without the module."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from bbrlab.analysis import hostload
from bbrlab.cli.main import main
from bbrlab.contention.hostcpu import CpuLoad, HostBusy
from bbrlab.contention.outside import OutsideLoad
from bbrlab.run.runmeta import RunMetadata

DATA = Path(__file__).resolve().parents[3] / "data"
ROW = re.compile(r"^\| `(?P<folder>[^`]+)/` \| `(?P<measure>\w+)` \| (?P<median>[\d.]+) "
                 r"\| (?P<lo>[\d.]+)-(?P<hi>[\d.]+) \| (?P<runs>\d+) \|$")


def _readme_rows() -> dict[str, dict]:
    text = (DATA / "README.md").read_text()
    section = text[text.index("## Host load during the runs"):]
    return {m["folder"]: m.groupdict() for m in map(ROW.match, section.splitlines()) if m}


def test_the_readme_table_is_what_the_records_give():
    rows = _readme_rows()
    loads = {str(Path(h.folder).relative_to("data")): h for h in hostload.summarise_folders(DATA)}
    assert set(rows) == set(loads)
    for folder, row in rows.items():
        h = loads[folder]
        assert (row["measure"], int(row["runs"])) == (h.measure, h.runs), folder
        assert (float(row["median"]), float(row["lo"]), float(row["hi"])) == (
            round(h.median_pct, 1), round(h.min_pct, 1), round(h.max_pct, 1)), folder


def test_one_folder_read_by_hand():
    folder = DATA / "fq-local"
    busy = []
    for path in (folder / "runs").glob("*/record.json"):
        record = json.loads(path.read_text())
        if record["status"] == "ok":
            busy.append(record["metadata"]["cpu_load"]["sender_hypervisor"]["busy_pct"])
    h = hostload.summarise(folder)
    assert (h.measure, h.runs, h.ok_runs) == ("host_busy_pct", len(busy), len(busy))
    assert (h.median_pct, h.min_pct, h.max_pct) == (round(statistics.median(busy), 2), min(busy), max(busy))


def _host(busy_pct):
    return HostBusy(busy_pct, None, None, cpus=4, ticks=400)


def _outside(other_busy_pct):
    return OutsideLoad(other_busy_pct, None, None, None, None, None, window_s=10.0, cpus=4, ticks=4000,
                       other_ticks=0, testbed_ticks=0, testbed_processes=3, top=[])


def test_new_records_are_summarised_by_the_cpu_outside_the_testbed(tmp_path):
    for i, (other, busy) in enumerate([(2.0, 60.0), (4.0, 70.0), (30.0, 90.0)]):
        run = tmp_path / "c" / "runs" / f"r{i}"
        run.mkdir(parents=True)
        meta = RunMetadata(host_other=_outside(other), cpu_load=CpuLoad(_host(None), _host(busy)))
        run.joinpath("record.json").write_text(json.dumps({"status": "ok", "metadata": meta.to_dict()}))
    (h,) = hostload.summarise_folders(tmp_path / "c")
    assert (h.measure, h.median_pct, h.min_pct, h.max_pct, h.runs) == (
        "host_other_busy_pct", 4.0, 2.0, 30.0, 3)


def test_the_command_prints_a_line_per_folder(capsys):
    assert main(["hostload", str(DATA / "fq-local")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fq-local: host CPU, the testbed included (host_busy_pct): median ")
