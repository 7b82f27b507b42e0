"""Real iperf3 and the real ss sampler between two network namespaces on this host.

No VM and no netem here (the host kernel has none): this checks the iperf and sampling modules
themselves (server readiness, client ports, JSON, the sampler loop, its stop file and footer, the
parser on live output); the full runner is tested on the local testbed.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from bbrlab.core.ownedpids import parse_pid_line
from bbrlab.run import checks, iperf
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling.ss import parse_ss_log
from tests.veth import veth_pair

pytestmark = pytest.mark.system

SENDER_IP, RECEIVER_IP = "10.213.0.1", "10.213.0.2"


@pytest.fixture
def pair():
    with veth_pair("6", SENDER_IP, RECEIVER_IP) as p:
        subprocess.run(["ip", "netns", "exec", p.sender.netns, "tc", "qdisc", "add", "dev", p.sender_if, "root", "tbf",
                        "rate", "200mbit", "burst", "32kb", "limit", "128kb"], check=True, capture_output=True)
        yield p.sender, p.receiver


def test_server_client_and_sampler(pair, tmp_path):
    sender, receiver = pair
    server_log = str(tmp_path / "server.log")
    stop_file = str(tmp_path / "stop")
    pid = iperf.start_server(receiver, server_log, lifetime_s=60)
    try:
        assert iperf.listening(receiver, iperf.DEFAULT_PORT)
        with pytest.raises(iperf.IperfError, match="already in use"):
            iperf.start_server(receiver, str(tmp_path / "second.log"), lifetime_s=60)
        ports = [24000, 24001]
        sampler_pid = sender.spawn(sampling.sampler_argv(10, 60, stop_file, data_ports=ports),
                                   str(tmp_path / "ss.log"))
        result = sender.run(iperf.client_argv(RECEIVER_IP, cca="cubic", duration_s=2, streams=2, cport=24000),
                            timeout=60)
        sender.run(["touch", stop_file])
        sampler_done = sender.run(["sh", "-c", 'while kill -0 "$1" 2>/dev/null; do sleep 0.05; done', "sh",
                                   str(sampler_pid)], timeout=20)
        assert sampler_done.ok
    finally:
        iperf.stop(receiver, pid)
    assert not iperf.alive(receiver, pid)

    parsed = iperf.parse_result(result.stdout)
    assert parsed.sender_tcp_congestion == "cubic"
    assert list(parsed.data_ports) == ports
    assert 10 < parsed.receiver_mbit <= 205
    assert len(parsed.intervals) >= 2

    text = (tmp_path / "ss.log").read_text()
    footer = sampling.parse_sampler_footer(text)
    assert footer is not None and footer["samples"] >= 10 and footer["cpu_s"] >= 0
    rows = parse_ss_log(text)
    assert rows, "the sampler recorded no data connection"
    assert {r["port"] for r in rows} == set(ports)  # the control connection was filtered out by ss
    # iperf3 sets -C on a data socket after it connects: ss can catch a stream under the namespace's default
    # CCA (bbr on this host) while only iperf3's cookie has been sent. Once a stream carries data it is cubic,
    # the rule the run path checks too (bbrlab.run.checks.samples).
    carrying = [r for r in rows if r["bytes_sent"] > checks.IPERF_COOKIE_BYTES]
    assert carrying and {r["cca"] for r in carrying} == {"cubic"}
    assert max(r["bytes_acked"] for r in rows) > 1_000_000
    gaps = sampling.achieved_interval_ms(text)
    assert gaps["median_ms"] >= 9.0


def test_hostile_values_passed_literally_or_refused(pair, tmp_path):
    sender, _ = pair
    marker = tmp_path / "pwned"
    with pytest.raises(ValueError, match="flow.cca"):
        iperf.client_argv(RECEIVER_IP, cca=f"bbr; touch {marker}", duration_s=2)
    with pytest.raises(ValueError, match="server_ip"):
        iperf.client_argv(f"{RECEIVER_IP}\ntouch {marker}", cca="bbr", duration_s=2)
    # A stop-file path with shell syntax is passed to the sampler as one literal argument: the sampler
    # stops at its deadline (1 s) without ever running what the path spells.
    weird = str(tmp_path / f"$(touch {marker}); `touch {marker}`")
    sender.run(sampling.sampler_argv(50, 1, weird), timeout=30)
    assert not marker.exists()
    assert not os.path.exists(weird)


def test_link_show_in_one_command_matches_per_port_readback(pair):
    from bbrlab.link import emulator as link

    sender, _ = pair
    dev = sender.output(["ip", "-o", "link", "show", "type", "veth"]).split(":")[1].strip().split("@")[0]
    ports = [dev, "lo"]
    keys = ("kind", "handle", "parent", "root", "options")

    def setup(shown):
        return {i: [{k: q.get(k) for k in keys} for q in qs] for i, qs in shown.items()}

    once = link.show(sender, ports)
    assert setup(once) == setup({p: link.readback(sender, p) for p in ports})
    assert once[dev][0]["kind"] == "tbf" and "dev" not in once[dev][0]


def _transfer_sampled(pair, tmp_path, *, kill_sampler: bool):
    """A 2 s cubic transfer sampled by the ss loop through :func:`sampling.sampler` (its log streamed into
    tmp_path through the byte-capped pipe); with ``kill_sampler`` the sampler's session is SIGKILLed before the
    stop, as the stop does to one that does not end."""
    sender, receiver = pair
    pid = iperf.start_server(receiver, str(tmp_path / "server.log"), lifetime_s=60)
    try:
        with sampling.sampler(sender, [24100], 10, 60, log_file=tmp_path / "ss.log", kind="ss") as sampled:
            sender.run(iperf.client_argv(RECEIVER_IP, cca="cubic", duration_s=2, streams=1, cport=24100), timeout=60)
            if kill_sampler:
                leader = parse_pid_line(sender.output(["cat", sampled.pid_path])).pid
                os.killpg(leader, 9)
    finally:
        iperf.stop(receiver, pid)
    return sampled


def test_a_sampled_transfer_passes_its_checks_with_the_samplers_exit_code(pair, tmp_path):
    sampled = _transfer_sampled(pair, tmp_path, kill_sampler=False)
    assert sampled.exit_code == 0 and not sampled.capped
    summary, seen = checks.samples(sampled, [24100], "cubic", 10)
    assert summary.ended == "stop_file" and seen == ["cubic"]


def test_a_sampler_killed_mid_run_fails_its_checks(pair, tmp_path):
    sampled = _transfer_sampled(pair, tmp_path, kill_sampler=True)
    assert sampled.exit_code != 0
    with pytest.raises(checks.RunFailed, match="exited with|not by its stop file"):
        checks.samples(sampled, [24100], "cubic", 10)
