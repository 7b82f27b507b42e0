"""Real commands on this machine: LocalHost, NetnsHost and `bbrlab doctor`."""

import json
import subprocess
import sys
import uuid

import pytest

from bbrlab.core.commands import CommandError, CommandTimeout
from bbrlab.core.hosts import LocalHost, NetnsHost

pytestmark = pytest.mark.system


def test_local_host_passes_hostile_values_literally(tmp_path):
    marker = tmp_path / "x"
    host = LocalHost()
    for value in [f"bbr; touch {marker}", f"$(touch {marker})", f"a\ntouch {marker}", "`id`"]:
        assert host.run(["printf", "%s", value]).stdout == value
    assert not marker.exists()


def test_local_host_errors_and_timeouts():
    host = LocalHost()
    with pytest.raises(CommandError) as e:
        host.run(["sh", "-c", "echo boom >&2; exit 3"])
    assert "boom" in str(e.value) and e.value.result.exit_code == 3
    assert host.run(["false"], check=False).exit_code == 1
    with pytest.raises(CommandTimeout):
        host.run(["sleep", "5"], timeout=0.5)
    with pytest.raises(TypeError):
        host.run("ip link")


def test_netns_host_runs_inside_its_namespace():
    ns = f"bbrlab-t-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        links = NetnsHost(name="rx", netns=ns).output(["ip", "-o", "link"])
        assert links.count("\n") == 0 and "lo:" in links  # only loopback in a new namespace
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)


def test_doctor_reports_this_machine_honestly():
    p = subprocess.run([sys.executable, "-m", "bbrlab.cli.main", "doctor", "--json"], capture_output=True, text=True)
    checks = {c["name"]: c for c in json.loads(p.stdout)}
    assert checks["root"]["status"] == "ok"
    assert checks["SCHED_DEADLINE"]["status"] == "ok"
    assert checks["host qdisc tbf"]["status"] == "ok"
    # This project's host kernel is built without netem: doctor must say so, not pretend.
    assert checks["host qdisc netem"]["status"] == ("ok" if _host_has_netem() else "warn")
    assert checks["tool iperf3"]["status"] == "ok"


def _host_has_netem() -> bool:
    """Independent of doctor: try netem on a veth in a throw-away namespace."""
    ns = f"bbrlab-t-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb"], check=True)
        return subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "va", "root", "netem", "delay", "1ms"],
                              capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)
