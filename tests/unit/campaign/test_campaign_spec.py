"""Campaign specs: validation naming the field, grid, order determinism, hostile values, bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bbrlab.campaign import directory
from bbrlab.campaign import loop as campaign
from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.spec import CampaignSpec, load_spec
from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.run import record
from bbrlab.run.runmeta import RunMetadata
from tests.campaign_runs import writing_run

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

ROOT = Path(__file__).resolve().parents[3]

BASE = {
    "name": "t", "ccas": ["cubic", "bbr"], "timeslices_ms": [1, 10], "cpu_shares_pct": [25, 100],
    "rtts_ms": [20], "rates_mbit": [100], "repetitions": 3, "duration_s": 5,
}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


def test_defaults_from_the_issue():
    s = CampaignSpec.from_dict({k: v for k, v in BASE.items() if k not in ("repetitions", "duration_s")})
    assert s.repetitions == 30 and s.duration_s == 20 and s.sample_ms is None and s.sampler == "bpf"
    assert s.order == "blocked-random" and s.seed == 1 and s.buffers_bdp == (1.0,) and s.losses_pct == (0.0,)


def test_grid_size_and_parameters():
    s = spec()
    grid = s.grid()
    assert len(grid) == 2 * 2 * 2
    assert {g.flow.cca for g in grid} == {"cubic", "bbr"}
    assert all(g.flow.params.duration_s == 5 and g.link.rate_mbit == 100 and g.link.buffer_bdp == 1 for g in grid)
    assert len({g.run_id for g in s.plan()}) == 8 * 3


@pytest.mark.parametrize("order", ["blocked-random", "sequential", "random"])
def test_order_is_deterministic_and_complete(order):
    a, b = spec(order=order).plan(), spec(order=order).plan()
    assert [x.run_id for x in a] == [x.run_id for x in b]
    assert sorted(x.run_id for x in a) == sorted(x.run_id for x in spec(order="sequential").plan())


def test_blocked_random_blocks_are_permutations_and_seed_matters():
    runs = spec().plan()
    for r in range(3):
        block = runs[r * 8:(r + 1) * 8]
        assert {x.repetition for x in block} == {r}
    grid_ids = [g.run_id for g in spec().grid()]
    firsts = [[x.run_id for x in runs[r * 8:(r + 1) * 8]] for r in range(3)]
    assert sorted(firsts[0]) == sorted(grid_ids)
    assert [x.run_id for x in spec(seed=2).plan()] != [x.run_id for x in runs]


def test_sequential_keeps_repetitions_together():
    runs = spec(order="sequential").plan()
    assert [x.repetition for x in runs[:3]] == [0, 1, 2]
    assert len({(x.flow.cca, x.contention) for x in runs[:3]}) == 1


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"cpu_shares_pct": [25, 40, 0]}, "cpu_shares_pct[2]"),
        ({"cpu_shares_pct": [25, 101]}, "cpu_shares_pct[1]"),
        ({"timeslices_ms": [1, -3]}, "timeslices_ms[1]"),
        ({"rtts_ms": ["ten"]}, "rtts_ms[0]"),
        ({"rates_mbit": [0]}, "rates_mbit[0]"),
        ({"buffers_bdp": [1, 0]}, "buffers_bdp[1]"),
        ({"losses_pct": [150]}, "losses_pct[0]"),
        ({"streams": [1, 2.5]}, "streams[1]"),
        ({"streams": [True]}, "streams[0]"),
        ({"ccas": ["cubic", "BBR"]}, "ccas[1]"),
        ({"ccas": []}, "ccas"),
        ({"ccas": "bbr"}, "ccas"),
        ({"repetitions": 0}, "repetitions"),
        ({"duration_s": 0.5}, "duration_s"),
        ({"sample_ss_ms": 0}, "sample_ss_ms"),
        ({"sample_ms": 0}, "sample_ms"),
        ({"sample_ms": 10, "sampler": "perf"}, "sampler"),
        ({"sample_ss_ms": 10, "sampler": "bpf"}, "sample_ss_ms"),
        ({"order": "shuffled"}, "order"),
        ({"seed": -1}, "seed"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"name": "../etc"}, "name"),
        ({"typo_key": 1}, "typo_key"),
        ({"cpu_shares_pct": [25, 25]}, "cpu_shares_pct"),
        ({"timeslices_ms": [20], "cpu_shares_pct": [0.1]}, "cpu_shares_pct[0] with timeslices_ms[0]"),
    ],
)
def test_bad_values_name_the_field(over, field):
    with pytest.raises(ValidationError) as e:
        spec(**over)
    assert e.value.field == field
    assert field in str(e.value)


def test_missing_required_key():
    data = dict(BASE)
    del data["rtts_ms"]
    with pytest.raises(ValidationError, match="rtts_ms"):
        CampaignSpec.from_dict(data)


@pytest.mark.parametrize("hostile", ["bbr; touch /tmp/x", "$(id)", "bbr\ntouch /tmp/x", "`id`", "-C"])
def test_hostile_cca_refused(hostile):
    with pytest.raises(ValidationError) as e:
        spec(ccas=["cubic", hostile])
    assert e.value.field == "ccas[1]"


@pytest.mark.parametrize("hostile", ["x; rm -rf /", "$(id)", "a\nb", ""])
def test_hostile_name_refused(hostile):
    with pytest.raises(ValidationError, match="name"):
        spec(name=hostile)


def test_testbed_with_newline_refused():
    with pytest.raises(ValidationError, match="testbed"):
        spec(testbed="local\n$(id)")


def test_shipped_specs_are_valid():
    files = sorted((ROOT / "specs").glob("*.yaml"))
    assert files, "specs/ has no campaign specs"
    for path in files:
        s = load_spec(path)
        assert s.grid(), path


def test_yaml_error_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ValidationError, match="spec"):
        load_spec(bad)
    with pytest.raises(BbrlabError, match="cannot read"):
        load_spec(tmp_path / "absent.yaml")


# -- bookkeeping: the campaign loop with a run function that writes real files -------------

def test_campaign_runs_each_once_and_resume_skips_done(tmp_path):
    s = spec(repetitions=1)
    calls: list = []
    st = campaign.run_campaign(s, tmp_path, writing_run(calls), options=QUIET)
    assert st.done == st.planned == 8 and st.remaining == 0
    assert len(calls) == 8
    again: list = []
    campaign.run_campaign(s, tmp_path, writing_run(again), options=QUIET)
    assert again == []
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["schema"] == "bbrlab.plan/1" and len(plan["runs"]) == 8
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(r["run_id"] for r in plan["runs"])


def test_failed_runs_recorded_and_retried_boundedly(tmp_path):
    s = spec(repetitions=1, max_attempts=2)
    bad = s.plan()[3].run_id
    calls: list = []
    st = campaign.run_campaign(s, tmp_path, writing_run(calls, {bad}), options=QUIET)
    assert [c for c in calls if c[0] == bad] == [(bad, 1), (bad, 2)]
    assert st.to_dict() == {"campaign": "t", "planned": 8, "done": 7, "failed": 1, "failed_attempts": 2, "running": 0,
                  "remaining": 0}
    failed = record.load_record(tmp_path / "failed" / f"{bad}.a2")
    assert failed["status"] == "failed" and "receiver unreachable" in failed["reason"]
    # resuming does not retry a run whose attempts are used up
    again: list = []
    campaign.run_campaign(s, tmp_path, writing_run(again), options=QUIET)
    assert again == []


def test_consecutive_failures_abort_and_retry_failed_resumes(tmp_path):
    s = spec(repetitions=1, max_attempts=1)
    everything = {x.run_id for x in s.plan()}
    calls: list = []
    with pytest.raises(campaign.CampaignAborted, match="3 runs in a row"):
        campaign.run_campaign(s, tmp_path, writing_run(calls, everything),
                              options=CampaignOptions(progress=False, max_consecutive_failures=3))
    assert len(calls) == 3  # stopped instead of burning the attempts of all 8 runs
    st = directory.status(tmp_path)
    assert st.failed == 3 and st.remaining == 5
    again: list = []
    st = campaign.run_campaign(s, tmp_path, writing_run(again),
                               options=CampaignOptions(progress=False, retry_failed=True))
    assert st.done == 8 and st.failed == 0
    assert sorted(a for _, a in again) == [1] * 5 + [2] * 3  # the failed ones continue their numbering


def test_half_written_runs_are_cleared_not_counted(tmp_path):
    s = spec(repetitions=1)
    directory.prepare(s, tmp_path)
    victim = s.plan()[0].run_id
    half = tmp_path / ".tmp" / f"{victim}.999999"
    half.mkdir(parents=True)
    (half / "iperf.json").write_text("{")
    assert directory.status(tmp_path).done == 0
    calls: list = []
    campaign.run_campaign(s, tmp_path, writing_run(calls), options=QUIET)
    assert not (tmp_path / ".tmp").exists() or not any((tmp_path / ".tmp").iterdir())
    assert (victim, 1) in calls


def test_other_campaign_in_directory_refused(tmp_path):
    directory.prepare(spec(), tmp_path)
    with pytest.raises(BbrlabError, match="different campaign"):
        directory.prepare(spec(seed=7), tmp_path)
    assert yaml.safe_load((tmp_path / "spec.yaml").read_text())["seed"] == 1


def test_commit_refuses_duplicates(tmp_path):
    s = spec().plan()[0]
    rec = record.build_record(run_id=s.run_id, campaign="t", status="ok", reason=None, attempt=1,
                              started_at="a", ended_at="b", scenario=s, metadata=RunMetadata())
    record.commit(record.staging_dir(tmp_path, s.run_id), tmp_path, rec)
    with pytest.raises(BbrlabError, match="already exists"):
        record.commit(record.staging_dir(tmp_path, s.run_id), tmp_path, rec)


# -- hostile values through the CLI --------------------------------------------------------

def _spec_file(tmp_path, **over) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**BASE, **over}))
    return path


@pytest.mark.parametrize("verb", ["plan", "run"])
def test_cli_refuses_hostile_cca_before_anything_runs(tmp_path, capsys, verb):
    from bbrlab.cli.main import main

    marker = tmp_path / "pwned"
    spec_path = _spec_file(tmp_path, ccas=["cubic", f"bbr; touch {marker}"])
    argv = ["campaign", verb, str(spec_path)] + (["--out", str(tmp_path / "out")] if verb == "run" else [])
    assert main(argv) == 1
    assert "ccas[1]" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_cli_passes_hostile_testbed_name_literally(tmp_path, capsys):
    """A testbed value with shell syntax is a (missing) testbed name, never a command."""
    from bbrlab.cli.main import main

    marker = tmp_path / "pwned"
    spec_path = _spec_file(tmp_path, testbed=f"$(touch {marker})")
    assert main(["campaign", "run", str(spec_path), "--out", str(tmp_path / "out")]) == 1
    assert "pwned" in capsys.readouterr().err  # the error quotes the name it could not find
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_cli_status_json(tmp_path, capsys):
    from bbrlab.cli.main import main

    campaign.run_campaign(spec(repetitions=1), tmp_path, writing_run([]), options=QUIET)
    assert main(["campaign", "status", str(tmp_path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["planned"] == 8 and st["done"] == 8 and st["running"] == 0


def test_failure_reason_says_where_a_bare_error_came_from():
    from bbrlab.run.runmeta import failure_reason

    def read_channel():
        raise EOFError()

    try:
        read_channel()
    except EOFError as e:
        reason = failure_reason(e)
    assert reason.startswith("EOFError: ") and "in read_channel" in reason and "test_campaign_spec.py:" in reason


def test_sampler_choice_and_the_older_key():
    assert spec(sample_ms=10).plan()[0].flow.sampler == "bpf"
    assert spec(sample_ms=10, sampler="netlink").plan()[0].flow.sampler == "netlink"
    older = spec(sample_ss_ms=100)
    assert (older.sample_ms, older.sampler) == (100, "ss")
    # an ss-sampled or unsampled flow serialises as before the samplers had a choice: same run ids
    assert older.plan()[0].to_dict()["flow"] == {"cca": older.ccas[0], "duration_s": older.duration_s,
                                                  "streams": 1, "sample_ss_ms": 100}
    assert "sample_ss_ms" in spec().plan()[0].to_dict()["flow"]
    assert spec(sample_ms=10).plan()[0].to_dict()["flow"]["sampler"] == "bpf"
