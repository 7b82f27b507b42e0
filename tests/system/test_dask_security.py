"""The Dask engine admits only its own (issue 24, item 1), with real Dask processes on loopback and the
stand-in run function of tests/engine_runs.py (no testbed needed; each test takes seconds):

- a campaign's local cluster listens on 127.0.0.0/8 only (every listening socket of the driver's process tree,
  read from /proc while the campaign runs), speaks TLS, keeps its key files private and removes them;
- its scheduler, workers and nannies refuse a client without the campaign's certificate (real TLS handshakes);
- a worker holding a valid certificate that forges outcomes (another run's id, a file named ``../../../x``)
  gets failed attempts with the reason, and nothing is written outside the campaign directory;
- a plain Dask worker offering the testbed resource without bbrlab's plugin, and a worker killed by its
  run (``KilledWorker``), become failed attempts with the reason: the campaign ends normally and resumes;
- ``bbrlab tls`` makes a lab CA and host certificates that a real TLS scheduler and ``campaign run
  --scheduler tls://`` accept, and ``tcp://`` is refused unless ``--insecure``, which the records note.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbrlab.campaign.options import CampaignOptions
from tests.engine_runs import dying_run, slow_run, spec

QUIET = CampaignOptions(progress=False)  # no progress bar in the tests' output

pytestmark = pytest.mark.system
ROOT = Path(__file__).parents[2]
BIN = Path(sys.executable).parent


# -- reading who listens where ------------------------------------------------------------------------

def _tree(pid: int) -> set[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += children.get(p, [])
    return out


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return inodes


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words)


def listeners(pids: set[int]) -> list[tuple[str, int]]:
    """Every listening TCP socket (IPv4 and IPv6) of processes ``pids``: ``[(address, port)]``."""
    inodes = _socket_inodes(pids)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                host, port = fields[1].split(":")
                found.append((str(_address(host)), int(port, 16)))
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_a_local_campaign_listens_on_loopback_only_speaks_tls_and_removes_its_keys(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "BBRLAB_TEST_RUN_S": "0.8"}
    driver = subprocess.Popen([sys.executable, "-m", "tests.engine_runs", str(out)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        words = driver.stdout.readline().split()
        assert words[:1] == ["started"], driver.stderr.read()[-2000:]
        seen = listeners(_tree(driver.pid))
        tls_dir = Path(words[2]) if len(words) > 2 else None
        tls_mode = stat.S_IMODE(tls_dir.stat().st_mode) if tls_dir else None
        file_modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tls_dir.iterdir()} if tls_dir else {}
        rc = driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    print(f"listeners of the campaign's processes: {sorted(seen)}")
    # scheduler, its HTTP endpoint, and for each of the two testbeds a nanny, a worker and its HTTP endpoint
    assert len(seen) >= 5, seen
    assert [a for a in seen if not _is_loopback(a[0])] == [], seen
    assert words[1].startswith("tls://127.0.0.1:"), words
    assert rc == 0
    assert tls_mode == 0o700 and file_modes and set(file_modes.values()) == {0o600}, (tls_mode, file_modes)
    assert not tls_dir.exists()  # the campaign's keys are gone with it
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/record.json")]
    assert len(records) == 12 and {r["metadata"]["worker"]["transport"] for r in records} == {"tls"}


# -- who may connect ------------------------------------------------------------------------------------

def _identity(address: str, security) -> dict:
    from distributed.core import rpc

    async def ask() -> dict:
        args = security.get_connection_args("client") if security is not None else {}
        async with rpc(address, timeout=5, connection_args=args) as peer:
            return await asyncio.wait_for(peer.identity(), 5)

    return asyncio.run(ask())


def _bare_tls_refused(address: str, ca_file: str) -> bool:
    """A TLS client that trusts the cluster's CA but shows no certificate: True when the server refuses it."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(b"\0" * 16)
            return s.recv(1) == b""  # TLS 1.3: the server's refusal arrives after the client's handshake
    except (ssl.SSLError, ConnectionError, TimeoutError):
        return True


def test_the_cluster_refuses_clients_without_the_campaigns_certificate(tmp_path):
    from distributed import Client
    from distributed.security import Security

    from bbrlab.campaign import distributed as d
    from bbrlab.campaign import tls as tlsconf

    other = tlsconf.campaign_files(tmp_path / "other")  # a valid certificate of another CA
    with d.local_cluster(["a", "b"], run_function=slow_run) as cluster, Client(cluster) as client:
        d.wait_for_workers(client, 2)
        workers = client.scheduler_info()["workers"]
        addresses = [cluster.scheduler_address, *workers, *(w["nanny"] for w in workers.values())]
        ca = str(Path(cluster.tls_dir) / tlsconf.CA_CERT)
        stranger = Security(require_encryption=True, tls_ca_file=ca, tls_client_cert=str(other.cert),
                            tls_client_key=str(other.key))
        for address in addresses:
            assert address.startswith("tls://127.0.0.1:"), address
            assert _identity(address, cluster.security)["type"]  # the campaign's own certificate gets in
            with pytest.raises(Exception):  # noqa: B017 - Dask's error type differs by where the handshake fails
                _identity(address, stranger)
            with pytest.raises(Exception):  # noqa: B017
                _identity("tcp://" + address.split("://", 1)[1], None)  # plain tcp on the same port
            assert _bare_tls_refused(address, ca), address


# -- what comes back --------------------------------------------------------------------------------------

def _rogue(mode: str, cluster) -> subprocess.Popen:
    files = []
    if getattr(cluster, "tls_dir", None):
        tls = Path(cluster.tls_dir)
        files = [str(tls / "ca.pem"), str(tls / "campaign.pem"), str(tls / "campaign-key.pem")]
    proc = subprocess.Popen([sys.executable, "-m", "tests.rogue_worker", mode, cluster.scheduler_address, *files],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "joined", proc.stderr.read()[-2000:]
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _failed_records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in out.glob("failed/*/record.json")]


def _wait_resource_workers(client, n: int) -> None:
    from bbrlab.campaign import distributed as d

    deadline = time.monotonic() + 60
    while len(d.testbed_workers(client)) < n:
        assert time.monotonic() < deadline, "the third worker did not join"
        time.sleep(0.1)


def test_forged_outcomes_are_failed_attempts_and_nothing_lands_outside_the_campaign(tmp_path):
    from distributed import Client

    from bbrlab.campaign import distributed as d

    out = tmp_path / "campaign"
    with d.local_cluster(["a", "b"], run_function=slow_run) as cluster, Client(cluster) as client:
        d.wait_for_workers(client, 2)
        rogue = _rogue("forge", cluster)
        try:
            _wait_resource_workers(client, 3)
            st = d.run_campaign_distributed(spec(), out, client, options=QUIET)
        finally:
            _stop(rogue)
    assert list(tmp_path.rglob("escaped-x")) == []  # not beside the campaign, not anywhere
    refused = [r for r in _failed_records(out) if "the outcome was refused" in (r["reason"] or "")]
    assert refused, "the rogue worker got no run"
    assert any("is not a plain name" in r["reason"] for r in refused) or \
        any("this task was attempt" in r["reason"] for r in refused)
    assert all(r["metadata"]["worker"]["testbed"] is None for r in refused)  # the driver's own record
    for path in out.glob("runs/*/record.json"):  # nothing the rogue said was kept
        r = json.loads(path.read_text())
        assert r["metadata"]["worker"]["testbed"] in ("a", "b") and path.parent.name == r["run_id"]
    assert st.done + st.failed == 12 and st.running == 0
    assert {p.name for p in out.iterdir()} <= {"plan.json", "spec.yaml", "runs", "failed", ".tmp", ".lock",
                                               "campaign.lock"}


def test_a_foreign_worker_joining_does_not_end_the_campaign(tmp_path, capfd):
    from distributed import Client

    from bbrlab.campaign import distributed as d

    out = tmp_path / "campaign"
    with d.local_cluster(["a", "b"], run_function=slow_run) as cluster, Client(cluster) as client:
        d.wait_for_workers(client, 2)
        foreign = _rogue("foreign", cluster)
        try:
            _wait_resource_workers(client, 3)
            st = d.run_campaign_distributed(spec(), out, client, options=QUIET)
            left = len(d.testbed_workers(client))
        finally:
            _stop(foreign)
    reasons = [r["reason"] for r in _failed_records(out)]
    assert reasons and all("no bbrlab testbed plugin" in r for r in reasons), reasons
    assert st.done == 12 and st.failed == 0  # each run it took ran again on a testbed worker
    assert left == 2  # it was withdrawn: no more runs for it
    assert "no bbrlab testbed plugin" in capfd.readouterr().err


def test_a_killed_worker_is_a_failed_attempt_and_the_campaign_resumes(tmp_path, monkeypatch):
    import dask
    from distributed import Client

    from bbrlab.campaign import distributed as d
    from bbrlab.campaign.spec import CampaignSpec

    two = CampaignSpec.from_dict({**spec().to_dict(), "name": "killed", "timeslices_ms": [10],
                                  "cpu_shares_pct": [100]})  # two runs: one per worker, so a death hits one
    victim = two.plan()[0].run_id
    monkeypatch.setenv("BBRLAB_TEST_DIE_RUN", victim)
    monkeypatch.setenv("BBRLAB_TEST_RUN_S", "0.1")
    out = tmp_path / "campaign"
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            d.local_cluster(["a", "b"], run_function=dying_run) as cluster, Client(cluster) as client:
        d.wait_for_workers(client, 2)
        st = d.run_campaign_distributed(two, out, client, options=QUIET)
        mine = [r for r in _failed_records(out) if r["run_id"] == victim]
        assert sorted(r["attempt"] for r in mine) == [1, 2]
        assert all("KilledWorker" in r["reason"] for r in mine), [r["reason"] for r in mine]
        assert st.failed >= 1 and st.done + st.failed == 2
        d.wait_for_workers(client, 2)
        again = d.run_campaign_distributed(two, out, client, options=QUIET)  # the resume: no traceback
    assert again.done >= st.done
    assert sorted(r["attempt"] for r in _failed_records(out) if r["run_id"] == victim) == [1, 2]


# -- a lab: bbrlab tls, a TLS dask scheduler, the command ---------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_scheduler(address: str, tls: list[str]) -> subprocess.Popen:
    port = address.rsplit(":", 1)[1]
    proc = subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", port,
                             "--no-dashboard", *tls], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:  # listening (its log may be quiet: DASK_LOGGING__DISTRIBUTED=warning from an earlier test)
        assert proc.poll() is None and time.monotonic() < deadline, "the scheduler did not start"
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)


def _bbrlab(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "bbrlab"), *argv], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _tls_args(directory: Path, name: str) -> list[str]:
    return ["--tls-ca-file", str(directory / "ca.pem"), "--tls-cert", str(directory / f"{name}.pem"),
            "--tls-key", str(directory / f"{name}-key.pem")]


def _spec_file(tmp_path: Path) -> Path:
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**spec().to_dict(), "name": "lab", "timeslices_ms": [10],
                                    "cpu_shares_pct": [100]}))  # two runs
    return path


def test_a_lab_campaign_over_tls_with_bbrlabs_own_certificates(tmp_path):
    """The help's recipe with role certificates: the scheduler and the worker hold server ones (they listen
    and connect out: the scheduler to the worker too), the driver a client one (clientAuth only)."""
    ca = ["tls", "cert", "--ca", str(tmp_path / "ca")]
    for argv in (["tls", "ca", "--out", str(tmp_path / "ca")],
                 [*ca, "--role", "server", "--name", "sched", "--out", str(tmp_path / "s")],
                 [*ca, "--role", "server", "--name", "hosta", "--out", str(tmp_path / "a")],
                 [*ca, "--role", "client", "--name", "me", "--out", str(tmp_path / "me")]):
        res = _bbrlab(*argv)
        assert res.returncode == 0, res.stderr
    address = f"tls://127.0.0.1:{_free_port()}"
    scheduler = _start_scheduler(address, _tls_args(tmp_path / "s", "sched"))
    worker = None
    try:
        worker = subprocess.Popen([sys.executable, "-m", "tests.rogue_worker", "standin", address,
                                   *(str(tmp_path / "a" / n) for n in ("ca.pem", "hosta.pem", "hosta-key.pem"))],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert worker.stdout.readline().strip() == "joined", worker.stderr.read()[-2000:]
        out, spec_path = tmp_path / "out", _spec_file(tmp_path)
        plain = _bbrlab("campaign", "run", str(spec_path), "--out", str(out), "--no-progress", "--scheduler",
                        address.replace("tls://", "tcp://"))
        assert plain.returncode == 1 and "--insecure" in plain.stderr  # tcp:// refused outright
        other = tmp_path / "other"  # a certificate of another CA: the scheduler must not take it
        assert _bbrlab("tls", "ca", "--out", str(other / "ca")).returncode == 0
        assert _bbrlab("tls", "cert", "--ca", str(other / "ca"), "--role", "client", "--name", "me", "--out",
                       str(other / "me")).returncode == 0
        stranger = _bbrlab("campaign", "run", str(spec_path), "--out", str(out), "--no-progress", "--scheduler",
                           address, *_tls_args(other / "me", "me"))
        assert stranger.returncode == 1 and f"--scheduler = '{address}'" in stranger.stderr, stranger.stderr[-2000:]
        assert not out.exists()
        res = _bbrlab("campaign", "run", str(spec_path), "--out", str(out), "--no-progress", "--scheduler", address,
                      *_tls_args(tmp_path / "me", "me"))
        assert res.returncode == 0, res.stderr[-3000:]
    finally:
        for proc in (worker, scheduler):
            if proc is not None:
                _stop(proc)
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/record.json")]
    assert len(records) == 2
    assert {(r["metadata"]["worker"]["testbed"], r["metadata"]["worker"]["transport"]) for r in records} == \
        {("standin", "tls")}


def test_an_insecure_lab_campaign_is_allowed_only_when_asked_and_the_records_say_so(tmp_path):
    address = f"tcp://127.0.0.1:{_free_port()}"
    scheduler = _start_scheduler(address, [])
    worker = None
    try:
        worker = subprocess.Popen([sys.executable, "-m", "tests.rogue_worker", "standin", address], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert worker.stdout.readline().strip() == "joined", worker.stderr.read()[-2000:]
        out = tmp_path / "out"
        res = _bbrlab("campaign", "run", str(_spec_file(tmp_path)), "--out", str(out), "--no-progress",
                      "--scheduler", address, "--insecure")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "warning" in res.stderr and "insecure" in res.stderr
    finally:
        for proc in (worker, scheduler):
            if proc is not None:
                _stop(proc)
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/record.json")]
    assert len(records) == 2 and all("insecure" in r["metadata"]["worker"]["transport"] for r in records)


def _worker_http_listeners(tmp_path: Path, host: str | None) -> tuple[int, list[tuple[str, int]]]:
    """Start a TLS scheduler and one nanny with ``bbrlab worker``'s listen options (a lab's server-role
    certificate), and return the worker's HTTP port and every listening socket of this process's tree."""
    from distributed import Client, Scheduler

    from bbrlab.campaign import tls as tlsconf
    from bbrlab.campaign.distributed import TestbedNanny
    from bbrlab.campaign.scaleout import nanny_listen_options

    tlsconf.write_ca(tmp_path / "ca")
    sec = tlsconf.security(tlsconf.write_host_cert(tmp_path / "ca", "hosta", tmp_path / "a", role="server"))

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, protocol="tls", security=sec, dashboard=False,
                             dashboard_address="127.0.0.1:0") as sched, \
                TestbedNanny(sched.address, nthreads=1, **nanny_listen_options(sched.address, sec, host)), \
                Client(sched.address, security=sec, asynchronous=True) as client:
            ports = await client.run(lambda dask_worker: dask_worker.http_server.port)
            return next(iter(ports.values())), listeners(_tree(os.getpid()))

    return asyncio.run(main())


def test_a_lab_workers_http_pages_listen_on_loopback_only(tmp_path):
    """``bbrlab worker`` without --host listens for Dask's comms on every address (the scheduler must reach
    it; mutual TLS guards them) but serves its HTTP pages (health, Prometheus metrics) on 127.0.0.1 only."""
    port, seen = _worker_http_listeners(tmp_path, None)
    print(f"worker HTTP port {port}; listeners {sorted(seen)}")
    assert [a for a, p in seen if p == port] == ["127.0.0.1"], seen
