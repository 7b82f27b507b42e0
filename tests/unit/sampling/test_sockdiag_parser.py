"""The netlink sampler's parser on output recorded in the testbed's guest (tests/fixtures/sockdiag/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bbrlab.analysis.data import SS_COLUMNS
from bbrlab.core.errors import ValidationError
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling import sockdiag
from bbrlab.sampling.sockdiag.structs import BBR_INFO_SIZE, TCP_INFO_SIZE, decode_bbr_info, decode_tcp_info
from bbrlab.sampling.ss import parse_ss_log
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario
from tests.sampler_compare import IDLE_FIELDS, MONOTONE, between_netlink_samples, ss_equal

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sockdiag"


def _text(name: str) -> str:
    path = FIX / name
    return gzip.decompress(path.read_bytes()).decode() if name.endswith(".gz") else path.read_text()


@pytest.mark.parametrize("cca", ["bbr", "cubic", "bbr2b"])
def test_idle_connection_netlink_equals_ss(cca):
    ss = parse_ss_log("# t=0\n" + _text(f"idle-{cca}.ss.txt"))
    rows = sockdiag.rows(_text(f"idle-{cca}.sockdiag.log"))
    assert len(ss) == 1 and len(rows) == 10
    for row in rows:
        diffs = {k: (row[k], ss[0].get(k)) for k in IDLE_FIELDS if not ss_equal(row[k], ss[0].get(k))}
        assert not diffs
    assert rows[0]["cca"] == cca
    # ss prints neither retrans 0/0 nor the default reordering of 3; netlink has them
    assert rows[0]["retrans_total"] == 0 and rows[0]["reordering"] == 3
    assert "retrans_total" not in ss[0] and "reordering" not in ss[0]


def test_gains_are_exact_where_ss_rounds():
    row = sockdiag.rows(_text("idle-bbr2b.sockdiag.log"))[0]
    ss = parse_ss_log("# t=0\n" + _text("idle-bbr2b.ss.txt"))[0]
    for key in ("pacing_gain", "cwnd_gain"):
        assert row[key] * 256 == int(row[key] * 256)  # the kernel's fixed point, undivided
        assert float(f"{row[key]:g}") == ss[key]


def test_rows_have_every_ss_table_column():
    rows = sockdiag.rows(_text("live-bbr.sockdiag.log.gz"))
    ss = parse_ss_log(_text("live-bbr.ss.log"))
    wanted = set(SS_COLUMNS) - {"run_id", "t_host_s"}  # t_host_s: the reader shifts t_unix_s by the record's clock
    assert wanted <= set(rows[0]) and wanted <= set(ss[0]) | {"bdp_bytes", "inflight_bdp"}
    for key in wanted:
        kinds = {type(r[key]) for r in rows} - {type(None)}
        ss_kinds = {type(r.get(key)) for r in ss} - {type(None)}
        assert kinds == ss_kinds or kinds <= {int, float} and ss_kinds <= {int, float}, (key, kinds, ss_kinds)


def test_live_flow_ss_between_netlink_samples():
    text = _text("live-bbr.sockdiag.log.gz")
    log = sockdiag.parse_log(text)
    nl = sockdiag.rows(log)
    ss = parse_ss_log(_text("live-bbr.ss.log"))
    port = next(iter(log.discovered))
    assert {r["port"] for r in nl} == {r["port"] for r in ss} == {port}
    for key in MONOTONE:
        assert [r[key] for r in nl] == sorted(r[key] for r in nl)
    starts = sampling.sample_times(_text("live-bbr.ss.log"))
    done = {i: (s.realtime_ns + s.request_ns) / 1e9 for i, s in enumerate(log.samples)}
    checked = 0
    for row in ss[:-1]:
        before = [r for r in nl if done[r["sample"]] <= starts[row["sample"]]]
        after = [r for r in nl if r["t_unix_s"] >= starts[row["sample"] + 1]]
        if before and after:
            for key in MONOTONE:
                assert before[-1][key] <= (row.get(key) or 0) <= after[0][key]
            window = [r for r in nl if before[-1]["t_unix_s"] <= r["t_unix_s"] <= after[0]["t_unix_s"]]
            assert any(ss_equal(r["pacing_gain"], row["pacing_gain"]) for r in window)
            checked += 1
    assert checked >= 5


def test_live_flow_inflight_and_bdp_definitions():
    rows = sockdiag.rows(_text("live-bbr.sockdiag.log.gz"))
    for r in rows:
        assert r["sent_minus_acked_bytes"] == r["inflight_bytes"] + r["bytes_retrans"] or r["inflight_bytes"] == 0
        # whole segments: equal to within a byte; the 37-byte iperf3 cookie is one short segment
        assert abs(r["inflight_bytes"] - r["unacked_bytes"]) <= (1 if r["bytes_sent"] > 37 else r["mss"])
        assert r["bdp_bytes"] == pytest.approx(r["bw_mbit"] * 1e6 / 8 * r["mrtt_ms"] / 1e3)
        if r["bdp_bytes"]:
            assert r["inflight_bdp"] == pytest.approx(r["inflight_bytes"] / r["bdp_bytes"])
    gains = {r["pacing_gain"] for r in rows}
    assert {1.25, 0.75, 1.0} <= gains  # BBR's PROBE_BW cycle, each seen at 10 ms resolution


def test_live_flow_summary_and_schedule():
    log = sockdiag.parse_log(_text("live-bbr.sockdiag.log.gz"))
    s = sockdiag.summary(log)
    assert s["kind"] == "netlink" and s["asked_interval_ms"] == 10.0 and s["ended"] == "stop_file"
    foot, ready = log.footer, log.ready
    assert s["samples"] == len(log.samples) == foot["samples"] and s["missed_ticks"] == foot["missed"]
    assert s["samples"] + s["missed_ticks"] == s["ticks"]
    startup_us = ready["cpu_user_us"] + ready["cpu_sys_us"]
    assert s["cpu_startup_s"] == pytest.approx(startup_us / 1e6)
    assert s["cpu_per_sample_ms"] == pytest.approx((foot["cpu_user_us"] + foot["cpu_sys_us"] - startup_us) / 1000
                                                   / foot["samples"])
    iv = s["interval"]
    assert iv["gaps"] == s["samples"] - 1 and iv["median_ms"] <= iv["p99_ms"] <= iv["longest_gap_ms"]
    assert 9.9 <= iv["median_ms"] <= 10.5
    t0, step = log.header["t0_ns"], log.header["interval_ns"]
    assert all(t0 + x.tick * step <= x.monotonic_ns < t0 + (x.tick + 1) * step for x in log.samples)
    assert [x.tick for x in log.samples] == sorted({x.tick for x in log.samples})
    assert s["sockets_discovered"] == sorted(log.discovered) and len(log.discovered) == 1


def test_sampler_failure_is_loud():
    for name in ("no-diag-tcp_diag.sockdiag.log", "no-diag-tcp_diag-inet_diag.sockdiag.log"):
        text = _text(name)
        s = sockdiag.summary(text)
        assert s["ended"] == "error" and s["samples"] == 0 and "tcp_diag" in s["errors"][0]
        with pytest.raises(sockdiag.SockdiagLogError, match="no inet_diag/tcp_diag"):
            sockdiag.rows(text)


def _real_socket_line() -> tuple[str, list[str]]:
    text = _text("idle-bbr.sockdiag.log")
    lines = text.splitlines()
    return text, lines


def test_constructed_bbr_without_bbr_info_is_refused():
    """Constructed from the recorded idle-bbr log by dropping the INET_DIAG_BBRINFO (16:) attribute."""
    text, lines = _real_socket_line()
    edited = "\n".join(" ".join(w for w in line.split() if not w.startswith("16:")) if line.startswith("S ") else line
                       for line in lines)
    with pytest.raises(sockdiag.SockdiagFieldsMissing, match="INET_DIAG_BBRINFO"):
        sockdiag.rows(edited)
    assert sockdiag.rows(edited, check=False)[0]["bw_mbit"] is None


def test_constructed_longer_structs_and_unknown_attributes_are_kept():
    """Constructed from a recorded line: tcp_info and bbr info with 8 more bytes, an attribute type 99."""
    text, lines = _real_socket_line()

    def grow(word: str) -> str:
        kind, _, data = word.partition(":")
        return f"{word}0102030405060708" if kind in ("2", "16") else word

    edited = "\n".join(" ".join([grow(w) for w in line.split()] + ["99:cafe"]) if line.startswith("S ") else line
                       for line in lines)
    original, grown = sockdiag.rows(text)[0], sockdiag.rows(edited)[0]
    assert grown["tcp_info_tail_hex"] == "0102030405060708" and grown["bbr_extra"] == {"tail_hex": "0102030405060708"}
    assert grown["other"]["attr_99"] == "cafe"
    for key in IDLE_FIELDS:
        assert grown[key] == original[key]


def test_shorter_tcp_info_decodes_what_it_has():
    first = next(line for line in _real_socket_line()[1] if line.startswith("S "))
    data = bytes.fromhex(next(w for w in first.split() if w.startswith("2:"))[2:])
    assert len(data) == TCP_INFO_SIZE
    full, short = decode_tcp_info(data), decode_tcp_info(data[:104])  # up to total_retrans (Linux 4.1-ish)
    assert short["snd_cwnd"] == full["snd_cwnd"] and "pacing_rate" not in short and "bytes_sent" not in short
    with pytest.raises(ValueError, match="shorter"):
        decode_bbr_info(bytes(BBR_INFO_SIZE - 4))


def test_malformed_logs_are_refused_with_the_line():
    with pytest.raises(sockdiag.SockdiagLogError, match="not a sockdiag sampler log"):
        sockdiag.parse_log("# t=1\n")
    header = _text("idle-bbr.sockdiag.log").splitlines()[0]
    with pytest.raises(sockdiag.SockdiagLogError, match="line 2"):
        sockdiag.parse_log(header + "\nS 1 2 3\n")
    with pytest.raises(sockdiag.SockdiagLogError, match="format"):
        sockdiag.parse_log(header.replace("format=1", "format=9"))


def test_killed_sampler_has_no_footer_but_its_samples():
    text = "\n".join(line for line in _text("idle-bbr.sockdiag.log").splitlines() if not line.startswith("# end"))
    s = sockdiag.summary(text)
    assert s["ended"] == "killed (no footer)" and s["samples"] == 10 and s["cpu_per_sample_ms"] is None
    assert len(sockdiag.rows(text)) == 10


@pytest.mark.parametrize("kwargs,field", [
    ({"interval_ms": 0.05}, "interval_ms"), ({"interval_ms": 20_000}, "interval_ms"), ({"interval_ms": True}, "interval_ms"),
    ({"ports": []}, "ports"), ({"ports": [0]}, "ports[0]"), ({"ports": [5, 5]}, "ports"), ({"ports": "5"}, "ports"),
    ({"server_port": 70000}, "server_port"), ({"stop_file": "stop"}, "stop_file"), ({"stop_after_s": 0}, "stop_after_s"),
    ({"family": 5}, "family"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    args = {"binary_path": "/x", "interval_ms": 10, "stop_after_s": 30, "stop_file": "/tmp/s", "ports": [20000],
            "server_port": 5201} | kwargs
    family = args.pop("family", 4)
    with pytest.raises(ValidationError) as e:
        sockdiag.sampler_argv(**args, family=family)
    assert e.value.field == field


def test_argv_is_literal():
    argv = sockdiag.sampler_argv("/usr/local/libexec/bbrlab/sockdiag_sampler", 10, 29.5, "/tmp/a b/stop", [20001, 20000],
                                 5201)
    assert argv == ["/usr/local/libexec/bbrlab/sockdiag_sampler", "-i", "10000", "-t", "30", "-s", "/tmp/a b/stop",
                    "-d", "5201", "-p", "20001,20000", "-f", "4"]


# -- the BPF sampler ---------------------------------------------------------------------------------

def test_bpf_records_decode_into_ss_columns():
    text = _text("live-bbr-both.bpf.log.gz")
    log = sockdiag.bpf.parse_log(text)
    assert log.header["record_size"] == sockdiag.bpf.RECORD.size == 296
    rows = sockdiag.rows(text)
    assert len(rows) == len(log.records) == log.footer["records"] and log.footer["dropped"] == 0
    assert set(SS_COLUMNS) - {"run_id", "t_host_s"} <= set(rows[0])  # the reader adds t_host_s
    bbr = [r for r in rows if r["cca"] == "bbr"]
    assert {1.25, 0.75, 1.0} <= {r["pacing_gain"] for r in bbr} and {r["cwnd_gain"] for r in bbr} >= {2.0}
    for r in bbr:
        assert r["bdp_bytes"] == pytest.approx(r["bw_mbit"] * 1e6 / 8 * r["mrtt_ms"] / 1e3)
        assert r["mss"] == 1448 and 19.0 < r["mrtt_ms"] < 25.0  # netem's 20 ms RTT
    # iperf3 switches the CCA after its cookie: a first record may show cubic, never with data sent
    assert all(r["bytes_sent"] <= 37 for r in rows if r["cca"] != "bbr")


def test_bpf_agrees_with_netlink_recorded_on_the_same_flow():
    nl_text, bpf_text = _text("live-bbr-both.sockdiag.log.gz"), _text("live-bbr-both.bpf.log.gz")
    nl = [r for r in sockdiag.rows(nl_text) if r["cca"] == "bbr"]
    bpf = [r for r in sockdiag.rows(bpf_text) if r["cca"] == "bbr"]
    pairs = between_netlink_samples(bpf, nl, nl_text)
    assert len(pairs) >= 0.9 * len(bpf)
    for row, before, after in pairs:
        for key in MONOTONE:
            assert before[key] <= row[key] <= after[key]
    for key in ("bw_mbit", "mrtt_ms", "pacing_gain", "cwnd_gain", "minrtt_ms"):
        assert sum(row[key] in (before[key], after[key]) for row, before, after in pairs) >= 0.95 * len(pairs), key


def test_bpf_summary_and_schedule():
    text = _text("live-bbr-both.bpf.log.gz")
    log = sockdiag.bpf.parse_log(text)
    s = sockdiag.summary(text)
    foot, ready = log.footer, log.ready
    assert s["kind"] == "bpf" and s["ended"] == "stop_file" and s["asked_interval_ms"] == 10.0
    assert s["samples"] == len(log.records) and s["missed_ticks"] == sockdiag.bpf.missed_slots(log.records)
    steady_us = foot["cpu_user_us"] + foot["cpu_sys_us"] - ready["cpu_user_us"] - ready["cpu_sys_us"]
    assert s["cpu_per_sample_ms"] == pytest.approx((steady_us / 1000 + foot["prog_run_ns"] / 1e6) / len(log.records))
    assert s["bpf_prog_runs"] == foot["prog_runs"] > len(log.records)  # it runs on every segment, records few
    t0, step = log.header["t0_ns"], log.header["interval_ns"]
    assert all(t0 + r["slot"] * step <= r["mono_ns"] < t0 + (r["slot"] + 1) * step for r in log.records)
    assert [r["slot"] for r in log.records] == sorted({r["slot"] for r in log.records})
    assert 9.9 <= s["interval"]["median_ms"] <= 10.5


def test_bpf_failure_is_loud():
    text = _text("no-privilege.bpf.log")
    s = sockdiag.summary(text)
    assert s["ended"] == "error" and "CAP_BPF" in s["errors"][0] and s["samples"] == 0
    with pytest.raises(sockdiag.SockdiagLogError, match="the BPF sampler failed"):
        sockdiag.rows(text)


def test_bpf_unknown_bbr_layout_is_refused_not_guessed():
    """Constructed from the recorded log: the CCA name of every record replaced by "bbr3" (same length
    family, a BBR whose private layout bbrlab does not know)."""
    text = _text("live-bbr-both.bpf.log.gz")
    name_offset = 152 * 2  # ca_name in struct sockbpf_record, as hex
    edited = []
    for line in text.splitlines():
        if line.startswith("R "):
            head, hexdata = line.rsplit(" ", 1)
            name = bytes.fromhex(hexdata[name_offset:name_offset + 32]).split(b"\0")[0]
            if name == b"bbr":
                hexdata = hexdata[:name_offset] + b"bbr3".ljust(16, b"\0").hex() + hexdata[name_offset + 32:]
            line = f"{head} {hexdata}"
        edited.append(line)
    with pytest.raises(sockdiag.SockdiagFieldsMissing, match="cannot decode"):
        sockdiag.rows("\n".join(edited))
    rows = sockdiag.rows("\n".join(edited), check=False)
    assert all(r["bw_mbit"] is None and r["bbr_extra"]["ca_priv_hex"] for r in rows if r["cca"] == "bbr3")


def test_bpf_bad_record_size_is_refused():
    header = _text("no-privilege.bpf.log").splitlines()[0]
    with pytest.raises(sockdiag.SockdiagLogError, match="records of 300 bytes"):
        sockdiag.bpf.parse_log(header.replace("record_size=296", "record_size=300"))


def test_log_kind_and_dispatch():
    assert sockdiag.log_kind(_text("idle-bbr.sockdiag.log")) == "netlink"
    assert sockdiag.log_kind(_text("no-privilege.bpf.log")) == "bpf"
    with pytest.raises(sockdiag.SockdiagLogError):
        sockdiag.log_kind("# t=1\n")


def test_data_reads_samples_log_into_the_ss_table(tmp_path):
    """A run directory with a samples.log (BPF) fills the ss table like an ss.log does."""
    from bbrlab.analysis.records_reader import read_run

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "record.json").write_text(
        json.dumps({"run_id": "r1", "status": "ok", "metadata": {}, "scenario": Scenario(
            Link(20, 100), Contention(1, 100), Flow("bbr", sample_ms=10, sampler="bpf")).to_dict()}))
    (run / "samples.log").write_text(_text("live-bbr-both.bpf.log.gz"))
    rows = read_run(tmp_path, "runs/r1")
    assert rows.run["sampler"] == "bpf" and rows.run["ss_sampled"] is True
    assert len(rows.ss) == len(sockdiag.rows(_text("live-bbr-both.bpf.log.gz"))) and not rows.notes
    assert set(rows.ss.columns) == set(SS_COLUMNS)  # a typed DataFrame, read in chunks
