"""A campaign run from a notebook cell in JupyterLab, on the suite's local testbed, stopped with the kernel's
interrupt and resumed (issue #31).

A real headless browser (tests/jupyterlab.py) opens a small notebook that calls
:func:`bbrlab.campaign.notebook.run` on a tiny spec: three contended runs of 4 s (the interrupt lands in the
second or third, while its transfer holds the deadline policy). While the cell runs, the page
must show tqdm's progress widget. Once a run is recorded and the vCPU thread is under SCHED_DEADLINE again (the
next run in flight), the test presses the interrupt in the Kernel menu, as a person presses the stop button.
Then: the cell says the campaign stopped and how far it got (no traceback), no deadline policy is left on the
sender's vCPU threads, no qdisc on the emulator's ports, nothing half-written counts. Running all cells again
resumes the campaign to exactly its plan, each run recorded once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from bbrlab.contention.deadline import show_policies
from bbrlab.link import emulator as link
from tests.jupyterlab import (
    click_menu,
    error_outputs,
    open_notebook,
    opened_browser,
    read_page,
    shut_kernels,
    start_all,
    started_lab,
    wait_all_ran,
)
from tests.polling import wait_for

pytestmark = [pytest.mark.system, pytest.mark.testbed]

NOTEBOOK = "campaign.ipynb"
OUT = "runs/tiny"
#: tqdm's notebook bar (an ipywidgets progress bar) as JupyterLab renders it.
PROGRESS = ".widget-progress, .widget-hprogress"
CAMPAIGN_S = 900


def _spec(testbed_name: str) -> dict:
    return {"name": "notebook-tiny", "testbed": testbed_name, "ccas": ["bbr"], "timeslices_ms": [10],
            "cpu_shares_pct": [50], "rtts_ms": [20], "rates_mbit": [10], "buffers_bdp": [1], "repetitions": 3,
            "duration_s": 4, "seed": 1, "max_attempts": 2}


def _notebook() -> dict:
    cells = [
        ("parameters", 'spec = "tiny.yaml"\nout = "runs/tiny"\n'),
        ("run", "from bbrlab.campaign import notebook\n\nstatus = notebook.run(spec, out)\n"),
        ("status", 'import json\n\nprint("STATUS", json.dumps(status.to_dict()))\n'),
    ]
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": cid, "metadata": {"tags": [cid]},
                       "outputs": [], "source": src.splitlines(keepends=True)} for cid, src in cells],
            "metadata": {"kernelspec": {"name": "bbrlab", "display_name": "bbrlab (.venv)", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def _complete(out: Path) -> int:
    return len(list((out / "runs").glob("*/record.json")))


def _qdiscs(testbed) -> dict:
    shown = link.show(testbed.emulator.host, testbed.emulator.ports)
    return {ifname: sorted(q.get("kind") for q in qdiscs) for ifname, qdiscs in shown.items()}


def _under_deadline(testbed) -> bool:
    threads = testbed.sender.vcpu_threads()
    return any(p.is_deadline for p in show_policies(testbed.sender.hypervisor, threads).values())


def _outputs(driver) -> str:
    return "\n".join(read_page(driver, ".jp-OutputArea-output"))


def _tracebacks(driver) -> list[str]:
    return [e for e in error_outputs(driver) if "Traceback" in e or re.search(r"\w+Error\b", e)]


@pytest.fixture
def lab_with_campaign(testbed, tmp_path):
    root = tmp_path / "lab"
    root.mkdir()
    (root / "tiny.yaml").write_text(yaml.safe_dump(_spec(testbed.name)))
    (root / NOTEBOOK).write_text(json.dumps(_notebook(), indent=1))
    with started_lab(root, tmp_path / "jupyter-home") as server:
        yield server


def test_a_notebook_campaign_shows_progress_stops_on_the_kernel_interrupt_restores_and_resumes(
        testbed, lab_with_campaign, tmp_path):
    lab, out = lab_with_campaign, lab_with_campaign.root / OUT
    qdiscs_before = _qdiscs(testbed)
    with opened_browser(tmp_path / "chromium-profile") as browser:
        driver = browser.driver
        try:
            open_notebook(lab, driver, NOTEBOOK)
            start_all(driver)
            wait_for(lambda: read_page(driver, PROGRESS, "className"), "tqdm's progress widget in the cell", 300,
                     poll_s=0.2)
            wait_for(lambda: _complete(out) >= 1 and _under_deadline(testbed),
                     "a run recorded and the next one in flight under SCHED_DEADLINE", CAMPAIGN_S, poll_s=0.1)
            stopped_at = _complete(out)
            click_menu(driver, "Kernel", "kernelmenu:interrupt")
            prompts = wait_all_ran(driver, "the cells to end after the interrupt", 300)
            page = _outputs(driver)
            assert all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), prompts  # the status cell ran too
            assert "stopped:" in page and "Run the cell again to resume" in page, page[-2000:]
            assert not _tracebacks(driver), _tracebacks(driver)
            st = json.loads(re.search(r"STATUS (\{.*\})", page).group(1))
            assert stopped_at <= st["done"] < st["planned"] == 3 and st["running"] == 0

            # The testbed is as it was: no deadline policy, the emulator's qdiscs as before the campaign.
            assert not _under_deadline(testbed)
            assert _qdiscs(testbed) == qdiscs_before

            recorded = {p.name: (p / "record.json").read_text() for p in (out / "runs").iterdir()}
            start_all(driver)
            wait_all_ran(driver, "the resumed campaign to end", CAMPAIGN_S)
            page = _outputs(driver)
            assert not _tracebacks(driver), _tracebacks(driver)
            final = json.loads(re.findall(r"STATUS (\{.*\})", page)[-1])
            assert final["done"] == final["planned"] == 3 and final["failed"] == 0
        finally:
            shut_kernels(lab, NOTEBOOK)
    plan = json.loads((out / "plan.json").read_text())
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == sorted(r["run_id"] for r in plan["runs"])  # exactly the plan: none lost, none twice
    for run_id, text in recorded.items():  # the runs recorded before the interrupt were not run again
        assert (out / "runs" / run_id / "record.json").read_text() == text
    for run_id in runs:
        record = json.loads((out / "runs" / run_id / "record.json").read_text())
        assert record["status"] == "ok" and record["scenario"]["flow"]["cca"] == "bbr"
    assert not _under_deadline(testbed) and _qdiscs(testbed) == qdiscs_before
