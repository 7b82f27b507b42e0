"""The authors' published layout -> bbrlab tables, on a fixture with their file and key names
(tests/fixtures/authors, written by tests/authors_layout.py; invented values)."""

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.analysis import authors, data
from bbrlab.core.errors import ValidationError
from tests import authors_layout

FIXTURE = Path(__file__).parents[2] / "fixtures" / "authors"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("authors") / "dataset"
    shutil.copytree(FIXTURE, root)
    return data.load(root)


def point(t, stamp):
    return t.runs[t.runs["run_id"].str.startswith(stamp + "/")]


def meta_of(stamp):
    return json.loads((FIXTURE / stamp / "meta.json").read_text())


def stamp_where(**wanted):
    for p in sorted(FIXTURE.glob("*/meta.json")):
        meta = json.loads(p.read_text())
        if all(meta.get(k) == v for k, v in wanted.items()):
            return p.parent.name
    raise LookupError(wanted)


def test_fixture_meta_is_string_typed_like_jq_writes_it():
    for p in FIXTURE.glob("*/meta.json"):
        text = p.read_text()
        assert text.count("\n") == 1
        meta = json.loads(text)
        assert all(isinstance(v, str) for k, v in meta.items() if k != "loss")
        assert all(isinstance(v, str) for v in meta["loss"].values())


def test_one_row_per_repetition_and_per_socket_log(tables):
    n_iperf = len(list(FIXTURE.glob("*/sender/iperf_*.json")))
    n_logs = len(list(FIXTURE.glob("socket_data/*.log")))
    assert len(tables.runs) == n_iperf + n_logs
    assert list(tables.runs.columns) == list(data.RUN_COLUMNS)
    assert set(tables.runs["source"]) == {"authors"}
    reps = tables.runs.loc[tables.runs["ss_sampled"] == False, "repetition"]  # noqa: E712
    assert sorted(reps.unique()) == [1.0, 2.0, 3.0]  # iperf_1 .. iperf_n


def test_version_and_patch_come_from_cca_and_kernel_together(tables):
    ident = tables.runs.drop_duplicates(["cca", "kernel"]).set_index(["cca", "kernel"])
    assert ident.loc[("bbr", "kernel6-1"), "variant"] == "BBRv1"
    assert ident.loc[("bbr", "BBRv3"), "variant"] == "BBRv3"
    assert ident.loc[("bbr", "BBRv3_fixed"), "variant"] == "BBRv3 patched"
    assert ident.loc[("bbr1", "BBRv3"), "variant"] == "BBRv1"
    assert ident.loc[("bbr", "kernel6-1_fixed"), "variant"] == "BBRv1 patched"
    assert ident.loc[("cubic", "kernel6-1"), "variant"] == "Cubic"
    v3p = ident.loc[("bbr", "BBRv3_fixed")]
    assert v3p["bbr_version"] == 3 and bool(v3p["patched"]) is True
    assert pd.isna(ident.loc[("cubic", "kernel6-1"), "bbr_version"])


def test_deadlines_are_nanoseconds_and_a_full_share_keeps_its_timeslice(tables):
    stamp = stamp_where(cca="bbr", kernel="BBRv3", deadline_run="10000000", deadline_period="40000000")
    p = point(tables, stamp)
    assert set(p["timeslice_ms"]) == {10.0} and set(p["cpu_share_pct"]) == {25.0}
    full = point(tables, stamp_where(cca="cubic", deadline_run="10000000", deadline_period="10000000"))
    assert set(full["timeslice_ms"]) == {10.0} and set(full["cpu_share_pct"]) == {100.0}
    assert set(full["contention_mode"]) == {"deadline"}


def test_throughput_is_the_iperf_receiver_sum(tables):
    stamp = stamp_where(cca="bbr", kernel="BBRv3_fixed", deadline_run="1000000", deadline_period="4000000")
    report = json.loads((FIXTURE / stamp / "sender" / "iperf_2.json").read_text())
    row = point(tables, stamp).set_index("repetition").loc[2.0]
    expected = report["end"]["sum_received"]["bits_per_second"] / 1e6
    assert row["throughput_mbit"] == pytest.approx(expected)
    assert row["link_utilisation"] == pytest.approx(expected / 100) and row["rate_mbit"] == 100
    assert row["rtt_ms"] == 20 and row["buffer_asked_bdp"] == 1.0  # meta.json's buffer: asked, not in force
    assert row["queue_mode"] == "authors" and row["queue_limit_packets"] == 100_000  # netem's limit was the queue
    assert row["buffer_bytes"] == 151_400_000 and row["buffer_bdp"] == pytest.approx(605.6)  # 100000 x 1514 B
    assert row["path"] == f"{stamp}/sender/iperf_2.json" and (FIXTURE / row["path"]).is_file()
    intervals = tables.intervals[tables.intervals["run_id"] == row["run_id"]]
    assert list(intervals["throughput_mbit"]) == pytest.approx([i["sum"]["bits_per_second"] / 1e6
                                                               for i in report["intervals"]])


def test_hypervisor_load_qdisc_loss_and_streams(tables):
    load = point(tables, stamp_where(chaos="real_kvm"))
    assert set(load["contention_mode"]) == {"hypervisor_load"} and set(load["load_pct"]) == {50.0}
    assert load["cpu_share_pct"].isna().all() and set(load["hypervisor"]) == {"virtualbox"}
    fq = point(tables, stamp_where(qdisc="fq"))
    assert set(fq["sender_qdisc"]) == {"fq"}
    lossy = point(tables, stamp_where(parallel="4"))
    assert set(lossy["loss_model"]) == {"uniform"} and set(lossy["loss_pct"]) == {0.1}
    assert set(lossy["streams"]) == {4.0} and set(lossy["contention_mode"]) == {"none"}
    assert set(lossy["cpu_share_pct"]) == {100.0}
    kvm = point(tables, stamp_where(cca="cubic", kernel="kernel6-1", deadline_run="1000000",
                                    deadline_period="4000000"))
    assert set(kvm["hypervisor"]) == {"qemu_kvm"} and set(kvm["accelerator"]) == {"kvm"}


def test_cross_checks_drop_the_rest_of_a_point_and_name_it(tables):
    err = stamp_where(cca="bbr", kernel="BBRv3", deadline_run="10000000", delay_rtt="30")
    p = point(tables, err).set_index("repetition")
    assert p.loc[1.0, "status"] == "ok" and p.loc[2.0, "status"] == "failed"
    assert "Connection refused" in p.loc[2.0, "reason"]
    assert p.loc[3.0, "status"] == "excluded" and math.isnan(p.loc[3.0, "throughput_mbit"])
    assert any(n.startswith(f"{err}: repetitions 2, 3 left out") for n in tables.notes)
    wrong = stamp_where(cca="bbr", kernel="kernel6-1", delay_rtt="30")
    assert set(point(tables, wrong)["status"]) == {"excluded"}
    assert any(n.startswith(f"{wrong}: repetitions 1, 2, 3") and "'cubic'" in n for n in tables.notes)
    short = stamp_where(cca="cubic", kernel="kernel6-1", delay_rtt="30")
    assert any(n == f"{short}: 2 iperf3 files, meta.json planned n = 3" for n in tables.notes)
    excluded = tables.runs[tables.runs["status"] != "ok"]["run_id"]
    assert not tables.intervals["run_id"].isin(excluded).any()


def test_socket_logs_load_with_the_scenario_from_the_file_name(tables):
    logs = tables.runs[tables.runs["ss_sampled"]].set_index("run_id")
    assert logs.loc["socket_data/ss_patched_25_scheduling_bbr3", "variant"] == "BBRv3 patched"
    assert logs.loc["socket_data/ss_no_scheduling_bbr1", "cpu_share_pct"] == 100
    assert logs.loc["socket_data/ss_25_scheduling_bbr1", "cca"] == "bbr1"  # as ss printed it
    assert logs.loc["socket_data/ss_25_scheduling_bbr2_1", ["variant", "repetition"]].tolist() == ["BBRv2", 1.0]
    ss = tables.ss.set_index("run_id")
    for run_id in logs.index:
        assert len(ss.loc[run_id]) == authors_layout.SS_SAMPLES  # the control connection's line is skipped
    patched = ss.loc["socket_data/ss_patched_25_scheduling_bbr3"]
    stock = ss.loc["socket_data/ss_25_scheduling_bbr3"]
    assert (patched["pacing_gain"] == 2.77).all() and (stock["pacing_gain"] < 2).all()
    assert (stock["inflight_bdp"] < 1).all() and patched["t_s"].iloc[0] == 0
    assert patched["t_s"].iloc[-1] == pytest.approx(0.2 * (authors_layout.SS_SAMPLES - 1))


def test_socket_line_with_and_without_the_address_part():
    info = ("bbr wscale:7,7 rto:220 rtt:21.1/0.6 mss:1448 cwnd:40 bytes_sent:5000 bytes_acked:2000 "
            "bbr:(bw:50Mbps,mrtt:20,pacing_gain:1.25,cwnd_gain:2) pacing_rate 62.5Mbps delivery_rate 49Mbps")
    bare = authors.parse_socket_line("1770000000.5,\t" + info)
    addressed = authors.parse_socket_line("1770000000.5,ESTAB 0 0 10.0.0.1:40001 10.0.0.2:5201 " + info)
    for row in (bare, addressed):
        assert row["t_unix_s"] == 1770000000.5 and row["cca"] == "bbr" and row["bw_mbit"] == 50
        assert row["pacing_rate_mbit"] == 62.5 and row["inflight_bytes"] == 3000
    assert bare["port"] is None and addressed["port"] == 40001
    assert authors.parse_socket_line("1770000000.5,\tcubic rtt:1/1 mss:1448 cwnd:10") is None
    assert authors.parse_socket_line("no comma here") is None


def test_contention_rules():
    assert authors.contention_of({"deadline_run": "1000000", "deadline_period": "1000000"})["timeslice_ms"] == 1.0
    none = authors.contention_of({"deadline_run": "0", "deadline_period": "0"})
    assert none["contention_mode"] == "none" and none["cpu_share_pct"] == 100
    assert authors.contention_of({}, deadline_unit="us")["contention_mode"] == "none"
    assert authors.contention_of({"deadline_run": "1000", "deadline_period": "4000"}, "us")["timeslice_ms"] == 1.0
    with pytest.raises(ValidationError, match="deadline_unit"):
        authors.contention_of({}, deadline_unit="fortnights")
    with pytest.raises(ValidationError, match="deadline_run"):
        authors.contention_of({"deadline_run": "5", "deadline_period": "4"})


def test_loss_modes():
    assert authors.loss_of({"loss": {"mode": "none", "params": "", "seed1": "1"}}) == ("none", 0.0)
    assert authors.loss_of({"loss": {"mode": "random", "params": "0.1 25"}}) == ("uniform", 0.1)
    assert authors.loss_of({"loss": {"mode": "gemodel", "params": "0.1 95 50 0.01"}}) == ("gemodel", 0.1)


def test_logs_folder_and_a_bad_point_are_handled(tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(FIXTURE, root / "logs")
    shutil.move(root / "logs" / "socket_data", root / "socket_data")
    bad = sorted((root / "logs").glob("2026*"))[0]
    (bad / "meta.json").write_text('{"rate": "fast", "cca": "bbr"}')
    t = data.load(root, cache=False)
    assert t.runs["path"].str.startswith(("logs/", "socket_data/")).all()
    assert any(n.startswith(f"logs/{bad.name}: skipped") and "rate" in n for n in t.notes)
    assert len(t.runs[t.runs["ss_sampled"]]) == len(authors_layout.SOCKET_LOGS)


def test_cache_is_reused_and_keeps_the_notes(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "ds")
    first = data.load(tmp_path / "ds")
    units = first.sources[0]["read"]
    again = data.load(tmp_path / "ds")
    assert again.sources[0]["read"] == 0 and again.notes == first.notes
    pd.testing.assert_frame_equal(again.runs, first.runs)
    stamp = sorted((tmp_path / "ds").glob("2026*"))[0]
    meta = json.loads((stamp / "meta.json").read_text())
    (stamp / "meta.json").write_text(json.dumps({**meta, "vm": "qemu"}))
    third = data.load(tmp_path / "ds")
    assert (third.sources[0]["read"], third.sources[0]["reused"]) == (1, units - 1)
    assert third.notes == first.notes
    assert set(point(third, stamp.name)["hypervisor"]) == {"qemu"}
    assert third.counts() == first.counts()


def test_data_load_finds_authors_and_bbrlab_sources_side_by_side(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "authors")
    shutil.copytree(FIXTURE.parent / "campaign", tmp_path / "ours")
    t = data.load(tmp_path, cache=False)
    assert t.runs.groupby("source").size().to_dict() == {
        "authors": len(list(FIXTURE.glob("*/sender/iperf_*.json"))) + len(authors_layout.SOCKET_LOGS), "bbrlab": 8}
