"""A contended run that met the host kernel's lost SCHED_DEADLINE replenishment, run once more as a campaign would.

Now and then this host's kernel stops replenishing a deadline reservation: the vCPU thread stays runnable without
CPU, bbrlab's watch restarts the reservation, and the run's checks fail the run (``checks.contention_held``), which a
campaign then retries. Measured on this project's machine: 1 such attempt in the 97 of data/demo (2026-11-28) and 1
in the 257 of data/threshold-search-local (2026-12-01); one in a fresh clone's make test of 2026-12-01 failed the
rsync test below. A test of another mechanism (a copy, a sampler) that makes a contended run with ``run_once``
retries it once for that reason alone, in a directory of its own, and asserts on the run that counted.
"""

from __future__ import annotations

from pathlib import Path

from bbrlab.run.checks import LOST_REPLENISHMENT
from bbrlab.run.runner import run_once


def run_once_as_a_campaign_would(testbed, scenario, out: Path) -> tuple[dict, Path]:
    """``run_once`` into ``out``; when it failed for a lost replenishment alone, once more into ``out``-again.
    Returns the record that counts and its directory."""
    rec = run_once(testbed, scenario, out)
    if rec["status"] != "ok" and LOST_REPLENISHMENT in (rec.get("reason") or ""):
        out = out.with_name(f"{out.name}-again")
        rec = run_once(testbed, scenario, out)
    return rec, out
