"""One campaign engine (issue #25): one loop (:func:`bbrlab.campaign.loop.drive`) and its executors.

The loop is driven here by executors that need no testbed: the in-process one with a stand-in run function,
and one that returns its attempts in the reverse order of submission, as a cluster of several testbeds may.
Whatever the executor, each planned run lands once, failed attempts are retried up to ``max_attempts``, an
interruption closes the executor and loses nothing, and the records are the same. The source is read to check
that the loop exists once: no other module of the library keeps its own campaign loop.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

import bbrlab
from bbrlab.campaign import directory
from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.signals import Interrupted
from bbrlab.run import record
from tests.campaign_runs import writing_run

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

BASE = {
    "name": "engine", "ccas": ["cubic", "bbr"], "timeslices_ms": [1, 10], "cpu_shares_pct": [25, 100],
    "rtts_ms": [20], "rates_mbit": [100], "repetitions": 2, "duration_s": 5, "max_attempts": 3,
}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


class Reversed:
    """An executor that runs nothing until asked for results, then finishes the newest submission first (a
    cluster finishes runs in any order), through the in-process executor's own attempt."""

    def __init__(self, run_fn, out: Path, interrupt_after: int | None = None):
        self.inner = campaign.InProcess(run_fn, out)
        self.queue: list[campaign.Attempt] = []
        self.closed = 0
        self.interrupt_after, self.yielded = interrupt_after, 0

    def submit(self, attempt):
        self.queue.append(attempt)

    def finished(self):
        while self.queue:
            if self.interrupt_after is not None and self.yielded >= self.interrupt_after:
                raise Interrupted(2)
            self.yielded += 1
            yield self.inner.run(self.queue.pop())

    def close(self):
        self.closed += 1
        self.queue.clear()


def _records(out: Path, where: str = record.RUNS) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / where).glob(f"*/{record.RECORD_FILE}"))]


def test_any_executor_order_commits_each_run_once_and_retries_failures_to_max_attempts(tmp_path):
    s = spec()
    bad = s.plan()[3].run_id
    calls: list = []
    executor = Reversed(writing_run(calls, {bad}), tmp_path)
    st = campaign.drive(s, tmp_path, executor, options=QUIET)
    assert st.done == s.runs - 1 and st.failed == 1
    assert sorted(r["run_id"] for r in _records(tmp_path)) == sorted(sc.run_id for sc in s.plan() if sc.run_id != bad)
    assert [a for r, a in calls if r == bad] == [1, 2, 3]  # attempts numbered, up to max_attempts
    assert sorted(r["attempt"] for r in _records(tmp_path, record.FAILED)) == [1, 2, 3]
    assert executor.closed == 1
    assert calls[0][0] == s.plan()[-1].run_id  # it really ran them in another order than the plan's


def test_both_executors_make_the_same_records(tmp_path):
    s = spec()

    def strip(r):  # what differs between two runs of the same plan: the times (and the in-process executor's timing)
        meta = {k: v for k, v in r["metadata"].items() if k != "timing"}
        return {k: v for k, v in r.items() if k not in ("started_at", "ended_at")} | {"metadata": meta}

    campaign.drive(s, tmp_path / "a", campaign.InProcess(writing_run([]), tmp_path / "a"), options=QUIET)
    campaign.drive(s, tmp_path / "b", Reversed(writing_run([]), tmp_path / "b"), options=QUIET)
    a, b = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert [strip(r) for r in a] == [strip(r) for r in b] and len(a) == s.runs


def test_in_process_retries_a_failed_run_before_the_runs_after_it(tmp_path):
    s = spec()
    first = s.plan()[0].run_id
    calls: list = []
    campaign.run_campaign(s, tmp_path, writing_run(calls, {first}), options=QUIET)
    assert calls[:3] == [(first, 1), (first, 2), (first, 3)]  # plan order kept, as before the engine


def test_an_interruption_closes_the_executor_and_the_campaign_resumes_exactly(tmp_path):
    s = spec()
    calls: list = []
    executor = Reversed(writing_run(calls), tmp_path, interrupt_after=3)
    with pytest.raises(Interrupted):
        campaign.drive(s, tmp_path, executor, options=QUIET)
    assert executor.closed == 1 and directory.status(tmp_path).done == 3
    again: list = []
    st = campaign.drive(s, tmp_path, Reversed(writing_run(again), tmp_path), options=QUIET)
    assert st.done == s.runs and len(again) == s.runs - 3
    assert not {r for r, _ in again} & {r for r, _ in calls}  # nothing ran twice


def test_failure_streak_aborts_whatever_the_executor(tmp_path):
    s = spec()
    everything = {sc.run_id for sc in s.plan()}
    executor = Reversed(writing_run([], everything), tmp_path)
    with pytest.raises(campaign.CampaignAborted):
        campaign.drive(s, tmp_path, executor,
                       options=CampaignOptions(progress=False, max_consecutive_failures=2))
    assert executor.closed == 1


# -- the loop exists once ----------------------------------------------------------------------------------

LIBRARY = Path(bbrlab.__file__).parent


def _calls_in_library(name: str) -> dict[str, int]:
    """How often each library module calls ``name`` (as a plain name or an attribute)."""
    out: dict[str, int] = {}
    for path in LIBRARY.rglob("*.py"):
        if "guest" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called == name:
                    key = str(path.relative_to(LIBRARY))
                    out[key] = out.get(key, 0) + 1
    return out


def test_the_campaign_loop_exists_once():
    # The streak of failed runs, the progress bar of a campaign and the commit of a record are the loop's;
    # a second loop anywhere would need them again.
    assert _calls_in_library("FailureStreak") == {"campaign/loop.py": 1}
    assert _calls_in_library("_progress_bar") == {"campaign/loop.py": 1}
    commits = _calls_in_library("commit")
    assert set(commits) == {"campaign/loop.py"} and commits["campaign/loop.py"] == 1, commits
    assert set(_calls_in_library("drive")) <= {"campaign/loop.py", "campaign/distributed.py"}


def test_in_process_records_each_attempts_wall_and_the_time_since_the_previous_one(tmp_path):
    s = spec()
    slow = s.plan()[1].run_id
    inner = writing_run([])

    def run(scenario, staging, *, run_id, attempt):
        time.sleep(0.2 if run_id == slow else 0)
        return inner(scenario, staging, run_id=run_id, attempt=attempt) | {"timing": {"run_wall_s": 0.0}}

    campaign.run_campaign(s, tmp_path, run, options=QUIET)
    by_id = {r["run_id"]: r["metadata"]["timing"] for r in _records(tmp_path)}
    first, second = by_id[s.plan()[0].run_id], by_id[slow]
    assert "between_s" not in first and first["run_wall_s"] == 0.0  # the run's own timing is kept
    assert second["attempt_wall_s"] >= 0.2 and 0 <= second["between_s"] < 5
    assert all("between_s" in t for rid, t in by_id.items() if rid != s.plan()[0].run_id)
