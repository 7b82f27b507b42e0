"""Record a small REAL campaign on this host: iperf3 between two network namespaces.

This is the data source for the data/plot/notebook tests and the ingest benchmark. Nothing here is
invented: every run is a real iperf3 transfer from a sender namespace to a receiver namespace over a
veth pair whose sender side has a tbf rate limit; ``ss -tinH`` is sampled in the sender namespace while
the transfer runs; a CPU-share below 100 % puts the iperf3 client under real SCHED_DEADLINE
(``chrt -d``, runtime = deadline = timeslice, period = timeslice / share).

What this is NOT is the paper's testbed: there is no VM (testbed kind ``host-netns``, accelerator and
hypervisor ``none``), no netem (the host kernel has none), so the RTT is the veth's own (tens of
microseconds, recorded as ``link.rtt_ms = 0``), and the contended thread is the iperf3 process, not a
vCPU. The record's metadata says exactly that.

Regenerate the committed fixture campaign with::

    .venv/bin/python -m tests.netns_campaign tests/fixtures/campaign
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

SENDER_IP = "10.211.0.1"
RECEIVER_IP = "10.211.0.2"
IPERF_PORT = 5301


@dataclass
class NetnsPair:
    """Two namespaces joined by a veth pair; the sender's side is rate limited with tbf."""

    sender_ns: str
    receiver_ns: str
    sender_if: str = "bbs0"
    receiver_if: str = "bbr0"

    def in_sender(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.sender_ns, *argv]

    def in_receiver(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.receiver_ns, *argv]


def _run(argv: list[str], timeout_s: float = 30) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout_s).stdout


@contextlib.contextmanager
def netns_pair(rate_mbit: float) -> Iterator[NetnsPair]:
    """Create the pair (unique names), yield it, always delete both namespaces."""
    tag = uuid.uuid4().hex[:6]
    pair = NetnsPair(f"bbl-tx-{tag}", f"bbl-rx-{tag}")
    created: list[str] = []
    try:
        for ns in (pair.sender_ns, pair.receiver_ns):
            _run(["ip", "netns", "add", ns])
            created.append(ns)
        _run(["ip", "-n", pair.sender_ns, "link", "add", pair.sender_if, "type", "veth",
              "peer", "name", pair.receiver_if, "netns", pair.receiver_ns])
        for ns, ifname, ip in ((pair.sender_ns, pair.sender_if, SENDER_IP),
                               (pair.receiver_ns, pair.receiver_if, RECEIVER_IP)):
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", ifname])
            _run(["ip", "-n", ns, "link", "set", ifname, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(pair.in_sender("tc", "qdisc", "add", "dev", pair.sender_if, "root", "tbf",
                            "rate", f"{rate_mbit:g}mbit", "burst", "32kb", "limit", "64kb"))
        _run(pair.in_sender("sysctl", "-q", "-w", "net.ipv4.tcp_no_metrics_save=1"))
        yield pair
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def read_qdiscs(pair: NetnsPair) -> dict:
    """The sender side's qdiscs as ``tc -j`` reports them (the rate limit that really held)."""
    return {pair.sender_if: json.loads(_run(pair.in_sender("tc", "-j", "qdisc", "show", "dev", pair.sender_if)))}


def _wait_listening(pair: NetnsPair, port: int, deadline_s: float = 10) -> None:
    """Poll until the receiver's iperf3 server listens (a real readiness condition)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        out = _run(pair.in_receiver("ss", "-tlnH", f"sport = :{port}"))
        if out.strip():
            return
        time.sleep(0.05)
    raise RuntimeError(f"iperf3 server in {pair.receiver_ns} did not listen on {port} within {deadline_s} s")


def _sample_ss(pair: NetnsPair, interval_s: float, stop: threading.Event, out: list[str]) -> None:
    """Append ``# t=<unix>`` + ``ss -tinH`` blocks until ``stop`` is set (contract: docs/run-record.md)."""
    while not stop.is_set():
        t = time.time()
        text = _run(pair.in_sender("ss", "-tinH", "dst", f"{RECEIVER_IP}:{IPERF_PORT}"))
        out.append((t, text))
        stop.wait(interval_s)


def _filter_ss_blocks(samples: list[tuple[float, str]], data_ports: set[int]) -> str:
    """Keep only the iperf3 data connections (by local port), as the contract asks."""
    lines: list[str] = []
    for t, text in samples:
        raw = text.splitlines()
        lines.append(f"# t={t:.6f}")
        i = 0
        while i < len(raw):
            head = raw[i]
            body = raw[i + 1] if i + 1 < len(raw) and raw[i + 1][:1].isspace() else None
            i += 2 if body is not None else 1
            fields = head.split()
            local = fields[3] if len(fields) > 3 else ""
            port = int(local.rsplit(":", 1)[-1]) if ":" in local else -1
            if port in data_ports:
                lines.append(head)
                if body is not None:
                    lines.append(body)
    return "\n".join(lines) + "\n"


def _chrt_prefix(contention: Contention) -> list[str]:
    if contention.unlimited:
        return []
    return ["chrt", "-d", "--sched-runtime", str(contention.runtime_ns), "--sched-deadline",
            str(contention.deadline_ns), "--sched-period", str(contention.period_ns), "0"]


def _read_policy(pid: int) -> str:
    try:
        return _run(["chrt", "-p", str(pid)], timeout_s=5)
    except subprocess.CalledProcessError as e:
        return f"unreadable: {e.stderr.strip()}"


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def record_run(pair: NetnsPair, scenario: Scenario, campaign_dir: Path, campaign: str,
               interval_s: float = 0.5) -> Path:
    """Run one real transfer and write its directory under ``campaign_dir/runs`` atomically."""
    run_id = scenario.run_id
    tmp = campaign_dir / ".tmp" / run_id
    tmp.mkdir(parents=True, exist_ok=True)
    started = _now_iso()
    server = subprocess.Popen(pair.in_receiver("iperf3", "-s", "-1", "-p", str(IPERF_PORT)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples: list[tuple[float, str]] = []
    stop = threading.Event()
    sampler = None
    try:
        _wait_listening(pair, IPERF_PORT)
        flow = scenario.flow
        client_argv = [*_chrt_prefix(scenario.contention), "iperf3", "-c", RECEIVER_IP, "-p", str(IPERF_PORT),
                       "-t", f"{flow.params.duration_s:g}", "-i", f"{interval_s:g}", "-P", str(flow.params.streams),
                       "-C", flow.cca, "-J"]
        client = subprocess.Popen(pair.in_sender(*client_argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        if flow.sample_ms:
            sampler = threading.Thread(target=_sample_ss, args=(pair, flow.sample_ms / 1000, stop, samples))
            sampler.start()
        policy = _policy_of_client(pair, client.pid)
        out, err = client.communicate(timeout=flow.params.duration_s + 30)
    finally:
        stop.set()
        if sampler is not None:
            sampler.join()
        _stop_server(server)
    report = json.loads(out)
    if client.returncode != 0 or "error" in report:
        raise RuntimeError(f"iperf3 failed: {report.get('error') or err}")
    (tmp / "iperf.json").write_text(out)
    data_ports = {c["local_port"] for c in report["start"]["connected"]}
    if flow.sample_ms:
        (tmp / "ss.log").write_text(_filter_ss_blocks(samples, data_ports))
    record = _record(scenario, campaign, started, report, policy)
    record["metadata"]["qdiscs"] = read_qdiscs(pair)
    (tmp / "record.json").write_text(json.dumps(record, indent=2))
    final = campaign_dir / "runs" / run_id
    final.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, final)
    return final


def _stop_server(proc: subprocess.Popen) -> None:
    """The one-shot server (``-1``) exits after its client; kill it only if it is still there."""
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _policy_of_client(pair: NetnsPair, wrapper_pid: int) -> str:
    """Read the scheduling policy of the running iperf3 client (child of ``ip netns exec``)."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        kids = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children")
        if kids.exists():
            pids = kids.read_text().split()
            target = int(pids[0]) if pids else wrapper_pid
            comm = Path(f"/proc/{target}/comm")
            if comm.exists() and comm.read_text().strip() == "iperf3":
                return _read_policy(target)
        elif Path(f"/proc/{wrapper_pid}/comm").exists() and \
                Path(f"/proc/{wrapper_pid}/comm").read_text().strip() == "iperf3":
            return _read_policy(wrapper_pid)
        time.sleep(0.02)
    return "unreadable: iperf3 client not found"


def _record(scenario: Scenario, campaign: str, started: str, report: dict, policy: str) -> dict:
    c = scenario.contention
    iperf_version = report.get("start", {}).get("version", "")
    return {
        "schema": "bbrlab.run/1",
        "run_id": scenario.run_id,
        "campaign": campaign,
        "status": "ok",
        "reason": None,
        "attempt": 1,
        "started_at": started,
        "ended_at": _now_iso(),
        "scenario": scenario.to_dict(),
        "metadata": {
            "testbed": {"name": "host-netns", "kind": "host-netns", "accelerator": "none", "hypervisor": "none",
                        "host_kernel": platform.release(), "sender_kernel": platform.release(),
                        "emulator_kernel": None, "receiver_kernel": platform.release(), "sender_vcpus": None,
                        "note": "iperf3 between two network namespaces on the host; veth + tbf rate limit; "
                                "no netem, so no emulated delay (rtt_ms 0 = veth RTT only); contention is "
                                "SCHED_DEADLINE on the iperf3 client process, not on a VM's vCPU"},
            "cca": {"requested": scenario.flow.cca,
                    "available": Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split(),
                    "iperf_sender": report.get("end", {}).get("sender_tcp_congestion"), "ss_seen": []},
            "module": None,
            "qdiscs": {},
            "contention": {"requested": {"timeslice_ms": c.timeslice_ms, "cpu_share_pct": c.cpu_share_pct},
                           "applied": [] if c.unlimited else [{
                               "policy": "SCHED_DEADLINE", "runtime_ns": c.runtime_ns,
                               "deadline_ns": c.deadline_ns, "period_ns": c.period_ns}],
                           "evidence": {"chrt_p_of_iperf3_client": policy.strip()}},
            "sysctls": {"sender": {"net.ipv4.tcp_no_metrics_save": "1"}},
            "offloads": {},
            "versions": {"iperf3": iperf_version, "bbrlab": "test-fixture"},
        },
    }


def small_grid(duration_s: float = 2, repetitions: int = 2) -> list[Scenario]:
    """cubic and bbr x share {25 % at 1 ms timeslice, 100 %} x repetitions, 100 Mbit/s, ss sampled."""
    link = Link(rtt_ms=0, rate_mbit=100, buffer_bdp=None, buffer_bytes=65536)
    out = []
    for cca in ("cubic", "bbr"):
        for share in (25, 100):
            for rep in range(repetitions):
                out.append(Scenario(link, Contention(timeslice_ms=1, cpu_share_pct=share),
                                    Flow(cca=cca, params=IperfParams(duration_s=duration_s, streams=1),
                                         sample_ms=200, sampler="ss"), rep))
    return out


def record_campaign(campaign_dir: Path, scenarios: list[Scenario], campaign: str = "host-netns-demo") -> list[Path]:
    """Record every scenario into ``campaign_dir`` (runs/ + plan.json) on one namespace pair per rate."""
    campaign_dir.mkdir(parents=True, exist_ok=True)
    plan = {"schema": "bbrlab.plan/1", "campaign": campaign, "seed": 0,
            "runs": [{"run_id": s.run_id, "scenario": s.to_dict()} for s in scenarios]}
    (campaign_dir / "plan.json").write_text(json.dumps(plan, indent=2))
    paths = []
    for rate in sorted({s.link.rate_mbit for s in scenarios}):
        with netns_pair(rate) as pair:
            for s in (s for s in scenarios if s.link.rate_mbit == rate):
                paths.append(record_run(pair, s, campaign_dir, campaign))
    shutil.rmtree(campaign_dir / ".tmp", ignore_errors=True)
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1])
    made = record_campaign(target, small_grid())
    print(f"recorded {len(made)} real runs into {target}")
