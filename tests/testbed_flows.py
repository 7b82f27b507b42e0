"""iperf3 from a testbed's sender to its receiver, for system tests that check a path carries traffic."""

from __future__ import annotations

import json
import time
from pathlib import Path


def serve_once(tb, port: int, log_dir: Path) -> None:
    """A one-transfer iperf3 server (``-s -1``) on the receiver, listening when this returns (30 s at most)."""
    rx = tb.receiver
    rx.host.spawn(["iperf3", "-s", "-1", "-p", str(port)], str(log_dir / "iperf3-server.log"))
    deadline = time.monotonic() + 30
    while f":{port} " not in rx.host.output(["ss", "-ltnH"]):
        assert time.monotonic() < deadline, "iperf3 server did not listen"
        time.sleep(0.2)


def client_report(tb, port: int, duration_s: int, *options: str) -> dict:
    """``iperf3 -c`` from the sender to the receiver's server for ``duration_s``; its JSON report."""
    res = tb.sender.host.run(["iperf3", "-c", tb.receiver.experiment_ip, "-p", str(port), "-t", str(duration_s),
                              *options, "-J"], timeout=duration_s + 60)
    return json.loads(res.stdout)


def bbr_flow(tb, port: int, log_dir: Path, duration_s: int) -> dict:
    """A bbr flow of ``duration_s`` from the sender to the receiver (checked: the sender ran bbr); the report."""
    serve_once(tb, port, log_dir)
    report = client_report(tb, port, duration_s, "-C", "bbr")
    assert report["end"]["sender_tcp_congestion"] == "bbr"
    return report


def received_mbit(report: dict) -> float:
    """What the receiver got, in Mbit/s."""
    return report["end"]["sum_received"]["bits_per_second"] / 1e6
