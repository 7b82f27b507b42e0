"""The threshold search as a campaign (issue #30, bbrlab.campaign.search), driven by a synthetic run function.

The synthetic run function writes an ``iperf.json`` whose throughput is known from the share: a curve that
recovers (95 of 100 Mbit/s) above a known share and collapses (5 Mbit/s) below it, BBR's at 43 %, Cubic's
at 21 %. The campaign must bracket each edge within its resolution, make the same probes as the pure search
(:func:`bbrlab.campaign.adaptive.run_search`) on the same response, run nothing else, and resume from any
interruption to the same probes and runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bbrlab.campaign import adaptive, directory, search, search_coverage
from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import ValidationError
from bbrlab.core.signals import Interrupted
from bbrlab.run import record
from tests.unit.campaign.test_engine import Reversed

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

SEARCH = {"target": 0.8, "low": 10, "high": 100, "step": 2.5, "resolution": 2.5, "min": 10, "block": 5, "max": 20}
BASE = {"name": "search", "ccas": ["cubic", "bbr"], "timeslices_ms": [10], "rtts_ms": [20], "rates_mbit": [100],
        "search": SEARCH, "duration_s": 5, "max_attempts": 2}
EDGE = {"cubic": 21.0, "bbr": 43.0}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def known_mbit(cca: str, share: float, rep: int) -> float:
    """The synthetic response: recovered at and above the curve's edge, collapsed below; a little spread."""
    return (95.0 if share >= EDGE[cca] else 5.0) + 0.1 * (rep % 4)


def synthetic_run(calls: list, interrupt_at: int | None = None):
    """A synthetic run function writing iperf.json with :func:`known_mbit`; raises :class:`Interrupted` (what a
    signal does) at its ``interrupt_at``-th call."""

    def run(scenario, staging, *, run_id, attempt):
        if interrupt_at is not None and len(calls) + 1 == interrupt_at:
            raise Interrupted(15)
        calls.append(run_id)
        mbit = known_mbit(scenario.flow.cca, scenario.contention.cpu_share_pct, scenario.repetition)
        (staging / "iperf.json").write_text(json.dumps({"end": {"sum_received": {"bits_per_second": mbit * 1e6}}}))
        return {}

    return run


def _response(cca: str):
    """``response(share, n)`` for the pure search: the next ``n`` repetitions of the share."""
    taken: dict[float, int] = {}

    def response(share: float, n: int) -> list[float]:
        first = taken.get(share, 0)
        taken[share] = first + n
        return [known_mbit(cca, share, r) for r in range(first, first + n)]

    return response


def _curves(out: Path) -> dict[str, dict]:
    return {c["curve"]["flow"]["cca"]: c for c in search.read_decisions(out)["decisions"]}


def _verdicts(curve: dict) -> list[dict]:
    """A curve's probes as the pure search states them (share, verdict, runs)."""
    return [{k: p[k] for k in ("share", "verdict", "n")} for p in curve["probes"]]


def test_the_spec_plans_the_lattice_at_max_repetitions_and_round_trips():
    s = spec()
    assert s.cpu_shares_pct == tuple(10 + 2.5 * i for i in range(37)) and s.repetitions == 20
    assert s.runs == 2 * 37 * 20
    assert "cpu_shares_pct" not in s.to_dict() and s.to_dict()["search"]["target"] == 0.8
    assert CampaignSpec.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(("over", "field"), [
    ({"search": {"low": 10}}, "search.target"),
    ({"search": {**SEARCH, "target": 1.2}}, "search.target"),
    ({"search": {**SEARCH, "step": 7}}, "search.step"),
    ({"search": {**SEARCH, "resolution": 1}}, "search.resolution"),
    ({"search": {**SEARCH, "max": 5}}, "search.max"),
    ({"search": {**SEARCH, "shares": [1]}}, "search.shares"),
    ({"cpu_shares_pct": [25, 50]}, "cpu_shares_pct"),
    ({"repetitions": 3}, "repetitions"),
    ({"contention_models": ["cfs-quota"]}, "contention_models"),
])
def test_a_bad_search_is_refused_naming_the_key(over, field):
    with pytest.raises(ValidationError) as e:
        spec(**over)
    assert e.value.field == field and e.value.allowed


def test_with_a_synthetic_run_function_the_search_brackets_each_edge_as_the_pure_search_does(tmp_path):
    s = spec()
    calls: list = []
    st = campaign.run_campaign(s, tmp_path, synthetic_run(calls), options=QUIET)
    curves = _curves(tmp_path)
    plan = adaptive.SearchPlan(target=80, step=2.5, resolution=2.5, min_reps=10, block=5, max_reps=20)
    for cca, edge in EDGE.items():
        c = curves[cca]
        assert c["done"] and c["threshold_low_pct"] < edge <= c["threshold_high_pct"]
        assert c["threshold_high_pct"] - c["threshold_low_pct"] <= 5
        pure = adaptive.run_search(_response(cca), plan)
        assert _verdicts(c) == pure.decisions and c["runs"] == pure.runs()
    decisions = search.read_decisions(tmp_path)
    assert decisions["schema"] == "bbrlab.search/2" and decisions["seed"] == s.seed
    assert [run_id for _, _, run_id in decisions["runs_in_order"]] == calls  # run in the search's order
    for position, round_number, run_id in decisions["runs_in_order"]:
        meta = json.loads((tmp_path / record.RUNS / run_id / record.RECORD_FILE).read_text())["metadata"]
        assert meta["search"] == {"position": position, "round": round_number}
    assert len({run_id.split("-")[0] for run_id in calls[:10]}) == 2  # the two curves' first probes mixed
    error = search_coverage.plan_error(s.search.plan(100.0))
    for c in curves.values():  # each decided probe at 1 - error, the curve at 1 - decided x error
        assert [p["level"] for p in c["probes"]] == [1 - error] * c["decided"] == [1 - error] * len(c["probes"])
        assert c["level"] == pytest.approx(1 - c["decided"] * error)
    assert decisions["coverage"]["joint_level"] == pytest.approx(1 - sum(c["decided"] for c in curves.values()) * error)
    grid_runs = len(EDGE) * 19 * 30  # the paper's way: every 5 % from 10 to 100 at 30 repetitions
    assert len(calls) == st.done == sum(c["runs"] for c in curves.values()) < grid_runs / 5
    assert st.remaining == 0 and st.skipped == s.runs - st.done and st.points == {"curve(s) searching": 0,
                                                                                  "curve(s) done": 2}


def _executor(kind: str, out: Path, run_fn):
    return campaign.InProcess(run_fn, out) if kind == "in-process" else Reversed(run_fn, out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``executor -> (directory, runs in the order run)`` of the search driven to its end without interruption,
    once per executor for all the kill points (it does not depend on them; driving it took half of each case's
    time)."""
    done: dict[str, tuple[Path, list]] = {}

    def get(kind: str) -> tuple[Path, list]:
        if kind not in done:
            out, calls = tmp_path_factory.mktemp(f"whole-{kind}"), []
            campaign.drive(spec(), out, _executor(kind, out, synthetic_run(calls)), options=QUIET)
            done[kind] = (out, calls)
        return done[kind]

    return get


@pytest.mark.parametrize("kill_after", [3, 10, 26, 41])
@pytest.mark.parametrize("executor", ["in-process", "reversed"])
def test_an_interrupted_search_resumes_to_the_same_probes(tmp_path, uninterrupted, kill_after, executor):
    s = spec()

    def make(out, run_fn):
        return _executor(executor, out, run_fn)

    (whole, whole_calls), cut = uninterrupted(executor), tmp_path / "cut"
    first: list = []
    with pytest.raises(Interrupted):
        campaign.drive(s, cut, make(cut, synthetic_run(first, interrupt_at=kill_after + 1)), options=QUIET)
    second: list = []
    campaign.drive(s, cut, make(cut, synthetic_run(second)), options=QUIET)
    assert not set(first) & set(second)
    if executor == "in-process":  # one testbed: the same runs in the same order, across the interruption
        assert first + second == whole_calls

    def committed(out):
        return sorted(p.parent.name for p in (out / record.RUNS).glob("*/record.json"))

    assert committed(cut) == committed(whole)
    assert search.read_decisions(cut) == search.read_decisions(whole)
    plan = directory.load_plan(cut)
    replayed = search.make_gate(None, s.search, [(r.run_id, r.scenario) for r in plan.runs], cut,
                                settled=lambda r: record.is_complete(cut, r))
    assert replayed.to_dict() == search.read_decisions(cut)


def test_the_thresholds_table_and_figure_show_each_interval_beside_the_paper(tmp_path, monkeypatch):
    import subprocess
    import sys

    s = spec(ccas=["bbr", "bbr2b"], timeslices_ms=[1, 10])
    monkeypatch.setitem(EDGE, "bbr2b", 26.0)
    campaign.run_campaign(s, tmp_path, synthetic_run([]), options=QUIET)
    from bbrlab.analysis.thresholds import format_table, threshold_table

    table = threshold_table(tmp_path)
    assert list(zip(table["cca"], table["timeslice_ms"], table["paper_pct"], strict=True)) == [
        ("bbr", 1.0, 45.0), ("bbr", 10.0, 70.0), ("bbr2b", 1.0, 25.0), ("bbr2b", 10.0, 40.0)]
    for r in table.itertuples():
        assert r.low_pct < EDGE[r.cca] <= r.high_pct and r.done and r.target_pct == 80
        assert r.estimate_pct == (r.low_pct + r.high_pct) / 2
    text = format_table(table)
    assert f"({table['low_pct'][0]:g}, {table['high_pct'][0]:g}]" in text
    bbrlab = str(Path(sys.executable).with_name("bbrlab"))
    shown = subprocess.run([bbrlab, "campaign", "thresholds", str(tmp_path), "--figure", str(tmp_path / "t.png")],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert text in shown.stdout and (tmp_path / "t.png").stat().st_size > 5000
    adaptive_dir = tmp_path / "not-a-search"
    (adaptive_dir).mkdir()
    (adaptive_dir / "decisions.json").write_text(json.dumps({"schema": "bbrlab.decisions/1", "rule": {}}))
    refused = subprocess.run([bbrlab, "campaign", "thresholds", str(adaptive_dir)], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0 and "not a threshold search" in refused.stderr
