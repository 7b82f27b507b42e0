"""The rsync workload's pure parts: spec keys and their validation, the flow as recorded, the client's
and the poller's output (recorded on the local testbed, tests/fixtures/transfer), the sshd configuration,
the checks an rsync run must pass, and the workload columns of the tables."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from bbrlab.analysis import data
from bbrlab.campaign.spec import CampaignSpec
from bbrlab.core.errors import RunFailed, ValidationError
from bbrlab.run import progress, sshd, transfer
from bbrlab.scenario.scenario import Contention, Flow, Link, RsyncParams, Scenario

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "transfer"
ROOT = Path(__file__).resolve().parents[3]
BASE = {"name": "t", "ccas": ["cubic", "bbr"], "timeslices_ms": [10], "cpu_shares_pct": [25, 100],
        "rtts_ms": [40], "rates_mbit": [20], "losses_pct": [0, 30], "repetitions": 2, "duration_s": 10}


def spec(**over) -> CampaignSpec:
    return CampaignSpec.from_dict({**BASE, **over})


# -- spec keys and the flow ------------------------------------------------------------------------

def test_workloads_default_to_iperf3_and_leave_the_spec_and_run_ids_as_before():
    s = spec()
    assert s.workloads == ("iperf3",) and s.file_mb == 160 and s.transfer_timeout_s == 1200
    assert not {"workloads", "file_mb", "transfer_timeout_s"} & set(s.to_dict())
    assert all("workload" not in g.to_dict()["flow"] for g in s.grid())


def test_recorded_runs_keep_their_run_ids():
    records = sorted(ROOT.glob("data/*/runs/*/record.json"))
    assert records, "the repository's data/ holds recorded runs"
    for path in records:
        r = json.loads(path.read_text())
        s = Scenario.from_dict(r["scenario"])
        assert (s.run_id, s.to_dict()) == (r["run_id"], r["scenario"])


def test_rsync_is_a_grid_dimension_with_its_file_and_timeout():
    s = spec(workloads=["iperf3", "rsync"], file_mb=16, transfer_timeout_s=90)
    grid = s.grid()
    assert len(grid) == 2 * 2 * 2 * 2
    rsync = [g for g in grid if g.flow.workload == "rsync"]
    assert len(rsync) == 8 and all(g.flow.params.file_bytes == 16_000_000 and g.flow.params.transfer_timeout_s == 90 for g in rsync)
    d = rsync[0].to_dict()["flow"]
    assert d["workload"] == "rsync" and "duration_s" not in d and d["file_mb"] == 16
    assert Scenario.from_dict(rsync[0].to_dict()) == rsync[0]
    assert all(g.run_id.startswith("rsync-") for g in rsync)
    assert len({g.run_id for g in s.plan()}) == 32
    assert CampaignSpec.from_dict(s.to_dict()) == s


def test_plan_estimate_counts_copies_at_the_link_rate_and_caps_them_at_the_timeout():
    s = spec(workloads=["rsync"], ccas=["bbr"], cpu_shares_pct=[100], losses_pct=[0], repetitions=1, file_mb=25,
             transfer_timeout_s=5)
    assert s.expected_duration_s() == pytest.approx(5 + 8)  # 25 MB at 20 Mbit/s = 10 s > the 5 s timeout
    s = spec(workloads=["rsync"], ccas=["bbr"], cpu_shares_pct=[100], losses_pct=[0], repetitions=1, file_mb=2.5)
    assert s.expected_duration_s() == pytest.approx(1 + 8)


@pytest.mark.parametrize("over, field", [
    ({"workloads": ["scp"]}, "workloads[0]"),
    ({"workloads": ["iperf3", 3]}, "workloads[1]"),
    ({"workloads": "rsync"}, "workloads"),
    ({"workloads": ["rsync", "rsync"]}, "workloads"),
    ({"file_mb": 0}, "file_mb"),
    ({"file_mb": -5}, "file_mb"),
    ({"file_mb": 5000}, "file_mb"),
    ({"file_mb": "160"}, "file_mb"),
    ({"file_mb": True}, "file_mb"),
    ({"transfer_timeout_s": 0}, "transfer_timeout_s"),
    ({"transfer_timeout_s": 10**6}, "transfer_timeout_s"),
    ({"losses_pct": [0, 60]}, "losses_pct[1]"),
    ({"losses_pct": [50.5]}, "losses_pct[0]"),
    ({"workloads": ["rsync"], "streams": [1, 4]}, "streams[1] with workloads[0]"),
])
def test_bad_workload_keys_are_refused_naming_the_field(over, field):
    with pytest.raises(ValidationError) as e:
        spec(**over)
    assert e.value.field == field


def test_loss_is_limited_to_half_the_packets():
    assert Link(rtt_ms=20, rate_mbit=10, loss_model="uniform", loss_pct=50).loss_pct == 50
    with pytest.raises(ValidationError, match="loss_pct <= 50") as e:
        Link(rtt_ms=20, rate_mbit=10, loss_model="uniform", loss_pct=60)
    assert e.value.field == "link.loss_pct"


@pytest.mark.parametrize("kwargs, field", [
    ({"workload": "rsync", "streams": 2}, "flow.streams"),
    ({"workload": "rsync", "duration_s": 30}, "flow.duration_s"),
    ({"file_mb": 10}, "flow.file_mb"),
    ({"transfer_timeout_s": 30}, "flow.transfer_timeout_s"),
    ({"workload": "ftp"}, "flow.workload"),
])
def test_a_flow_takes_only_its_own_workloads_fields(kwargs, field):
    with pytest.raises(ValidationError) as e:
        Flow.of("cubic", **kwargs)  # the flat fields of a record or a spec
    assert e.value.field == field


# -- what the client and the poller print ----------------------------------------------------------

def test_client_output_of_a_completed_copy():
    r = transfer.parse_client_output((FIXTURES / "client-complete.txt").read_text())
    assert r.exit_code == 0 and not r.timed_out and r.elapsed_s == pytest.approx(8.107227)
    assert r.socket == {"cca_set": "cubic", "cca_connected": "cubic", "local_port": 21000, "peer": "10.77.0.2:5022"}
    assert r.ssh == {"kex": "sntrup761x25519-sha512", "host_key": "ssh-ed25519",
                     "cipher": "chacha20-poly1305@openssh.com", "mac": "<implicit>", "compression": "none"}
    assert "Total bytes sent: 2,000,581" in r.rsync_output


def test_client_output_of_a_timed_out_copy():
    r = transfer.parse_client_output((FIXTURES / "client-timeout.txt").read_text())
    assert r.exit_code == 124 and r.timed_out and r.socket["cca_connected"] == "bbr"
    assert "code 20" in r.rsync_output


def test_client_output_without_the_report_parses_to_nothing_usable():
    r = transfer.parse_client_output("bash: rsync: command not found\n")
    assert r.exit_code is None and r.elapsed_s is None and r.socket["cca_set"] is None and r.ssh == {}


def test_progress_log_parses_to_a_series_from_the_first_sample():
    samples = progress.parse((FIXTURES / "progress-timeout.log").read_text())
    assert len(samples) >= 30 and samples[-1][1] == 720_896
    assert all(b1 >= b0 for (_, b0), (_, b1) in zip(samples, samples[1:], strict=False))
    s = progress.series(samples)
    assert s[0] == [0.0, 0] and s[-1][1] == 720_896
    assert 0 < progress.first_byte_s(samples) < s[-1][0]
    assert progress.first_byte_s([(1.0, 0), (2.0, 0)]) is None and progress.series([]) == []


def test_poller_command_is_checked_before_it_starts():
    with pytest.raises(ValidationError):
        progress.poll_argv("relative/path", 250, 60, "/tmp/stop")
    with pytest.raises(ValidationError):
        progress.poll_argv("/x", 1, 60, "/tmp/stop")


# -- the receiver's sshd -----------------------------------------------------------------------------

def test_sshd_listens_on_the_experiment_address_only_and_allows_only_the_forced_command():
    text = sshd.config_text("/tmp/d", "10.77.0.2", 5022, login_grace_s=45)
    lines = set(text.splitlines())
    assert {"ListenAddress 10.77.0.2:5022", "PasswordAuthentication no", "PermitRootLogin no",
            "AllowUsers bbrlab-rx", "AuthenticationMethods publickey", "AllowTcpForwarding no",
            "PermitTTY no",
            "LoginGraceTime 45", f"MaxStartups {sshd.MAX_STARTUPS}"} <= lines
    assert "PermitRootLogin forced-commands-only" in sshd.config_text("/tmp/d", "10.77.0.2", 5022, sshd.ROOT)
    assert sum(line.startswith(("ListenAddress", "Port ")) for line in lines) == 1
    assert sshd.key_options(["/usr/bin/rrsync", "-wo", "/tmp/d/dest"]) == 'restrict,command="/usr/bin/rrsync -wo /tmp/d/dest"'
    with pytest.raises(ValidationError):
        sshd.key_options(["sh", "-c", 'echo "x"'])


def test_client_config_pins_the_host_key_and_makes_the_connection_through_the_helper():
    server = sshd.SshServer(host=None, pid=1, address="10.77.0.2", port=5022, directory="/tmp/r",
                            host_key_pub="ssh-ed25519 AAAAkey bbrlab-run-sshd", client_key="k")
    text = transfer.client_config(server, "/tmp/c")
    assert "  StrictHostKeyChecking yes" in text and "  UserKnownHostsFile /tmp/c/known_hosts" in text
    assert "  ProxyUseFdpass yes" in text and "  HostName 10.77.0.2" in text and "  Port 5022" in text
    assert server.known_hosts_line(transfer.HOST_ALIAS) == "bbrlab-receiver ssh-ed25519 AAAAkey\n"


# -- the checks --------------------------------------------------------------------------------------

def _session(received, size=2_000_000, sha="a" * 64):
    file = transfer.TestFile("/var/cache/bbrlab/transfer/random.bin", size, sha, False, None, {})
    return transfer.Session(server=None, client_dir="/tmp/c", file=file, poller=None, received=received)


def _client(name: str):
    return transfer.parse_client_output((FIXTURES / f"client-{name}.txt").read_text())


def test_a_completed_copy_must_arrive_whole_with_the_same_checksum():
    flow = Flow("cubic", RsyncParams(file_mb=2))
    transfer.check(flow, _client("complete"), _session(transfer.Received(2_000_000, "a" * 64)), None)
    with pytest.raises(RunFailed, match="differs"):
        transfer.check(flow, _client("complete"), _session(transfer.Received(2_000_000, "b" * 64)), None)
    with pytest.raises(RunFailed, match="differs"):
        transfer.check(flow, _client("complete"), _session(transfer.Received(1_999_999, None)), None)


def test_a_timed_out_copy_is_a_result_and_the_socket_must_carry_the_asked_cca():
    flow = Flow("bbr", RsyncParams(file_mb=2))
    transfer.check(flow, _client("timeout"), _session(transfer.Received(720_896, None)), None)
    with pytest.raises(RunFailed, match="congestion control 'bbr', asked for 'cubic'"):
        transfer.check(Flow("cubic", RsyncParams(file_mb=2)), _client("timeout"),
                       _session(transfer.Received(720_896, None)), None)


def test_a_failed_client_fails_the_run():
    flow = Flow("bbr", RsyncParams(file_mb=2))
    text = (FIXTURES / "client-complete.txt").read_text().replace("exit=0", "exit=255")
    with pytest.raises(RunFailed, match="rsync exited with 255"):
        transfer.check(flow, transfer.parse_client_output(text), _session(transfer.Received(0, None)), None)


# -- the tables --------------------------------------------------------------------------------------

def test_workload_columns_of_both_workloads():
    from bbrlab.analysis.records_reader import run_row

    scenario = Scenario(Link(20, 2), Contention(1, 100), Flow("bbr")).to_dict()
    iperf3 = run_row({"status": "ok", "scenario": scenario, "metadata": {}}, {"throughput_mbit": 42.0}, "runs/a")
    assert iperf3["workload"] == "iperf3" and iperf3["goodput_mbit"] == 42.0 and iperf3["timed_out"] is None
    meta = {"transfer": {  # as a timed-out copy records it (bbrlab.run.transferrecord.TransferSummary)
        "file_bytes": 4_000_000, "file_sha256": "ab", "file_made": False, "bytes_delivered": 720_896,
        "completed": False, "timed_out": True, "timeout_s": 8, "elapsed_s": 8.6, "completion_s": None,
        "goodput_mbit": 0.67, "receiver_sha256": None, "checksum_match": None, "first_byte_s": 0.4,
        "progress_interval_ms": 250, "progress_samples": 34, "rsync_exit": 30,
        "ssh": {"cipher": "chacha20-poly1305@openssh.com"}, "socket": {"cca_set": "bbr", "cca_connected": "bbr"},
        "server_port": 5202, "versions": {"rsync": "3.2.7"}}}
    flow = Flow("bbr", RsyncParams(file_mb=4)).to_dict()
    rsync = run_row({"status": "ok", "scenario": {**scenario, "flow": flow}, "metadata": meta}, {}, "runs/b")
    workload_columns = data.RUN_COLUMNS[data.RUN_COLUMNS.index("workload"):data.RUN_COLUMNS.index("ssh_cipher") + 1]
    assert {k: rsync[k] for k in workload_columns} == {
        "workload": "rsync", "goodput_mbit": 0.67, "file_mb": 4, "bytes_delivered": 720_896, "completion_s": None,
        "elapsed_s": 8.6, "timed_out": True, "ssh_cipher": "chacha20-poly1305@openssh.com"}


def test_progress_series_becomes_intervals_of_the_bytes_that_arrived():
    from bbrlab.analysis.records_reader import progress_intervals

    rows = progress_intervals("r", {"progress": [[0.0, 0], [0.5, 0], [1.0, 125_000], [1.0, 125_000]]})
    assert rows == [("r", 0.0, 0.5, 0.0, None), ("r", 0.5, 1.0, 2.0, None)]


# -- tables and figures of a real campaign (tests/fixtures/transfer/campaign) ----------------------------

@pytest.fixture(scope="module")
def fixture_tables(tmp_path_factory):
    import shutil

    root = tmp_path_factory.mktemp("transfer") / "campaign"
    shutil.copytree(FIXTURES / "campaign", root)
    return data.load(root)


def _records() -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (FIXTURES / "campaign" / "runs").glob("*/record.json")}


def test_ingest_reads_both_workloads(fixture_tables):
    runs = fixture_tables.runs.set_index("run_id")
    records = _records()
    assert sorted(runs.index) == sorted(records) and (runs["status"] == "ok").all()
    for run_id, rec in records.items():
        row = runs.loc[run_id]
        if rec["scenario"]["flow"].get("workload") == "rsync":
            t = rec["metadata"]["transfer"]
            assert row["workload"] == "rsync" and pd.isna(row["throughput_mbit"])
            assert row["goodput_mbit"] == pytest.approx(t["goodput_mbit"]) and bool(row["timed_out"]) == t["timed_out"]
            assert row["bytes_delivered"] == t["bytes_delivered"] and row["ssh_cipher"] == t["ssh"]["cipher"]
        else:
            assert row["workload"] == "iperf3" and row["goodput_mbit"] == row["throughput_mbit"] > 0
            assert pd.isna(row["timed_out"])
    assert int(runs["timed_out"].fillna(False).sum()) == 2


def test_a_copys_intervals_add_up_to_the_bytes_that_arrived(fixture_tables):
    records = _records()
    for run_id, rec in records.items():
        if rec["scenario"]["flow"].get("workload") != "rsync":
            continue
        iv = fixture_tables.intervals[fixture_tables.intervals["run_id"] == run_id]
        arrived = ((iv["t_end_s"] - iv["t_start_s"]) * iv["throughput_mbit"] * 1e6 / 8).sum()
        assert arrived == pytest.approx(rec["metadata"]["transfer"]["bytes_delivered"], rel=1e-9)


def test_goodput_figure_draws_each_runs_goodput_and_marks_the_timed_out_copies(fixture_tables):
    from bbrlab.analysis import plots

    fig, table = plots.goodput_vs_loss(fixture_tables)
    drawn = {}
    for panel in plots.plotted_points(fig):
        for line in panel["lines"]:
            for x, y in zip(line["x"], line["y"], strict=True):
                drawn.setdefault((panel["title"], line["label"]), []).append((x, y))
    late = [r for r in _records().values() if (r["metadata"].get("transfer") or {}).get("timed_out")]
    marks = drawn[("rsync | share 100 %", plots.TIMED_OUT_LABEL)]
    expected = sorted((r["scenario"]["link"]["loss_pct"], r["metadata"]["transfer"]["goodput_mbit"]) for r in late)
    assert len(expected) == 2 and [x for x, _ in sorted(marks)] == [x for x, _ in expected]
    assert [y for _, y in sorted(marks)] == pytest.approx([y for _, y in expected])
    for r in _records().values():
        if r["scenario"]["flow"].get("workload") == "rsync":
            label = {"bbr": "BBRv1", "cubic": "Cubic"}[r["scenario"]["flow"]["cca"]]
            point = (r["scenario"]["link"]["loss_pct"], pytest.approx(r["metadata"]["transfer"]["goodput_mbit"]))
            assert point in drawn[("rsync | share 100 %", label)]
    plt.close(fig)


def test_transfer_time_figure_and_outcomes_are_the_copies_only(fixture_tables):
    from bbrlab.analysis import plots

    fig, table = plots.transfer_time_vs_loss(fixture_tables)
    assert set(table["loss_pct"]) == {0, 1, 10, 30} and table["n"].sum() == 8
    plt.close(fig)
    out = data.transfer_outcomes(fixture_tables)
    assert out["copies"].sum() == 8 and out["timed_out"].sum() == 2 and out["completed"].sum() == 6
    assert (out.loc[out["loss_pct"] == 30, "completion_s_median"].isna()).all()
    fig, _ = plots.transfer_time_vs_loss(data.select(fixture_tables, workload="iperf3"))
    assert "no rsync copies" in fig.axes[0].texts[0].get_text()
    plt.close(fig)


def test_a_local_put_keeps_the_mode_ssh_insists_on_for_a_private_key(tmp_path):
    from bbrlab.core.hosts import LocalHost

    key = tmp_path / "id_ed25519"
    key.touch(mode=0o600)
    key.write_text("private")
    LocalHost().put(key, str(tmp_path / "copy"))
    assert (tmp_path / "copy").stat().st_mode & 0o777 == 0o600


# -- a clock step during the copy (issue 35 item 8) --------------------------------------------------------

def _stepped(text: str, t1: str, uptime: str | None) -> transfer.ClientResult:
    """A real client report with its end time replaced (the guest's wall clock stepped during the copy) and,
    when given, the /proc/uptime readings the client now prints."""
    text = re.sub(r"^t1=.*$", f"t1={t1}", text, flags=re.M)
    if uptime is not None:
        text = text.replace("\nsocket_cca_set", f"\nuptime={uptime}\nsocket_cca_set", 1)
    return transfer.parse_client_output(text)


def test_a_copy_timed_across_a_backward_clock_step_fails_the_run():
    """The complete fixture's copy took 8.107 s (t0 1795328521.913337); a guest whose clock was stepped back
    by 10 s meanwhile reported -1.89 s, which was recorded ``ok``."""
    flow = Flow("cubic", RsyncParams(file_mb=2))
    text = (FIXTURES / "client-complete.txt").read_text()
    for uptime in (None, "100.00 100.00 108.10 108.11"):
        parsed = _stepped(text, "1795328520.020564", uptime)
        assert parsed.elapsed_s < 0
        with pytest.raises(RunFailed, match="clock was stepped"):
            transfer.check(flow, parsed, _session(transfer.Received(2_000_000, "a" * 64)), None)


def test_a_forward_clock_step_is_caught_by_the_uptime_readings():
    flow = Flow("cubic", RsyncParams(file_mb=2))
    text = (FIXTURES / "client-complete.txt").read_text()
    stepped = _stepped(text, "1795328560.020564", "100.00 100.00 108.10 108.11")  # 38.1 s by the wall clock
    assert 29.9 < stepped.clock_step_s() < 30  # 38.107 s against at most 8.11 s and the allowances
    with pytest.raises(RunFailed, match="clock was stepped"):
        transfer.check(flow, stepped, _session(transfer.Received(2_000_000, "a" * 64)), None)
    # the same copy without a step, its clock readings preempted between the reads (a contended guest)
    steady = _stepped(text, "1795328530.020564", "99.80 100.40 107.90 108.50")
    assert steady.clock_step_s() == 0.0
    transfer.check(flow, steady, _session(transfer.Received(2_000_000, "a" * 64)), None)


def test_the_client_reads_uptime_around_each_wall_clock_reading():
    """The client script prints the four readings the check compares (run here for real, without rsync)."""
    lines = transfer._CLIENT.splitlines()
    clocks = [line for line in lines if "/proc/uptime" in line]
    report = [line for line in lines if line.startswith('echo "exit=')]
    assert len(clocks) == 2 and len(report) == 1
    script = "\n".join(["set -u", clocks[0], "sleep 0.2; rc=0", clocks[1], report[0]])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    parsed = transfer.parse_client_output(out.stdout + "--- rsync\n")
    assert parsed.uptimes_s is not None and 0.19 <= parsed.elapsed_s
    assert parsed.clock_step_s() == 0.0
