"""The deadline mode (#38): constrained (deadline = runtime, the default and the paper's) or implicit (deadline =
period). Checked before anything changes, crossed by a spec, in the run id, the runs table and the run identity,
applied and read back as asked, and records made before it read as constrained with their run ids unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.analysis import runkey, tables
from bbrlab.analysis.contention_view import contention_label
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.cli.main import build_parser
from bbrlab.contention.deadline import ContentionSession
from bbrlab.contention.evidence import ContentionRecord
from bbrlab.contention.limits import check_fits
from bbrlab.contention.sched import SchedPolicy
from bbrlab.contention.schedulers import chrt_set_argv, parse_chrt_show
from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import LocalHost
from bbrlab.scenario.cpumodels import CfsParams, DeadlineParams
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario

from .test_contention import LIMITS_2CPU

IMPLICIT = DeadlineParams("implicit")
SPEC = {"name": "m", "ccas": ["cubic"], "timeslices_ms": [1, 10], "cpu_shares_pct": [25, 100], "rtts_ms": [10],
        "rates_mbit": [100], "repetitions": 1}
DATA = Path(__file__).parents[3] / "data"


def _scenario(c: Contention) -> Scenario:
    return Scenario(Link(rtt_ms=10, rate_mbit=100), c, Flow("cubic"))


# -- the contention -----------------------------------------------------------------------------------------
def test_the_mode_sets_the_deadline_and_nothing_else():
    constrained, implicit = Contention(10, 25), Contention(10, 25, params=IMPLICIT)
    assert constrained.deadline_mode == "constrained" and implicit.deadline_mode == "implicit"
    assert (constrained.runtime_ns, constrained.deadline_ns, constrained.period_ns) == (10_000_000, 10_000_000,
                                                                                        40_000_000)
    assert (implicit.runtime_ns, implicit.deadline_ns, implicit.period_ns) == (10_000_000, 40_000_000, 40_000_000)
    assert implicit.bandwidth == constrained.bandwidth == 0.25  # admission counts the same in both modes
    check_fits(implicit, LIMITS_2CPU, 2)
    assert Contention(1, 25, "cfs-quota").deadline_mode is None


@pytest.mark.parametrize("given, field, words", [
    ({"deadline_mode": "loose"}, "contention.deadline_mode", "one of constrained (deadline = runtime"),
    ({"deadline_mode": 1}, "contention.deadline_mode", "or implicit (deadline = period)"),
    ({"deadline_mode": "implicit", "model": "cfs-quota"}, "contention.deadline_mode",
     "a name with model deadline, none with the others"),
    ({"deadline_mode": "implicit", "model": "none", "cpu_share_pct": 100}, "contention.deadline_mode",
     "with model deadline"),
])
def test_a_bad_mode_is_refused_naming_the_field_and_what_is_allowed(given, field, words):
    with pytest.raises(ValidationError) as e:
        Contention.from_dict({"timeslice_ms": 10, "cpu_share_pct": 25, **given})
    assert e.value.field == field and words in str(e.value)
    with pytest.raises(ValidationError, match="contention.deadline_mode"):
        Contention(10, 25, params=DeadlineParams("loose"))
    with pytest.raises(ValidationError, match="contention.params"):
        Contention(10, 25, "cfs-quota", IMPLICIT)


def test_the_mode_is_kept_at_100_pct_where_nothing_is_applied():
    c = Contention(10, 100, params=IMPLICIT)
    assert c.unlimited and c.bandwidth == 0.0 and c.to_dict()["deadline_mode"] == "implicit"


# -- records and run ids ------------------------------------------------------------------------------------
def test_constrained_records_are_as_before_and_implicit_says_so():
    s = _scenario(Contention(10, 25))
    assert s.to_dict()["contention"] == {"timeslice_ms": 10, "cpu_share_pct": 25}
    assert s.run_id.startswith("cubic-ts10ms-sh25-rtt10ms-100mbit-r00-")
    i = _scenario(Contention(10, 25, params=IMPLICIT))
    assert i.to_dict()["contention"] == {"timeslice_ms": 10, "cpu_share_pct": 25, "deadline_mode": "implicit"}
    assert i.run_id.startswith("cubic-ts10ms-implicit-sh25-rtt10ms-100mbit-r00-")
    assert i.run_id.rsplit("-", 1)[1] != s.run_id.rsplit("-", 1)[1]
    assert Scenario.from_dict(i.to_dict()) == i and Scenario.from_dict(s.to_dict()) == s
    explicit = {"timeslice_ms": 10, "cpu_share_pct": 25, "deadline_mode": "constrained"}
    assert Contention.from_dict(explicit) == Contention(10, 25)  # written out: the same contention, the same id


def _committed_deadline_records(limit: int = 40) -> list[dict]:
    out = []
    for path in sorted(DATA.glob("*/runs/*/record.json")):
        rec = json.loads(path.read_text())
        if "model" not in rec["scenario"]["contention"]:
            out.append(rec)
        if len(out) == limit:
            break
    return out


def test_committed_records_read_as_constrained_with_their_layout_and_run_ids_unchanged():
    records = _committed_deadline_records()
    assert records, "no committed deadline record under data/"
    for rec in records:
        s = Scenario.from_record(rec["scenario"])
        assert s.contention.deadline_mode == "constrained"
        assert json.dumps(s.to_dict()) == json.dumps(rec["scenario"])  # key for key, in order
        assert s.run_id == rec["run_id"]
        contention = rec["metadata"].get("contention")
        if contention:
            assert ContentionRecord.from_dict(contention).to_dict()["requested"] == contention["requested"]


def test_the_record_holds_the_mode_asked_and_the_policy_read_back():
    c = Contention(10, 25, params=IMPLICIT)
    applied = SchedPolicy.deadline(10_000_000, 40_000_000, 40_000_000)
    rec = ContentionRecord(c, "localhost", "syscall", LIMITS_2CPU, {7: SchedPolicy()}, {7: applied}, None)
    d = json.loads(json.dumps(rec.to_dict()))
    assert d["requested"]["deadline_mode"] == "implicit"
    assert {k: d["applied"][0][k] for k in ("tid", "runtime_ns", "deadline_ns", "period_ns")} == {
        "tid": 7, "runtime_ns": 10_000_000, "deadline_ns": 40_000_000, "period_ns": 40_000_000}
    assert ContentionRecord.from_dict(d) == rec


# -- applied and read back ----------------------------------------------------------------------------------
class FakeScheduler:
    """Keeps what is set; reads it back as the kernel would."""

    name = "fake"

    def __init__(self):
        self.policies: dict[int, SchedPolicy] = {}

    def set(self, tid, policy, identity=None):
        self.policies[tid] = policy

    def get(self, tid):
        return self.policies.get(tid, SchedPolicy())


@pytest.mark.parametrize("params, deadline_ns", [(DeadlineParams(), 10_000_000), (IMPLICIT, 40_000_000)])
def test_the_policy_applied_is_the_modes_and_is_read_back(params, deadline_ns):
    session = ContentionSession(LocalHost(), [4242], Contention(10, 25, params=params))
    session.scheduler = FakeScheduler()
    want = SchedPolicy.deadline(10_000_000, deadline_ns, 40_000_000)
    assert session.wanted == want
    session._apply_one(4242)
    assert session.scheduler.get(4242) == want
    assert want.deadline_mode == params.deadline_mode
    assert chrt_set_argv(42, want)[4:8] == ["-D", str(deadline_ns), "-P", "40000000"]  # the remote path's argv


def test_a_read_back_that_differs_in_the_deadline_fails_the_apply():
    class Constraining(FakeScheduler):
        def set(self, tid, policy, identity=None):  # a kernel that kept the deadline at the runtime
            self.policies[tid] = SchedPolicy.deadline(policy.runtime_ns, policy.runtime_ns, policy.period_ns)

    session = ContentionSession(LocalHost(), [4242], Contention(10, 25, params=IMPLICIT))
    session.scheduler = Constraining()
    with pytest.raises(Exception, match="reads back SCHED_DEADLINE runtime=10000000 ns deadline=10000000 ns"):
        session._apply_one(4242)


def test_the_kernels_read_back_names_its_mode():
    shown = parse_chrt_show("pid 9's current scheduling policy: SCHED_DEADLINE\npid 9's current scheduling "
                            "priority: 0\npid 9's current runtime/deadline/period parameters: "
                            "10000000/40000000/40000000\n", nice=0)
    assert shown.deadline_mode == "implicit"
    assert SchedPolicy.deadline(10, 10, 40).deadline_mode == "constrained"
    assert SchedPolicy.deadline(10, 20, 40).deadline_mode == "constrained"  # any deadline short of the period
    assert SchedPolicy().deadline_mode is None


def test_contention_set_takes_the_mode():
    parser = build_parser()
    args = parser.parse_args(["contention", "set", "--timeslice", "10ms", "--share", "25%", "--deadline-mode",
                              "implicit", "--threads", "1"])
    assert args.deadline_mode == "implicit"
    assert parser.parse_args(["contention", "set", "--timeslice", "1ms", "--share", "25%"]).deadline_mode == \
        "constrained"
    with pytest.raises(SystemExit):
        parser.parse_args(["contention", "set", "--timeslice", "1ms", "--share", "25%", "--deadline-mode", "x"])


# -- the spec's dimension -----------------------------------------------------------------------------------
def test_a_spec_without_modes_plans_as_before_and_leaves_the_key_out():
    spec = CampaignSpec.from_dict(SPEC)
    assert spec.deadline_modes == ("constrained",)
    assert "deadline_modes" not in spec.to_dict()
    assert [s.contention for s in spec.grid()] == [Contention(1, 25), Contention(1, 100), Contention(10, 25),
                                                   Contention(10, 100)]


def test_a_spec_crosses_the_modes_with_timeslices_and_shares():
    spec = CampaignSpec.from_dict({**SPEC, "deadline_modes": ["constrained", "implicit"]})
    got = [(c.timeslice_ms, c.deadline_mode, c.cpu_share_pct) for c in (s.contention for s in spec.grid())]
    assert got == [(ts, mode, share) for ts in (1, 10) for mode in ("constrained", "implicit") for share in (25, 100)]
    assert spec.runs == len(spec.plan()) == 8
    assert len({s.run_id for s in spec.plan()}) == 8
    assert spec.to_dict()["deadline_modes"] == ["constrained", "implicit"]
    assert CampaignSpec.from_dict(spec.to_dict()) == spec


def test_the_modes_cross_deadline_only():
    spec = CampaignSpec.from_dict({**SPEC, "cpu_shares_pct": [25], "deadline_modes": ["implicit"],
                                   "contention_models": ["deadline", "cfs-quota", "none"]})
    assert [s.contention for s in spec.grid()] == [
        Contention(1, 25, params=IMPLICIT), Contention(10, 25, params=IMPLICIT),
        Contention(25, 25, "cfs-quota", CfsParams(100)), Contention(1, 100, "none")]


@pytest.mark.parametrize("modes, field", [
    (["constrained", "late"], "deadline_modes[1]"),
    ([3], "deadline_modes[0]"),
    (["implicit", "implicit"], "deadline_modes"),
    ([], "deadline_modes"),
    ("implicit", "deadline_modes"),
])
def test_a_bad_modes_list_is_refused_naming_the_key(modes, field):
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**SPEC, "deadline_modes": modes})
    assert e.value.field == field


def test_a_bad_pair_still_names_the_timeslice_and_share_alone():
    with pytest.raises(ValidationError) as e:
        CampaignSpec.from_dict({**SPEC, "timeslices_ms": [20], "cpu_shares_pct": [0.1],
                                "deadline_modes": ["constrained", "implicit"]})
    assert e.value.field == "cpu_shares_pct[0] with timeslices_ms[0]"


# -- the runs table and the run identity --------------------------------------------------------------------
def test_the_runs_table_has_the_mode_and_the_identity_tells_the_modes_apart():
    assert "deadline_mode" in tables.RUN_COLUMNS and "deadline_mode_applied" in tables.RUN_COLUMNS
    assert "deadline_mode" in runkey.CONTENTION_KEY and "deadline_mode" in runkey.CONTENTION_PARAMETERS
    runs = pd.DataFrame({"contention_mode": ["deadline", "deadline", "none", "none"],
                         "timeslice_ms": [10.0, 10.0, 10.0, 10.0],
                         "deadline_mode": pd.array(["constrained", "implicit", "constrained", "implicit"],
                                                   dtype="string"),
                         "cpu_share_pct": [25.0, 25.0, 100.0, 100.0]})
    ids = runkey.identity(runs)
    assert len(ids.iloc[:2].drop_duplicates()) == 2  # contended: two conditions
    assert len(ids.iloc[2:].drop_duplicates()) == 1  # no policy: the mode means nothing, one condition
    assert runkey.label({"deadline_mode": "implicit"}) == "implicit deadline"
    assert list(contention_label(runs.iloc[:2])) == ["deadline 10 ms", "deadline 10 ms implicit"]


def test_the_applied_mode_is_read_from_the_record():
    from types import SimpleNamespace

    def meta(*policies):
        applied = dict(enumerate(policies))
        return SimpleNamespace(contention=SimpleNamespace(applied=applied))

    implicit, constrained = SchedPolicy.deadline(1, 4, 4), SchedPolicy.deadline(1, 1, 4)
    assert tables._deadline_mode_applied(meta(implicit, implicit)) == "implicit"
    assert tables._deadline_mode_applied(meta(constrained)) == "constrained"
    assert tables._deadline_mode_applied(meta(implicit, constrained)) == "mixed"
    assert tables._deadline_mode_applied(meta(SchedPolicy())) is None
    assert tables._deadline_mode_applied(SimpleNamespace(contention=None)) is None


def test_the_authors_deadline_runs_are_constrained():
    from bbrlab.analysis import authors

    assert authors.contention_of({"deadline_run": "1000000", "deadline_period": "4000000"})["deadline_mode"] == \
        "constrained"
    assert "deadline_mode" not in authors.contention_of({})


# -- the calibration ----------------------------------------------------------------------------------------
def test_an_implicit_run_never_takes_a_constrained_ceiling_and_is_calibrated_as_its_own_point():
    from bbrlab.calibration.plan import CalibrationSpec
    from bbrlab.run.ceiling import PointKey, model_tag

    implicit = _scenario(Contention(10, 25, params=IMPLICIT))
    assert model_tag(implicit.contention) == "ts10ms-implicit" and model_tag(Contention(10, 25)) is None
    assert PointKey.of_scenario(implicit).text == "ts10ms-implicit-sh25-rtt10ms"
    assert PointKey.of_scenario(implicit) != PointKey.of_scenario(_scenario(Contention(10, 25)))
    assert PointKey.of_scenario(_scenario(Contention(10, 100, params=IMPLICIT))).text == "sh100-rtt10ms"
    both = CampaignSpec.from_dict({**SPEC, "timeslices_ms": [10], "deadline_modes": ["constrained", "implicit"]})
    assert [k.text for k in CalibrationSpec.for_campaign(both).points()] == [
        "sh100-rtt10ms", "ts10ms-sh25-rtt10ms", "ts10ms-implicit-sh25-rtt10ms"]
    alone = CampaignSpec.from_dict({**SPEC, "timeslices_ms": [10], "deadline_modes": ["implicit"]})
    cal = CalibrationSpec.for_campaign(alone)
    assert cal.timeslices_ms == () and [k.text for k in cal.points()] == ["sh100-rtt10ms",
                                                                          "ts10ms-implicit-sh25-rtt10ms"]
    assert CalibrationSpec.from_dict(cal.to_dict()) == cal
