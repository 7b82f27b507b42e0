"""The suite's time budget, per test file: what each file took in this session against what it may take.

``make test`` has 30 minutes on a 2-core machine, installs included (issue 35). Each file's share is written in
:data:`BUDGET_FILE` (``tests/time-budget.json``: seconds per file, measured on this project's machine under
the suite's own load, with room for a machine that runs 1.6x slower). At the end of a session the terminal
summary prints every file that took more than a few seconds, its time, its budget and the total against
:data:`SUITE_BUDGET_S`; a file over its budget, or one with no budget, is marked. Nothing fails on time (a timed
assertion would be a flaky test): the table is for the next change to keep the suite inside its budget.

A file's time is the sum of its tests' setup, call and teardown; a session fixture (the testbed's boot) counts
in the file of the first test that asked for it, which the table names as such. ``make test`` runs in two
sessions: the tests that touch no real system on two workers (pytest-xdist; their times then add up to more than
the wall time, and the table says so), then the real-system tests one at a time; each prints its own table.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

BUDGET_FILE = Path(__file__).with_name("time-budget.json")
#: The real-system part of ``make test`` (``pytest -m "system and not slow"``) [s]: 30 minutes less the installs, the
#: image build and the first part (the tests that touch no real system: about 100 s on two workers).
SUITE_BUDGET_S = 1500.0
#: Files that took less than this are left out of the table [s].
SHOWN_FROM_S = 5.0


def load_budget(path: Path = BUDGET_FILE) -> dict[str, float]:
    """``{file: seconds}`` from the budget file (empty when there is none)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.get("files_s", {}).items()}


class TimeBudget:
    """Collects each file's time from the test reports and prints the table at the end."""

    def __init__(self, budget: dict[str, float]):
        self.budget = budget
        self.spent: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.spent[report.nodeid.split("::", 1)[0]] += report.duration

    def rows(self) -> list[tuple[str, float, float | None]]:
        """``(file, spent_s, budget_s)``, the costliest first, for files shown in the table."""
        rows = [(f, s, self.budget.get(f)) for f, s in self.spent.items() if s >= SHOWN_FROM_S]
        return sorted(rows, key=lambda r: -r[1])

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        total = sum(self.spent.values())
        tr.write_sep("=", f"time budget per file ({BUDGET_FILE.name})")
        for file, spent, budget in self.rows():
            mark = "no budget" if budget is None else ("OVER" if spent > budget else "")
            shown = "-" if budget is None else f"{budget:7.0f}"
            tr.write_line(f"{spent:8.1f} s  budget {shown} s  {file}  {mark}".rstrip())
        workers = tr.config.getoption("numprocesses", None) or 0
        if isinstance(workers, int) and workers > 1:  # the first part: its files' times overlap
            tr.write_line(f"{total:8.1f} s  in all ({len(self.spent)} files, summed over {workers} workers: more "
                          "than the wall time)")
            return
        state = "OVER" if total > SUITE_BUDGET_S else "within"
        tr.write_line(f"{total:8.1f} s  in all ({len(self.spent)} files), {state} the suite's {SUITE_BUDGET_S:.0f} s")


def pytest_configure(config):
    config.pluginmanager.register(TimeBudget(load_budget()), "bbrlab-time-budget")
