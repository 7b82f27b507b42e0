"""The netlink and the BPF samplers for real, in the local testbed's sender VM (Debian 6.1 guest, TCG).

- the netlink sampler and ``ss`` read the same connection at the same moment and agree field by field:
  exactly (to ss's printing precision) on an idle connection, and on a live 100 Mbit/s flow every ss
  sample lies between the netlink samples around it (counters), its gains are among those BBR had
  meanwhile and its rates within the range the netlink samples span;
- the BPF sampler against the netlink sampler (asked for 2 ms) on one live flow, the same way: its
  BBR state decoded from the CCA's private area equals what the kernel's own bbr_get_info() reported;
- both keep their schedule (one sample per slot, inside it; missed ticks counted);
- a stop file, the deadline or SIGTERM end either with its footer written;
- a kernel without inet_diag/tcp_diag makes the netlink sampler fail loudly (modules removed in the
  guest, autoload blocked by a modprobe.d ``install ... /bin/false``); the BPF sampler fails loudly
  when it may not load its program (run as ``nobody``); bad arguments are refused by name;
- deployment copies a sampler only when the guest's copy differs;
- a 10 s run at 100 % share through the run path, sampled at 10 ms, holds at least 500 samples, and its
  record says which sampler (and binary) took them and what they cost.

``BBRLAB_RECORD_FIXTURES=DIR`` additionally writes what these tests recorded into DIR (that is how
tests/fixtures/sockdiag/ was made; its README says when and where).
"""

from __future__ import annotations

import os
import random
import shlex
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from bbrlab.core.hostloop import RUNNING_SH
from bbrlab.link import emulator as link
from bbrlab.run import iperf
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling import sockdiag
from bbrlab.sampling.ss import parse_ss_log
from bbrlab.scenario.scenario import Link
from tests.sampler_compare import (
    IDLE_FIELDS,
    MONOTONE,
    SS_OMITS,
    WAIT_READY_SH,
    between_netlink_samples,
    ss_equal,
)

pytestmark = [pytest.mark.system, pytest.mark.testbed]

SINK_PORT = 5301
IPERF_COOKIE_BYTES = 37
IDLE_HOLD_S = 60

#: Receiver side of the idle-connection test: accept connections and read them to EOF.
_SINK = r"""
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1])))
srv.listen(8)
def drain(c):
    while c.recv(1 << 20):
        pass
    c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
"""

#: Sender side: send NBYTES with CCA from CPORT, wait until everything is acknowledged, touch MARKER,
#: then keep the connection open (idle) for HOLD_S seconds.
_IDLE_CLIENT = r"""
import socket, struct, sys, time
ip, port, cport, cca, nbytes, hold_s, marker = sys.argv[1:8]
s = socket.socket()
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cca.encode())
s.bind(("", int(cport)))
s.connect((ip, int(port)))
s.sendall(bytes(int(nbytes)))
while True:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    if struct.unpack_from("<I", info, 24)[0] == 0 and struct.unpack_from("<I", info, 144)[0] == 0:
        break
    time.sleep(0.02)
open(marker, "w").close()
time.sleep(float(hold_s))
"""


def _free_port() -> int:
    """A client port below the ephemeral range, different each time (a port of an earlier run may still
    be in TIME_WAIT)."""
    return random.randrange(21_000, 32_000)


def _record(name: str, text: str) -> None:
    directory = os.environ.get("BBRLAB_RECORD_FIXTURES")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / name).write_text(text)


@pytest.fixture(scope="module")
def deployed(testbed):
    return sockdiag.ensure_on_host(testbed.sender.host, kind="netlink")


@pytest.fixture(scope="module")
def deployed_bpf(testbed):
    return sockdiag.ensure_on_host(testbed.sender.host, kind="bpf")


@contextmanager
def _sink(receiver):
    pid = receiver.host.spawn(["timeout", "300", "python3", "-c", _SINK, str(SINK_PORT)], "/tmp/bbrlab-sink.log")
    try:
        iperf.wait_listening(receiver.host, SINK_PORT)
        yield
    finally:
        iperf.stop(receiver.host, pid, remove=["/tmp/bbrlab-sink.log"])


@contextmanager
def _idle_connection(testbed, cca: str, cport: int, nbytes: int = 20_000_000):
    sender = testbed.sender.host
    marker = f"/tmp/bbrlab-idle-{cport}.sent"
    sender.run(["rm", "-f", marker])
    pid = sender.spawn(["python3", "-c", _IDLE_CLIENT, testbed.receiver.experiment_ip, str(SINK_PORT), str(cport),
                        cca, str(nbytes), str(IDLE_HOLD_S), marker], f"/tmp/bbrlab-idle-{cport}.log")
    try:
        deadline = time.monotonic() + 60
        while not sender.exists(marker):
            assert time.monotonic() < deadline, sender.read_text(f"/tmp/bbrlab-idle-{cport}.log")
            time.sleep(0.2)
        yield
    finally:
        iperf.stop(sender, pid, remove=[marker, f"/tmp/bbrlab-idle-{cport}.log"])


def _ss_filter(cport: int) -> str:
    return f"ss -tinH state established '( sport = :{cport} )'"


def _both_at_once(testbed, deployed, cport: int, server_port: int) -> tuple[str, str, str]:
    """ss, then 1 s of the netlink sampler (100 ms interval), then ss again: one guest command."""
    sampler = shlex.join(sockdiag.sampler_argv(deployed.path, 100, 1, "/tmp/bbrlab-nostop", [cport], server_port))
    out = testbed.sender.host.output(["bash", "-c", f"{_ss_filter(cport)}; echo '#==='; {sampler}; echo '#==='; "
                                                    f"{_ss_filter(cport)}"], timeout=60)
    before, netlink, after = out.split("#===\n")
    return before, netlink, after


#: What an idle connection cannot change, with the values ss leaves out (netlink has them).
IDLE_AND_OMITTED = IDLE_FIELDS + tuple(SS_OMITS)


@pytest.mark.parametrize("cca", ["bbr", "cubic", "bbr2b"])
def test_idle_connection_same_fields_as_ss(testbed, deployed, cca):
    cport = _free_port()
    if cca not in testbed.sender.host.read_text("/proc/sys/net/ipv4/tcp_available_congestion_control").split():
        pytest.skip(f"{cca} is not loaded in the sender (bbrlab testbed up loads bbr2b)")
    link.clear(testbed.emulator.host, testbed.emulator.ports)
    with _sink(testbed.receiver), _idle_connection(testbed, cca, cport):
        before, netlink, after = _both_at_once(testbed, deployed, cport, SINK_PORT)
    _record(f"idle-{cca}.ss.txt", before)
    _record(f"idle-{cca}.sockdiag.log", netlink)
    ss_before = parse_ss_log("# t=0\n" + before)
    ss_after = parse_ss_log("# t=0\n" + after)
    rows = sockdiag.rows(netlink)
    assert len(ss_before) == len(ss_after) == 1 and len(rows) >= 9
    assert {k: ss_before[0].get(k) for k in IDLE_AND_OMITTED} == {k: ss_after[0].get(k) for k in IDLE_AND_OMITTED}, \
        "the connection was not idle"
    assert ss_before[0]["cca"] == cca
    for row in rows:
        diffs = {k: (row[k], ss_before[0].get(k)) for k in IDLE_AND_OMITTED if not ss_equal(row[k], ss_before[0].get(k), k)}
        assert not diffs, f"netlink vs ss differ: {diffs}"
    if cca.startswith("bbr"):
        assert rows[0]["bw_mbit"] > 0 and rows[0]["pacing_gain"] and rows[0]["cwnd_gain"]


@contextmanager
def _shaped_link(testbed, rtt_ms=20, rate_mbit=100):
    link.set(testbed.emulator.host, testbed.emulator.ports, Link(rtt_ms=rtt_ms, rate_mbit=rate_mbit))
    try:
        yield
    finally:
        link.clear(testbed.emulator.host, testbed.emulator.ports)


def _flow_with_samplers(testbed, samplers: dict[str, tuple[str, float]], *, cca: str, cport: int,
                        duration_s: int) -> tuple[dict[str, str], iperf.IperfResult]:
    """One iperf3 flow (one stream) with several samplers on its data socket: ``samplers`` maps a name to
    (binary path or "ss", interval in ms). All are started (and ready) before the client and stopped after
    it; returns each one's log and the client's result."""
    sender, receiver = testbed.sender.host, testbed.receiver
    base = f"/tmp/bbrlab-test-sockdiag-{cport}"
    sender.run(["rm", "-rf", base])
    sender.run(["mkdir", "-p", base])
    server = iperf.start_server(receiver.host, f"{base}.server.log", lifetime_s=duration_s + 60)
    pids = {}
    try:
        for name, (path, interval_ms) in samplers.items():
            if path == "ss":
                argv = sampling.sampler_argv(interval_ms, duration_s + 60, f"{base}/stop", data_ports=[cport])
            else:
                kind = "bpf" if path.endswith("sockbpf_sampler") else "netlink"
                argv = sockdiag.sampler_argv(path, interval_ms, duration_s + 60, f"{base}/stop", [cport],
                                             iperf.DEFAULT_PORT, kind=kind)
            pids[name] = sender.spawn(argv, f"{base}/{name}.log")
            if path != "ss":
                sender.run(["sh", "-c", WAIT_READY_SH, "sh", f"{base}/{name}.log", str(pids[name])], timeout=90)
        result = sender.run(iperf.client_argv(receiver.experiment_ip, cca=cca, duration_s=duration_s, cport=cport),
                            timeout=duration_s + 60)
        sender.run(["touch", f"{base}/stop"])
        for pid in pids.values():
            sender.run(["sh", "-c", RUNNING_SH + 'i=0; while running "$1" && [ $i -lt 400 ]; do sleep 0.05; '
                        'i=$((i+1)); done; ! running "$1"', "sh", str(pid)], timeout=60)
        texts = {name: sender.read_text(f"{base}/{name}.log") for name in samplers}
    finally:
        iperf.stop(receiver.host, server, remove=[f"{base}.server.log"])
        sender.run(["rm", "-rf", base], check=False)
    return texts, iperf.parse_result(result.stdout)


#: The gains BBR (v1) uses: startup's 2/ln 2 and drain's inverse, ProbeBW's cycle, ProbeRTT's 1.
BBR_GAINS = (2.885, 0.346, 1.25, 0.75, 1.0, 2.0)

#: Rates: ss's value must lie within the range the netlink samples around it span, widened by this much.
RATE_TOLERANCE = 0.02


def test_live_flow_ss_within_netlink_samples(testbed, deployed):
    cport = _free_port()
    with _shaped_link(testbed):
        texts, result = _flow_with_samplers(testbed, {"netlink": (deployed.path, 10), "ss": ("ss", 10)}, cca="bbr",
                                            cport=cport, duration_s=4)
    netlink_text, ss_text = texts["netlink"], texts["ss"]
    _record("live-bbr.sockdiag.log", netlink_text)
    _record("live-bbr.ss.log", ss_text)
    assert result.sender_tcp_congestion == "bbr"
    nl = sockdiag.rows(netlink_text, ports=[cport])
    ss = parse_ss_log(ss_text, ports=[cport])
    assert len(nl) > 200 and len(ss) >= 5
    for key in MONOTONE:
        values = [r[key] for r in nl]
        assert values == sorted(values), f"netlink {key} not monotone"
    # A netlink sample was read between its start (t_unix_s) and start + request time; ss read the socket
    # after its own "# t=" stamp and before the next one (the loop stamps, forks ss, waits for it).
    requests = {i: s.request_ns / 1e9 for i, s in enumerate(sockdiag.parse_log(netlink_text).samples)}
    starts = sampling.sample_times(ss_text)
    checked = 0
    for row in ss:
        if row["sample"] + 1 >= len(starts):
            break  # the last ss sample has no later bound
        t_before, t_after = starts[row["sample"]], starts[row["sample"] + 1]
        before = [r for r in nl if r["t_unix_s"] + requests[r["sample"]] <= t_before]
        after = [r for r in nl if r["t_unix_s"] >= t_after]
        if not before or not after:
            continue
        window = [r for r in nl if before[-1]["t_unix_s"] <= r["t_unix_s"] <= after[0]["t_unix_s"]]
        for key in MONOTONE:
            value = row.get(key) or 0  # ss prints no zero counters
            assert before[-1][key] <= value <= after[0][key], (key, before[-1][key], value, after[0][key])
        for key in ("mrtt_ms", "mss"):
            seen = {r[key] for r in window}
            assert any(ss_equal(v, row[key]) for v in seen), (key, row[key], seen)
        for key in ("pacing_gain", "cwnd_gain"):
            seen = {r[key] for r in window}
            if any(ss_equal(v, row[key]) for v in seen):
                continue
            # A gain phase can be shorter than the 10 ms between netlink samples (ProbeBW's 0.75 phase ends as
            # soon as inflight is down to the estimated BDP, within one 20 ms round trip), so ss may read a
            # phase no netlink sample saw. Then the window must span a phase change, and ss's value must be
            # one of BBR's gains.
            assert len(seen) > 1, (key, row[key], seen)
            assert any(ss_equal(g, row[key]) for g in BBR_GAINS), (key, row[key], seen)
        # BBR's bandwidth estimate moves only at round boundaries (a max filter over rounds, a 20 ms round here):
        # ss read the value the netlink sample before it saw, or the one the sample after it shows.
        values = [r["bw_mbit"] for r in window if r["bw_mbit"] is not None]
        if row.get("bw_mbit") is not None and values:
            low, high = min(values), max(values)
            assert low * (1 - RATE_TOLERANCE) <= row["bw_mbit"] <= high * (1 + RATE_TOLERANCE), (low, row, high)
        checked += 1
    assert checked >= 3, "too few ss samples with netlink samples on both sides"
    # The delivery rate and cwnd change with every ACK, the pacing rate with gain phases shorter than the 10 ms
    # between samples: ss can read a value between two netlink samples that neither saw (CI once saw ss read
    # 106.7 Mbit/s between samples of 72.0 and 98.7). So these are compared as distributions over the same
    # span: the median of ss's values lies within the 10th to 90th percentile of the netlink sampler's.
    span = [r for r in nl if starts[0] <= r["t_unix_s"] <= starts[-1]]
    for key in ("pacing_rate_mbit", "delivery_rate_mbit", "cwnd"):
        ours = sorted(r[key] for r in span if r[key] is not None)
        theirs = [row[key] for row in ss if row.get(key) is not None]
        assert len(ours) >= 20 and len(theirs) >= 3, (key, len(ours), len(theirs))
        p10, p90 = ours[len(ours) // 10], ours[(9 * len(ours)) // 10]
        assert p10 <= statistics.median(theirs) <= p90, (key, p10, statistics.median(theirs), p90)


def _check_schedule(text: str) -> None:
    """At most one sample per slot (per socket for the BPF sampler), each inside its slot; the footer's
    counts add up."""
    if sockdiag.log_kind(text) == "bpf":
        log = sockdiag.bpf.parse_log(text)
        interval_ns, t0 = log.header["interval_ns"], log.header["t0_ns"]
        for port in {r["sport"] for r in log.records}:
            slots = [r["slot"] for r in log.records if r["sport"] == port]
            assert slots == sorted(set(slots)), "two records of one socket in one slot, or out of order"
        for r in log.records:
            assert t0 + r["slot"] * interval_ns <= r["mono_ns"] < t0 + (r["slot"] + 1) * interval_ns
        assert log.footer["records"] == len(log.records) and log.footer["dropped"] == 0
        return
    log = sockdiag.parse_log(text)
    interval_ns, t0 = log.header["interval_ns"], log.header["t0_ns"]
    ticks = [s.tick for s in log.samples]
    assert ticks == sorted(set(ticks)), "two samples in one slot, or out of order"
    for s in log.samples:
        assert t0 + s.tick * interval_ns <= s.monotonic_ns < t0 + (s.tick + 1) * interval_ns, "a sample outside its slot"
    assert log.footer["samples"] == len(log.samples)
    assert log.footer["samples"] + log.footer["missed"] == log.footer["ticks"]
    assert not ticks or log.footer["ticks"] >= ticks[-1] + 1


@pytest.mark.parametrize("kind", ["netlink", "bpf"])
def test_keeps_its_schedule_during_a_flow(testbed, deployed, deployed_bpf, kind):
    cport = _free_port()
    path = {"netlink": deployed.path, "bpf": deployed_bpf.path}[kind]
    with _shaped_link(testbed):
        texts, result = _flow_with_samplers(testbed, {kind: (path, 10)}, cca="bbr", cport=cport, duration_s=5)
    text = texts[kind]
    _check_schedule(text)
    s = sockdiag.summary(text)
    assert s["ended"] == "stop_file"
    # Development measurements on the shared 2-core machine (TCG, load average 5-9): median 10.0-10.3 ms. The
    # bound leaves room for other engineers' VMs on the same cores; the benchmark reports the distribution.
    assert 9.5 <= s["interval"]["median_ms"] <= 11.0, s["interval"]
    flow = sockdiag.rows(text, ports=[cport])
    assert len(flow) >= 0.8 * 4 * 100
    # iperf3 3.12 sets TCP_CONGESTION after connecting and sending its 37-byte cookie: the first samples of a
    # data socket may show the default CCA, never once data has been sent
    first_bbr = next(i for i, r in enumerate(flow) if r["cca"] == "bbr")
    assert all(r["bytes_sent"] <= IPERF_COOKIE_BYTES for r in flow[:first_bbr])
    assert {r["cca"] for r in flow[first_bbr:]} == {"bbr"}


def _path(kind, deployed, deployed_bpf) -> str:
    return {"netlink": deployed.path, "bpf": deployed_bpf.path}[kind]


@pytest.mark.parametrize("kind", ["netlink", "bpf"])
def test_deadline_ends_it_with_footer(testbed, deployed, deployed_bpf, kind):
    t0 = time.monotonic()
    text = testbed.sender.host.output(sockdiag.sampler_argv(_path(kind, deployed, deployed_bpf), 10, 2,
                                                            "/tmp/bbrlab-nostop", [31031], iperf.DEFAULT_PORT,
                                                            kind=kind), timeout=60)
    elapsed_s = time.monotonic() - t0
    s = sockdiag.summary(text)
    assert s["ended"] == "deadline" and elapsed_s >= 2.0
    footer = text.splitlines()[-1]
    wall_ns = int(footer.split("wall_ns=")[1].split()[0])
    assert 2.0e9 <= wall_ns <= 2.5e9, footer
    _check_schedule(text)
    if kind == "netlink":
        assert 150 <= s["samples"] <= 200, s  # a sample every tick, with no socket to ask for
    else:
        assert s["samples"] == 0  # the BPF program records only when an ACK for a watched socket arrives
    assert s["cpu_s"] > 0


@pytest.mark.parametrize("kind", ["netlink", "bpf"])
@pytest.mark.parametrize("how", ["stop_file", "signal"])
def test_stop_file_or_signal_ends_it_with_footer(testbed, deployed, deployed_bpf, how, kind):
    host = testbed.sender.host
    base = f"/tmp/bbrlab-test-stop-{how}-{kind}"
    host.run(["rm", "-f", f"{base}.stop", f"{base}.log"])
    pid = host.spawn(sockdiag.sampler_argv(_path(kind, deployed, deployed_bpf), 10, 120, f"{base}.stop", [31041],
                                           iperf.DEFAULT_PORT, kind=kind), f"{base}.log")
    host.run(["sh", "-c", WAIT_READY_SH, "sh", f"{base}.log", str(pid)], timeout=90)
    time.sleep(1)  # one second of sampling before it is stopped
    if how == "stop_file":
        host.run(["touch", f"{base}.stop"])
    else:
        host.run(["kill", "-TERM", str(pid)])
    host.run(["sh", "-c", RUNNING_SH + 'i=0; while running "$1" && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); '
              'done; ! running "$1"', "sh", str(pid)], timeout=30)
    text = host.read_text(f"{base}.log")
    host.run(["rm", "-f", f"{base}.stop", f"{base}.log"])
    s = sockdiag.summary(text)
    assert s["ended"] == how
    if kind == "netlink":
        assert s["samples"] >= 50
    _check_schedule(text)


@pytest.mark.parametrize("kind,args,field", [
    ("netlink", ["-i", "50", "-p", "31050"], "-i (interval_us)"),
    ("netlink", ["-i", "10000", "-p", "0"], "-p (sport)"),
    ("netlink", ["-i", "10000", "-p", "31050,31050"], "listed twice"),
    ("netlink", ["-i", "10000", "-p", "70000"], "-p (sport)"),
    ("netlink", ["-i", "10000", "-p", "31050", "-f", "5"], "-f (family)"),
    ("bpf", ["-i", "50", "-p", "31050"], "-i (interval_us)"),
    ("bpf", ["-i", "10000", "-p", "31050,31050"], "listed twice"),
    ("bpf", ["-i", "10000", "-p", "31050", "-b", "5"], "-b (batch_ms)"),
])
def test_bad_arguments_refused_by_name(testbed, deployed, deployed_bpf, kind, args, field):
    res = testbed.sender.host.run([_path(kind, deployed, deployed_bpf), "-t", "1", "-s", "/tmp/x", "-d", "5201", *args],
                                  check=False)
    assert res.exit_code == 2 and field in res.stderr and res.stdout == ""


def test_bpf_sampler_without_privilege_fails_loudly(testbed, deployed_bpf):
    """Loading a BPF program needs CAP_BPF/CAP_SYS_ADMIN: as nobody it must fail, saying so, with a footer."""
    argv = sockdiag.sampler_argv(deployed_bpf.path, 10, 2, "/tmp/bbrlab-nostop", [31071], iperf.DEFAULT_PORT,
                                 kind="bpf")
    res = testbed.sender.host.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                   "--inh-caps=-all", *argv], check=False, timeout=60)
    _record("no-privilege.bpf.log", res.stdout)
    assert res.exit_code == 3, (res.exit_code, res.stdout, res.stderr)
    assert "loading the BPF program failed" in res.stderr
    s = sockdiag.summary(res.stdout)
    assert s["ended"] == "error" and s["errors"]
    with pytest.raises(sockdiag.SockdiagLogError, match="BPF program"):
        sockdiag.rows(res.stdout)


def test_bpf_state_agrees_with_netlink_on_a_live_flow(testbed, deployed, deployed_bpf):
    """Both samplers on one bbr flow: the BPF sampler at 10 ms, the netlink sampler at 2 ms.

    Counters: each BPF record lies between the netlink samples read before and after it. BBR's bw, min RTT
    and gains (decoded from struct bbr), mss and min RTT change rarely: in most records they equal what
    bbr_get_info()/tcp_info reported just before or just after. Rates, cwnd and RTT move with every ACK:
    their median distance to the nearest netlink sample stays within a few per cent.
    """
    cport = _free_port()
    with _shaped_link(testbed):
        texts, result = _flow_with_samplers(testbed, {"netlink": (deployed.path, 2), "bpf": (deployed_bpf.path, 10)},
                                            cca="bbr", cport=cport, duration_s=4)
    _record("live-bbr-both.sockdiag.log", texts["netlink"])
    _record("live-bbr-both.bpf.log", texts["bpf"])
    nl = [r for r in sockdiag.rows(texts["netlink"], ports=[cport]) if r["cca"] == "bbr"]
    bpf = [r for r in sockdiag.rows(texts["bpf"], ports=[cport]) if r["cca"] == "bbr"]
    assert len(bpf) > 200 and len(nl) > len(bpf)
    pairs = between_netlink_samples(bpf, nl, texts["netlink"])
    assert len(pairs) >= 0.8 * len(bpf)
    for row, before, after in pairs:
        for key in MONOTONE:
            assert before[key] <= row[key] <= after[key], (key, before[key], row[key], after[key])
    for key in ("bw_mbit", "mrtt_ms", "pacing_gain", "cwnd_gain", "mss", "minrtt_ms"):
        equal = sum(row[key] in (before[key], after[key]) for row, before, after in pairs)
        assert equal >= 0.8 * len(pairs), (key, equal, len(pairs))
    for key in ("pacing_rate_mbit", "delivery_rate_mbit", "cwnd", "rtt_ms"):
        gaps = sorted(min(abs(row[key] - n[key]) for n in (before, after) if n[key] is not None) / row[key]
                      for row, before, after in pairs if row[key] and (before[key] or after[key]))
        assert gaps and gaps[len(gaps) // 2] <= 0.05, (key, gaps[len(gaps) // 2])


_BLOCK = "/etc/modprobe.d/bbrlab-test-no-diag.conf"


@pytest.mark.parametrize("remove", [("tcp_diag",), ("tcp_diag", "inet_diag")])
def test_kernel_without_tcp_diag_fails_loudly(testbed, deployed, remove):
    host = testbed.sender.host
    assert "tcp_diag" in host.read_text("/proc/modules")
    try:
        host.write_text(_BLOCK, "".join(f"install {m} /bin/false\n" for m in remove))
        host.run(["rmmod", *remove])
        res = host.run(sockdiag.sampler_argv(deployed.path, 10, 2, "/tmp/bbrlab-nostop", [31061], iperf.DEFAULT_PORT),
                       check=False, timeout=60)
        modules = host.read_text("/proc/modules")
    finally:
        host.run(["rm", "-f", _BLOCK])
        host.run(["modprobe", "tcp_diag"])
    assert "tcp_diag " not in modules  # the block held: nothing reloaded it behind our back
    _record(f"no-diag-{'-'.join(remove)}.sockdiag.log", res.stdout)
    assert res.exit_code == 3, (res.exit_code, res.stdout, res.stderr)
    assert "no inet_diag/tcp_diag" in res.stderr
    log = sockdiag.parse_log(res.stdout)
    assert log.errors and log.footer["reason"] == "error"
    with pytest.raises(sockdiag.SockdiagLogError, match="tcp_diag"):
        sockdiag.rows(res.stdout)
    assert "tcp_diag" in host.read_text("/proc/modules")


@pytest.mark.parametrize("kind", ["netlink", "bpf"])
def test_deploy_copies_only_when_the_hash_differs(testbed, deployed, deployed_bpf, kind):
    host = testbed.sender.host
    first = {"netlink": deployed, "bpf": deployed_bpf}[kind]
    again = sockdiag.ensure_on_host(host, kind=kind)
    assert not again.copied and again.sha256 == first.sha256 and again.path == sockdiag.remote_path(kind)
    host.run(["sh", "-c", f"printf x >> {again.path}"])  # corrupt the guest's copy
    assert sockdiag.remote_sha256(host, again.path) != first.sha256
    fixed = sockdiag.ensure_on_host(host, kind=kind)
    assert fixed.copied and fixed.sha256 == sockdiag.build(kind).sha256 == sockdiag.remote_sha256(host, fixed.path)


# The BPF case runs with make test-slow: test_sampler_stream_testbed's BPF run (10 s, sampled every 2 ms) goes
# through the same run path and checks the same record fields.
@pytest.mark.parametrize("kind", [pytest.param("bpf", marks=pytest.mark.slow), "netlink"])
def test_sampled_run_through_the_run_path(testbed, tmp_path, kind):
    """The done-when criterion: 10 s at 100 % share sampled at 10 ms holds >= 500 samples; the record says
    which sampler (and binary) took them, the achieved interval, missed ticks and CPU per sample."""
    from bbrlab.run.runner import run_once
    from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Scenario

    scenario = Scenario(Link(rtt_ms=20, rate_mbit=100), Contention(10, 100),
                        Flow("bbr", IperfParams(duration_s=10), sample_ms=10, sampler=kind))
    record = run_once(testbed, scenario, tmp_path)
    assert record["status"] == "ok", record["reason"]
    s = record["metadata"]["sampling"]
    assert s["kind"] == kind and s["binary"]["sha256"] == sockdiag.build(kind).sha256
    assert s["asked_interval_ms"] == 10 and s["samples"] >= 500, s
    assert {"median_ms", "p99_ms", "longest_gap_ms"} <= set(s["interval"]) and s["missed_ticks"] is not None
    assert s["cpu_per_sample_ms"] > 0 and record["metadata"]["cca"]["ss_seen"] == ["bbr"]
    assert record["scenario"]["flow"]["sampler"] == kind
    rows = sockdiag.rows((tmp_path / "samples.log").read_text(), ports=record["metadata"]["flow"]["client_ports"])
    assert len(rows) >= 500 and not (tmp_path / "ss.log").exists()
