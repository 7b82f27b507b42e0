"""Pure parts of the runner: client ports, and the iperf3 argument lists (no testbed needed)."""

from __future__ import annotations

import pytest

from bbrlab.run import iperf
from bbrlab.run.runner import client_ports


def test_client_ports_below_the_ephemeral_range_and_vary():
    ports = {client_ports(f"run-{i}", 1, 1)[0] for i in range(200)}
    assert all(20_000 <= p and p + 127 < 32_768 for p in ports)
    assert len(ports) > 50
    assert len({client_ports("x", attempt, 1)[0] for attempt in range(1, 6)}) > 1  # a retry moves to other ports
    four = client_ports("y", 1, 4)
    assert four == list(range(four[0], four[0] + 4)) and four[-1] < 32_768


def test_client_argv_is_a_literal_argument_list():
    argv = iperf.client_argv("10.0.0.2", cca="bbr2b", duration_s=20, streams=4, cport=20_000)
    assert argv[:5] == ["env", "BBRLAB_IPERF3=1", "timeout", "--kill-after=5", "35"]
    i = argv.index("iperf3")
    assert argv[i:] == ["iperf3", "-c", "10.0.0.2", "-p", "5201", "-t", "20", "-P", "4", "-C", "bbr2b", "-J",
                        "--get-server-output", "--cport", "20000"]


@pytest.mark.parametrize("kw", [{"streams": 0}, {"streams": 129}, {"cport": 65_535, "streams": 2}, {"port": 0}])
def test_client_argv_refuses_out_of_range(kw):
    args = {"cca": "bbr", "duration_s": 5, **kw}
    with pytest.raises(ValueError):
        iperf.client_argv("10.0.0.2", **args)


def test_server_argv_has_a_lifetime():
    assert iperf.server_argv(5201, lifetime_s=80) == ["env", "BBRLAB_IPERF3=1", "timeout", "--kill-after=5", "80",
                                                      "iperf3", "-s", "-1", "-J", "-p", "5201"]


def test_git_commit_names_this_checkout_and_is_read_once():
    import subprocess
    from pathlib import Path

    import bbrlab
    from bbrlab.run import record

    package = Path(bbrlab.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    first = record.git_commit()
    assert first is not None and first.split("+")[0] == head
    assert first.endswith("+dirty") == bool(subprocess.run(
        ["git", "-C", str(package), "status", "--porcelain", "--untracked-files=no", "--", "."],
        capture_output=True, text=True).stdout.strip())
    assert record.git_commit() is first  # one read per process
