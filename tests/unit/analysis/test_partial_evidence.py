"""A run is ``ok`` only when its evidence is whole (issue 35, item 4; docs/run-record.md, "When the evidence is
partial"): a sampler cut short, cut at the byte cap or exiting non-zero fails the run; dropped samples, samples
short of the transfer, a capped or lossy trace and a schedstat disagreement are quality columns of the ``runs``
table that the figures drawing those samples leave out by default. Real sampler logs (tests/fixtures/sockdiag,
data/demo-sampled) cut or edited; real processes for the byte cap."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from bbrlab.analysis import data, timeline
from bbrlab.analysis.plots import socket_state
from bbrlab.core.commands import CAPPED_EXIT
from bbrlab.core.errors import RunFailed
from bbrlab.core.hosts import LocalHost
from bbrlab.run import checks

ROOT = Path(__file__).parents[3]
FIX = ROOT / "tests" / "fixtures" / "sockdiag"
DEMO = ROOT / "data" / "demo-sampled" / "runs"
BPF_PORT = 28900  # the data stream of live-bbr-both.bpf.log.gz (BBR)


def _fixture(name: str) -> str:
    raw = (FIX / name).read_bytes()
    return (gzip.decompress(raw) if name.endswith(".gz") else raw).decode()


def _sampled(tmp_path: Path, text: str, kind: str = "bpf", **kw) -> SimpleNamespace:
    (tmp_path / "samples.log").write_text(text)
    return SimpleNamespace(kind=kind, log_file=tmp_path / "samples.log", binary=None, complete=True,
                           **{"exit_code": 0, "capped": False, **kw})


def test_a_whole_bpf_log_passes_the_checks(tmp_path):
    summary, seen = checks.samples(_sampled(tmp_path, _fixture("live-bbr-both.bpf.log.gz")), [BPF_PORT], "bbr", 10)
    assert summary.ended == "stop_file" and seen == ["bbr"]


def test_a_sampler_killed_before_its_footer_fails_the_run(tmp_path):
    text = _fixture("live-bbr-both.bpf.log.gz")
    cut = "\n".join(line for line in text.splitlines() if not line.startswith("# end ")) + "\n"
    with pytest.raises(RunFailed, match="ended by 'killed \\(no footer\\)', not by its stop file"):
        checks.samples(_sampled(tmp_path, cut), [BPF_PORT], "bbr", 10)


def test_a_netlink_sampler_ended_by_its_deadline_fails_the_run(tmp_path):
    text = _fixture("live-bbr.sockdiag.log.gz").replace("reason=stop_file", "reason=deadline")
    with pytest.raises(RunFailed, match="ended by 'deadline'"):
        checks.samples(_sampled(tmp_path, text, kind="netlink"), [28900], "bbr", 10)


def test_a_sampler_that_exited_non_zero_fails_the_run(tmp_path):
    sampled = _sampled(tmp_path, _fixture("live-bbr-both.bpf.log.gz"), exit_code=4)
    with pytest.raises(RunFailed, match="exited with 4"):
        checks.samples(sampled, [BPF_PORT], "bbr", 10)


def test_a_log_cut_at_its_byte_cap_fails_the_run(tmp_path):
    sampled = _sampled(tmp_path, _fixture("live-bbr-both.bpf.log.gz"), capped=True, exit_code=CAPPED_EXIT)
    with pytest.raises(RunFailed, match="reached its cap"):
        checks.samples(sampled, [BPF_PORT], "bbr", 10)


def test_missed_ticks_leave_the_run_ok(tmp_path):
    """The netlink sampler missed 1967 of 3802 ticks in this real contended run: the samples it took are whole."""
    text = _fixture("live-bbr-both.sockdiag.log.gz")
    summary, _ = checks.samples(_sampled(tmp_path, text, kind="netlink"), [28900], "bbr", 2)
    assert summary.missed_ticks == 1967


def test_a_stream_stops_at_its_byte_cap(tmp_path):
    """A real command writing without end: the file gets exactly the cap, the command ends, wait says capped."""
    out = tmp_path / "out.log"
    stream = LocalHost().stream(["sh", "-c", "yes 0123456789abcdef"], out, max_bytes=200_000)
    try:
        assert stream.wait(30) == CAPPED_EXIT
    finally:
        stream.close()
    assert stream.capped and out.stat().st_size == 200_000


def test_a_stream_under_its_cap_keeps_its_exit_code(tmp_path):
    out = tmp_path / "out.log"
    stream = LocalHost().stream(["sh", "-c", "printf 'abc\\n'; exit 3"], out, max_bytes=1000)
    assert stream.wait(30) == 3 and not stream.capped and out.read_text() == "abc\n"


# -- the quality columns ------------------------------------------------------------------------------

def _campaign(tmp_path: Path, edit=None) -> Path:
    """A campaign of two real sampled, traced runs of data/demo-sampled (copied; ``edit(run_dir, record)`` changes
    the first)."""
    runs = sorted(p for p in DEMO.iterdir() if p.name.startswith(("bbr-ts10ms-sh25", "bbr-ts10ms-sh100")))
    out = tmp_path / "camp"
    for i, run in enumerate(runs):
        dst = out / "runs" / run.name
        shutil.copytree(run, dst)
        if edit is not None and i == 0:
            record = json.loads((dst / "record.json").read_text())
            edit(dst, record)
            (dst / "record.json").write_text(json.dumps(record))
    return out


def _is(value, truth: bool) -> bool:
    """A three-valued table cell is ``truth`` (not <NA>)."""
    return not pd.isna(value) and bool(value) is truth


def _row(tables, run_id_prefix: str = "bbr-ts10ms-sh100") -> pd.Series:
    return tables.runs[tables.runs["run_id"].str.startswith(run_id_prefix)].iloc[0]


def test_committed_sampled_runs_read_as_whole_and_unsampled_runs_as_unknown(tmp_path):
    t = data.load(_campaign(tmp_path), cache=False)
    for _, row in t.runs.iterrows():
        assert _is(row["sampling_complete"], True) and _is(row["samples_cover_transfer"], True)
        assert _is(row["trace_complete"], True) and row["samples_dropped"] == 0
    unsampled = data.load(ROOT / "data" / "demo", cache=False).runs
    assert unsampled["sampling_complete"].isna().all() and unsampled["trace_complete"].isna().all()


def test_dropped_samples_are_a_column_and_the_socket_figure_leaves_the_run_out(tmp_path):
    def drop(run, record):
        log = run / "samples.log"
        log.write_text(log.read_text().replace(" dropped=0 ", " dropped=7 "))
        record["metadata"]["sampling"]["dropped"] = 7
    t = data.load(_campaign(tmp_path, drop), cache=False)
    row = _row(t)
    assert row["samples_dropped"] == 7 and _is(row["sampling_complete"], False)
    assert _is(row["samples_cover_transfer"], True)
    _, drawn = socket_state(t, run_ids=list(t.runs["run_id"]))
    assert row["run_id"] not in set(drawn["run_id"]) and len(drawn)
    _, everything = socket_state(t, run_ids=list(t.runs["run_id"]), partial_samples=True)
    assert row["run_id"] in set(everything["run_id"])


def test_samples_that_stop_mid_transfer_do_not_cover_it(tmp_path):
    def halve(run, record):
        lines = (run / "samples.log").read_text().splitlines()
        records = [i for i, line in enumerate(lines) if line.startswith("R ")]
        keep = set(records[: len(records) // 2])
        (run / "samples.log").write_text("\n".join(line for i, line in enumerate(lines)
                                                   if i in keep or not line.startswith("R ")) + "\n")
    t = data.load(_campaign(tmp_path, halve), cache=False)
    row = _row(t)
    assert row["samples_span_s"] < 6 and _is(row["samples_cover_transfer"], False)
    assert _is(row["sampling_complete"], False)
    assert row["run_id"] not in set(timeline.traced_runs(t)["run_id"])


@pytest.mark.parametrize("change", [{"capped": True}, {"lost_events": 12}, {"schedstat_agrees": False}])
def test_a_capped_lossy_or_disagreeing_trace_is_left_out_of_timelines(tmp_path, change):
    def edit(run, record):
        record["metadata"]["vcpu_trace"].update(change)
    t = data.load(_campaign(tmp_path, edit), cache=False)
    row = _row(t)
    assert _is(row["trace_complete"], False)
    assert _is(row["trace_capped"], bool(change.get("capped", False)))
    assert row["run_id"] not in set(timeline.traced_runs(t)["run_id"])
    assert row["run_id"] in set(timeline.traced_runs(t, partial_evidence=True)["run_id"])
    with pytest.raises(timeline.TimelineError, match="partial"):
        timeline.of_run(t, row["run_id"])
    assert len(timeline.of_run(t, row["run_id"], partial_evidence=True).socket)


def test_a_trace_never_compared_with_schedstat_is_unknown_not_whole(tmp_path):
    def edit(run, record):
        record["metadata"]["vcpu_trace"]["schedstat_agrees"] = None
    row = _row(data.load(_campaign(tmp_path, edit), cache=False))
    assert pd.isna(row["trace_complete"])
