"""The netlink sampler for real, in the local testbed's sender VM (Debian 6.1 guest, TCG).

- it and ``ss`` read the same connection at the same moment and agree field by field: exactly (to
  ss's printing precision) on an idle connection, and on a live 100 Mbit/s flow every ss sample lies
  between the netlink samples around it (counters), its gains are among those BBR had meanwhile and
  its rates within the range the netlink samples span;
- it keeps its schedule (slots, missed ticks, never early);
- a stop file, its deadline or SIGTERM end it with its footer written;
- a kernel without inet_diag/tcp_diag makes it fail loudly (modules removed in the guest, autoload
  blocked by a modprobe.d ``install ... /bin/false``), and bad arguments are refused by name;
- deployment copies it only when the guest's copy differs.

``BBRLAB_RECORD_FIXTURES=DIR`` additionally writes what these tests recorded into DIR (that is how
tests/fixtures/sockdiag/ was made; its README says when and where).
"""

from __future__ import annotations

import math
import os
import random
import shlex
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from bbrlab import iperf, link, sampling, sockdiag
from bbrlab.scenario import Link

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
    return sockdiag.ensure_on_host(testbed.sender.host)


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


#: Values ss does not print (so its parser has None) while netlink reports them: retrans 0/0, the default
#: reordering of 3.
SS_OMITS = {"retrans_total": 0, "reordering": 3}


def _gformat_equal(netlink_value, ss_value, key: str = "") -> bool:
    """Equal to ss's printing precision: %g (6 significant digits) or whole bits per second."""
    if ss_value is None and key in SS_OMITS:
        return netlink_value == SS_OMITS[key]
    if netlink_value is None or ss_value is None:
        return netlink_value is ss_value
    if isinstance(ss_value, bool | str):
        return netlink_value == ss_value
    return math.isclose(netlink_value, ss_value, rel_tol=1e-5, abs_tol=1e-6)


#: Fields ss prints and that cannot change on an idle connection (lastsnd/lastrcv/lastack count time).
IDLE_FIELDS = ("cca", "recv_q", "send_q", "rto_ms", "rtt_ms", "rttvar_ms", "mss", "pmtu", "rcvmss", "advmss", "cwnd",
               "ssthresh", "bytes_sent", "bytes_retrans", "bytes_acked", "segs_out", "segs_in", "data_segs_out",
               "send_mbit", "pacing_rate_mbit", "delivery_rate_mbit", "delivered", "app_limited", "unacked",
               "retrans_out", "retrans_total", "lost", "sacked", "reordering", "rcv_space", "rcv_ssthresh", "notsent",
               "minrtt_ms", "snd_wnd", "bw_mbit", "mrtt_ms", "pacing_gain", "cwnd_gain", "inflight_bytes", "bdp_bytes",
               "inflight_bdp", "local", "peer", "port")


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
    ss_before = sampling.parse_ss_log("# t=0\n" + before)
    ss_after = sampling.parse_ss_log("# t=0\n" + after)
    rows = sockdiag.rows(netlink)
    assert len(ss_before) == len(ss_after) == 1 and len(rows) >= 9
    assert {k: ss_before[0].get(k) for k in IDLE_FIELDS} == {k: ss_after[0].get(k) for k in IDLE_FIELDS}, \
        "the connection was not idle"
    assert ss_before[0]["cca"] == cca
    for row in rows:
        diffs = {k: (row[k], ss_before[0].get(k)) for k in IDLE_FIELDS if not _gformat_equal(row[k], ss_before[0].get(k), k)}
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


def _flow_with_samplers(testbed, deployed, *, cca: str, cport: int, duration_s: int, netlink_ms: float,
                        with_ss: bool) -> tuple[str, str | None, iperf.IperfResult]:
    """One iperf3 flow (one stream) with the netlink sampler and optionally the ss loop, both started
    before the client and stopped after it."""
    sender, receiver = testbed.sender.host, testbed.receiver
    base = f"/tmp/bbrlab-test-sockdiag-{cport}"
    sender.run(["rm", "-rf", base])
    sender.run(["mkdir", "-p", base])
    server = iperf.start_server(receiver.host, f"{base}.server.log", lifetime_s=duration_s + 60)
    try:
        nl = sender.spawn(sockdiag.sampler_argv(deployed.path, netlink_ms, duration_s + 60, f"{base}/stop", [cport],
                                                iperf.DEFAULT_PORT), f"{base}/netlink.log")
        ss = sender.spawn(sampling.sampler_argv(10, duration_s + 60, f"{base}/stop", data_ports=[cport]),
                          f"{base}/ss.log") if with_ss else None
        result = sender.run(iperf.client_argv(receiver.experiment_ip, cca=cca, duration_s=duration_s, cport=cport),
                            timeout=duration_s + 60)
        sender.run(["touch", f"{base}/stop"])
        for pid in (nl, ss):
            if pid is not None:
                sender.run(["sh", "-c", iperf.RUNNING_SH + 'i=0; while running "$1" && [ $i -lt 400 ]; do sleep 0.05; '
                            'i=$((i+1)); done; ! running "$1"', "sh", str(pid)], timeout=60)
        netlink_text = sender.read_text(f"{base}/netlink.log")
        ss_text = sender.read_text(f"{base}/ss.log") if with_ss else None
    finally:
        iperf.stop(receiver.host, server, remove=[f"{base}.server.log"])
        sender.run(["rm", "-rf", base], check=False)
    return netlink_text, ss_text, iperf.parse_result(result.stdout)


#: Counters that only grow: every ss sample must lie between the netlink samples around it.
MONOTONE = ("bytes_sent", "bytes_acked", "segs_out", "data_segs_out", "delivered", "bytes_retrans", "retrans_total")
#: Rates: ss's value must lie within the range the netlink samples around it span, widened by this much.
RATE_TOLERANCE = 0.02


def test_live_flow_ss_within_netlink_samples(testbed, deployed):
    cport = _free_port()
    with _shaped_link(testbed):
        netlink_text, ss_text, result = _flow_with_samplers(testbed, deployed, cca="bbr", cport=cport, duration_s=4,
                                                            netlink_ms=10, with_ss=True)
    _record("live-bbr.sockdiag.log", netlink_text)
    _record("live-bbr.ss.log", ss_text)
    assert result.sender_tcp_congestion == "bbr"
    nl = sockdiag.rows(netlink_text, ports=[cport])
    ss = sampling.parse_ss_log(ss_text, ports=[cport])
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
        for key in ("pacing_gain", "cwnd_gain", "mrtt_ms", "mss"):
            seen = {r[key] for r in window}
            assert any(_gformat_equal(v, row[key]) for v in seen), (key, row[key], seen)
        for key in ("pacing_rate_mbit", "delivery_rate_mbit", "bw_mbit", "cwnd"):
            low, high = min(r[key] for r in window), max(r[key] for r in window)
            assert low * (1 - RATE_TOLERANCE) <= row[key] <= high * (1 + RATE_TOLERANCE), (key, low, row[key], high)
        checked += 1
    assert checked >= 3, "too few ss samples with netlink samples on both sides"


def _check_schedule(log: sockdiag.SockdiagLog) -> None:
    interval_ns = log.header["interval_ns"]
    t0 = log.header["t0_ns"]
    ticks = [s.tick for s in log.samples]
    assert ticks == sorted(set(ticks)), "two samples in one slot, or out of order"
    for s in log.samples:
        assert t0 + s.tick * interval_ns <= s.monotonic_ns < t0 + (s.tick + 1) * interval_ns, "a sample outside its slot"
    assert log.footer["samples"] == len(log.samples)
    assert log.footer["samples"] + log.footer["missed"] == log.footer["ticks"]
    assert log.footer["ticks"] >= ticks[-1] + 1


def test_keeps_its_schedule_during_a_flow(testbed, deployed):
    cport = _free_port()
    with _shaped_link(testbed):
        text, _, result = _flow_with_samplers(testbed, deployed, cca="bbr", cport=cport, duration_s=5, netlink_ms=10,
                                              with_ss=False)
    log = sockdiag.parse_log(text)
    _check_schedule(log)
    s = sockdiag.summary(log)
    assert s["ended"] == "stop_file"
    # Development measurement on the shared 2-core machine (TCG): median 10.0 ms. The bound leaves room for
    # other engineers' VMs on the same cores; the benchmark reports the distribution.
    assert 9.5 <= s["interval"]["median_ms"] <= 11.0, s["interval"]
    assert s["samples"] >= 0.8 * 5 * 100, s
    flow = sockdiag.rows(log, ports=[cport])
    assert len(flow) >= 0.8 * 4 * 100
    # iperf3 3.12 sets TCP_CONGESTION after connecting and sending its 37-byte cookie: the first samples of a
    # data socket may show the default CCA, never once data has been sent
    first_bbr = next(i for i, r in enumerate(flow) if r["cca"] == "bbr")
    assert all(r["bytes_sent"] <= IPERF_COOKIE_BYTES for r in flow[:first_bbr])
    assert {r["cca"] for r in flow[first_bbr:]} == {"bbr"}


def test_deadline_ends_it_with_footer(testbed, deployed):
    t0 = time.monotonic()
    text = testbed.sender.host.output(sockdiag.sampler_argv(deployed.path, 10, 2, "/tmp/bbrlab-nostop", [31031],
                                                            iperf.DEFAULT_PORT), timeout=60)
    elapsed_s = time.monotonic() - t0
    log = sockdiag.parse_log(text)
    assert log.footer["reason"] == "deadline"
    assert 2.0e9 <= log.footer["wall_ns"] <= 2.2e9 and elapsed_s >= 2.0
    _check_schedule(log)
    assert 150 <= log.footer["samples"] <= 200, log.footer
    assert log.footer["cpu_user_us"] + log.footer["cpu_sys_us"] > 0


@pytest.mark.parametrize("how", ["stop_file", "signal"])
def test_stop_file_or_signal_ends_it_with_footer(testbed, deployed, how):
    host = testbed.sender.host
    base = f"/tmp/bbrlab-test-stop-{how}"
    host.run(["rm", "-f", f"{base}.stop", f"{base}.log"])
    pid = host.spawn(sockdiag.sampler_argv(deployed.path, 10, 120, f"{base}.stop", [31041], iperf.DEFAULT_PORT),
                     f"{base}.log")
    deadline = time.monotonic() + 30
    while not host.read_text(f"{base}.log").startswith(sockdiag.parse.MAGIC):  # it flushes its header at once
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1)  # one second of sampling before it is stopped
    if how == "stop_file":
        host.run(["touch", f"{base}.stop"])
    else:
        host.run(["kill", "-TERM", str(pid)])
    host.run(["sh", "-c", iperf.RUNNING_SH + 'i=0; while running "$1" && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); '
              'done; ! running "$1"', "sh", str(pid)], timeout=30)
    text = host.read_text(f"{base}.log")
    host.run(["rm", "-f", f"{base}.stop", f"{base}.log"])
    log = sockdiag.parse_log(text)
    assert log.footer is not None and log.footer["reason"] == how
    assert log.footer["samples"] >= 50 and log.footer["wall_ns"] < 60e9
    _check_schedule(log)


@pytest.mark.parametrize("interval_us,ports,field", [("50", "31050", "-i (interval_us)"),
                                                     ("10000", "0", "-p (sport)"),
                                                     ("10000", "31050,31050", "listed twice"),
                                                     ("10000", "70000", "-p (sport)")])
def test_bad_arguments_refused_by_name(testbed, deployed, interval_us, ports, field):
    res = testbed.sender.host.run([deployed.path, "-i", interval_us, "-t", "1", "-s", "/tmp/x", "-d", "5201", "-p",
                                   ports], check=False)
    assert res.exit_code == 2 and field in res.stderr and res.stdout == ""


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


def test_deploy_copies_only_when_the_hash_differs(testbed, deployed):
    host = testbed.sender.host
    again = sockdiag.ensure_on_host(host)
    assert not again.copied and again.sha256 == deployed.sha256
    host.run(["sh", "-c", f"printf x >> {sockdiag.REMOTE_PATH}"])  # corrupt the guest's copy
    assert sockdiag.remote_sha256(host) != deployed.sha256
    fixed = sockdiag.ensure_on_host(host)
    assert fixed.copied and fixed.sha256 == sockdiag.build().sha256 == sockdiag.remote_sha256(host)
