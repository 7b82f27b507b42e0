"""The netlink sampler built here (real cc, static) and run between two network namespaces on this host.

No VM: this checks the build and cache, and the program on this host's own kernel (6.18) with a real iperf3
flow; the guest kernel is tested in test_sockdiag_testbed.py.
"""

from __future__ import annotations

import subprocess

import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.core.hostloop import RUNNING_SH
from bbrlab.run import iperf
from bbrlab.sampling import sockdiag
from bbrlab.sampling.sockdiag import binary as build_mod
from tests.sampler_compare import WAIT_READY_SH
from tests.veth import veth_pair

pytestmark = pytest.mark.system

SENDER_IP, RECEIVER_IP = "10.214.0.1", "10.214.0.2"


@pytest.fixture
def pair():
    with veth_pair("12", SENDER_IP, RECEIVER_IP) as p:
        yield p.sender, p.receiver


@pytest.mark.parametrize("kind", ["netlink", "bpf"])
def test_build_is_static_and_cached(tmp_path, kind):
    first = sockdiag.build(kind)
    again = sockdiag.build(kind)
    assert again == first and first.path.is_file() and first.kind == kind
    assert first.source_sha256 == sockdiag.source_sha256(kind)
    file_type = subprocess.run(["file", "-b", str(first.path)], capture_output=True, text=True).stdout
    assert "statically linked" in file_type or "static-pie" in file_type, file_type
    elsewhere = sockdiag.build(kind, tmp_path)
    assert elsewhere.path.parent == tmp_path and elsewhere.source_sha256 == first.source_sha256
    changed = {**build_mod.sources(kind), "extra.h": b"/* a change */"}
    assert build_mod.cache_key(kind, changed) != build_mod.cache_key(kind)


def test_unknown_kind_is_refused():
    with pytest.raises(ValidationError, match="sampler"):
        sockdiag.build("perf")


@pytest.mark.parametrize("kind,what", [("netlink", "compiling the sockdiag sampler failed"),
                                       ("bpf", "compiling the BPF program failed")])
def test_compile_error_is_reported(tmp_path, kind, what):
    broken = {name: (b"int main(void) { return undefined_name; }\n" if name.endswith(".c") else data)
              for name, data in build_mod.sources(kind).items()}
    with pytest.raises(sockdiag.SamplerBuildError, match=what):
        build_mod._compile(kind, broken, tmp_path / "x")


def test_bpf_sampler_runs_on_this_host(pair, tmp_path):
    """The BPF sampler on this host's own kernel (6.18, with BTF): a real flow in the namespaces, recorded."""
    sender, receiver = pair
    deployed = sockdiag.ensure_on_host(sender, kind="bpf")
    server = iperf.start_server(receiver, str(tmp_path / "server.log"), lifetime_s=60)
    stop = tmp_path / "stop"
    try:
        pid = sender.spawn(sockdiag.sampler_argv(deployed.path, 5, 60, str(stop), [24200], iperf.DEFAULT_PORT,
                                                 kind="bpf"), str(tmp_path / "bpf.log"))
        sender.run(["sh", "-c", WAIT_READY_SH, "sh", str(tmp_path / "bpf.log"), str(pid)], timeout=60)
        sender.run(iperf.client_argv(RECEIVER_IP, cca="cubic", duration_s=2, cport=24200), timeout=60)
        stop.touch()
        sender.run(["sh", "-c", RUNNING_SH + 'i=0; while running "$1" && [ $i -lt 200 ]; do sleep 0.05; '
                    'i=$((i+1)); done; ! running "$1"', "sh", str(pid)], timeout=30)
    finally:
        iperf.stop(receiver, server)
    text = (tmp_path / "bpf.log").read_text()
    rows = sockdiag.rows(text, ports=[24200])
    assert len(rows) >= 100 and {r["cca"] for r in rows if r["bytes_sent"] > 37} == {"cubic"}
    assert sockdiag.summary(text)["ended"] == "stop_file"


def test_samples_a_real_flow_between_namespaces(pair, tmp_path):
    sender, receiver = pair
    deployed = sockdiag.ensure_on_host(sender)
    assert not deployed.copied and deployed.path == str(sockdiag.build().path)
    server = iperf.start_server(receiver, str(tmp_path / "server.log"), lifetime_s=60)
    stop = tmp_path / "stop"
    try:
        pid = sender.spawn(sockdiag.sampler_argv(deployed.path, 5, 60, str(stop), [24100, 24101], iperf.DEFAULT_PORT),
                           str(tmp_path / "netlink.log"))
        result = sender.run(iperf.client_argv(RECEIVER_IP, cca="cubic", duration_s=2, streams=2, cport=24100),
                            timeout=60)
        stop.touch()
        sender.run(["sh", "-c", RUNNING_SH + 'i=0; while running "$1" && [ $i -lt 200 ]; do sleep 0.05; '
                    'i=$((i+1)); done; ! running "$1"', "sh", str(pid)], timeout=30)
    finally:
        iperf.stop(receiver, server)
    parsed = iperf.parse_result(result.stdout)
    text = (tmp_path / "netlink.log").read_text()
    rows = sockdiag.rows(text, ports=parsed.data_ports)
    assert {r["port"] for r in rows} == {24100, 24101}  # the control connection's port is not asked for
    assert {r["cca"] for r in rows if r["bytes_sent"] > 37} == {"cubic"}
    assert max(r["bytes_acked"] for r in rows) > 1_000_000
    s = sockdiag.summary(text)
    assert s["ended"] == "stop_file" and s["samples"] >= 200 and s["asked_interval_ms"] == 5.0
    assert 4.5 <= s["interval"]["median_ms"] <= 6.0
