"""rsync over SSH as a workload: one file copied from the sender to the receiver through the emulated link.

The question of a field test (papers/linode-bbr-loss-test.txt): how long does ``rsync -e ssh`` of an
incompressible file take, and does it finish at all, when the path loses 1, 10 or 30 % of its packets?

- **The file** (:func:`ensure_file`): ``file_mb`` x 10^6 bytes from ``/dev/urandom`` (incompressible), made
  once per sender and size in ``/var/cache/bbrlab/transfer/`` with its sha256 beside it; later runs reuse
  it while its size and modification time are unchanged.
- **The receiver** (:func:`session`): a per-run sshd on the receiver's experiment address
  (:mod:`bbrlab.run.sshd`) whose only authorized key may run ``rrsync -wo -munge`` into a fresh directory,
  as an unprivileged account and behind a guard that refuses permissions, owners, groups and devices (what
  lands is that account's plain files; symbolic links are munged), and a poller of the copy's size there
  (:mod:`bbrlab.run.progress`). At the end the copy's size and sha256 are read, as that account.
- **The client** (:func:`client_argv`): ``rsync --inplace --partial`` with ``ssh -F`` a per-run config on
  the sender: the receiver's host key pinned, the run's client key, and a ``ProxyCommand`` helper
  (``ProxyUseFdpass``) that makes the TCP connection itself: it sets the run's congestion control on the
  socket (``TCP_CONGESTION``, as ``iperf3 -C`` does), binds the run's local port (so the socket sampler
  finds exactly this connection, as iperf3's ``--cport``), reads the congestion control back from the
  connected socket, and hands the socket to ssh. So the CCA applies to that connection only; the
  management SSH and everything else keep theirs. The copy runs under ``timeout``: one still running after
  ``transfer_timeout_s`` is ended and recorded as timed out with the bytes that arrived, not as a failure.
- **The record** (:meth:`Rsync.result`): ``metadata.transfer`` (bytes delivered, completion time, goodput,
  timed out, both checksums, the SSH cipher negotiated), ``metadata.cca.socket``, and the files
  ``transfer.json`` (summary and progress series) and ``rsync.log`` (rsync's output).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.core import leftdirs, recordjson
from bbrlab.core.commands import Result
from bbrlab.core.errors import RunFailed, TestbedError
from bbrlab.core.hosts import Host
from bbrlab.scenario.scenario import Flow
from bbrlab.scenario.workloads import RsyncParams

from . import checks, progress, rxuser, sshd
from . import record as rec
from .recoveryrecord import RunDirsRemoved, TransferLeftovers
from .runmeta import RunMetadata
from .transferrecord import TransferSummary

CACHE_DIR = "/var/cache/bbrlab/transfer"
#: The copy's name in the receiver's destination directory.
DEST_NAME = "transfer.bin"
#: The name the client's ssh config gives the receiver (and under which its host key is pinned).
HOST_ALIAS = "bbrlab-receiver"
RRSYNC = "/usr/bin/rrsync"
#: What the client's key runs on the receiver (behind :data:`bbrlab.run.sshd.RECEIVE_GUARD`): rsync's
#: receiving end confined to ``{dest}``, write only, symbolic links munged (made harmless).
RECEIVE_COMMAND = (RRSYNC, "-wo", "-munge", "{dest}")
PROGRESS_INTERVAL_MS = 250
#: /proc/uptime's resolution (it prints hundredths of a second), and the most a wall clock's rate may be slewed
#: (NTP's 500 ppm): the allowances of :meth:`ClientResult.clock_step_s`.
UPTIME_RESOLUTION_S = 0.01
MAX_SLEW = 500e-6
#: ``timeout --kill-after``: seconds between SIGTERM and SIGKILL for a copy that outlived its timeout.
KILL_AFTER_S = 5
#: Seconds the client's command may take beyond its timeout (a slow or contended guest) before the SSH
#: command as a whole is given up.
SSH_MARGIN_S = 30.0
#: Seconds the client may need beyond ``transfer_timeout_s`` (kill, the wrapper's report).
CLIENT_MARGIN_S = KILL_AFTER_S + 10.0
#: Exit codes of coreutils ``timeout`` when the limit ended the command (SIGTERM; SIGKILL after kill-after).
TIMED_OUT_EXITS = (124, 137)

#: $1 size in bytes, $2 cache directory. Reuses the cached file when its size and mtime match the stamp
#: beside it; else makes it from /dev/urandom (checking the free space first). Prints key=value lines.
_ENSURE_FILE = r"""
set -eu
n=$1; dir=$2; f=$dir/random-$n.bin
mkdir -p "$dir"
echo "rsync=$(rsync --version 2>/dev/null | head -n 1)"
echo "ssh=$(ssh -V 2>&1)"
stamp() { stat -c '%s:%Y' -- "$f"; }
if [ -f "$f" ] && [ -f "$f.sha256" ] && [ "$(cut -d' ' -f2 "$f.sha256")" = "$(stamp)" ]; then
    echo "made=0"
else
    rm -f "$f" "$f.sha256"
    avail=$(df -B1 --output=avail "$dir" | tail -n 1)
    if [ "$avail" -lt $((n + 64 * 1024 * 1024)) ]; then echo "error=only $avail bytes free in $dir"; exit 0; fi
    t0=$EPOCHREALTIME
    head -c "$n" /dev/urandom > "$f.tmp"
    sum=$(sha256sum < "$f.tmp" | cut -d' ' -f1)
    mv "$f.tmp" "$f"
    echo "$sum $(stamp)" > "$f.sha256.tmp" && mv "$f.sha256.tmp" "$f.sha256"
    t1=$EPOCHREALTIME
    echo "made=1"; echo "made_s=$(( ${t1/[.,]/} - ${t0/[.,]/} ))e-6"
fi
echo "path=$f"; echo "bytes=$(stat -c %s -- "$f")"; echo "sha256=$(cut -d' ' -f1 "$f.sha256")"
"""

#: The ssh ProxyCommand helper (run with the sender's python3): makes the data connection itself and
#: hands it to ssh (ProxyUseFdpass). argv: host port report-file; env: BBRLAB_CCA, BBRLAB_SPORT, BBRLAB_SADDR.
CONNECT_PY = r"""
import os, socket, sys

host, port, report = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cca, sport = os.environ["BBRLAB_CCA"], int(os.environ["BBRLAB_SPORT"])
saddr = os.environ.get("BBRLAB_SADDR") or "0.0.0.0"


def cca_of(s):
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0", 1)[0].decode()


s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cca.encode())
s.bind((saddr, sport))
with open(report, "w") as f:
    f.write(f"socket_cca_set={cca_of(s)}\nsocket_local_port={s.getsockname()[1]}\n")
    f.flush()
    s.connect((host, port))
    f.write(f"socket_cca_connected={cca_of(s)}\nsocket_peer={s.getpeername()[0]}:{s.getpeername()[1]}\n")
socket.send_fds(socket.socket(fileno=1), [b"\0"], [s.fileno()])
"""

#: The client, on the sender: $1 its private directory, $2 timeout in s, $3 the file. rsync's output goes
#: to a file; afterwards key=value lines: exit, start and end times, the socket report, ssh's kex lines.
#: Each wall-clock time is read between two readings of /proc/uptime (a clock no one steps; 10 ms steps):
#: :meth:`ClientResult.clock_step_s` compares the two, so a copy timed across a step of the guest's clock
#: is caught. The reads are builtins: no process is started in the contended guest.
_CLIENT = r"""
set -u
dir=$1; limit=$2; src=$3
read -r u0a _ < /proc/uptime; t0=$EPOCHREALTIME; read -r u0b _ < /proc/uptime
timeout --kill-after=KILL_AFTER "$limit" rsync --inplace --partial --whole-file --no-compress --stats \
    -e "ssh -F $dir/ssh_config -E $dir/ssh.log" -- "$src" "HOST_ALIAS:DEST_NAME" > "$dir/rsync.out" 2>&1
rc=$?
read -r u1a _ < /proc/uptime; t1=$EPOCHREALTIME; read -r u1b _ < /proc/uptime
echo "exit=$rc"; echo "t0=${t0/,/.}"; echo "t1=${t1/,/.}"; echo "uptime=$u0a $u0b $u1a $u1b"
cat "$dir/socket.txt" 2>/dev/null
grep -E 'kex: (algorithm|host key algorithm|client->server cipher)' "$dir/ssh.log" 2>/dev/null | sed 's/^/ssh: /'
echo "--- rsync"
cat "$dir/rsync.out"
""".replace("KILL_AFTER", str(KILL_AFTER_S)).replace("HOST_ALIAS", HOST_ALIAS).replace("DEST_NAME", DEST_NAME)


@dataclass(frozen=True)
class TestFile:
    """The sender's incompressible file: where it is, its size and sha256, and whether this run made it."""

    __test__ = False  # not a pytest class

    path: str
    size_bytes: int
    sha256: str
    made: bool
    made_s: float | None
    versions: dict


def _key_values(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z_0-9]+", key):
            out[key] = value.strip()
    return out


def ensure_file(host: Host, size_bytes: int) -> TestFile:
    """The cached file of ``size_bytes`` on ``host`` (the sender), made first when missing or changed."""
    kv = _key_values(host.output(["bash", "-c", _ENSURE_FILE, "bbrlab-file", str(int(size_bytes)), CACHE_DIR],
                                 timeout=1200))
    if "error" in kv:
        raise TestbedError(f"cannot make the {size_bytes}-byte file on {host.name}: {kv['error']}")
    if int(kv.get("bytes", -1)) != size_bytes or not re.fullmatch(r"[0-9a-f]{64}", kv.get("sha256", "")):
        raise TestbedError(f"the file on {host.name} is not what was asked for: {kv}")
    return TestFile(kv["path"], size_bytes, kv["sha256"], kv.get("made") == "1",
                    float(kv["made_s"]) if "made_s" in kv else None,
                    {"rsync": kv.get("rsync"), "ssh": kv.get("ssh")})


# -- the sender's client ---------------------------------------------------------------------------

def client_config(server: sshd.SshServer, directory: str) -> str:
    """The client's ssh_config (``ssh -F``): nothing of the user's own configuration applies."""
    return "\n".join([
        f"Host {HOST_ALIAS}",
        f"  HostName {server.address}", f"  Port {server.port}", f"  User {server.user}",
        f"  HostKeyAlias {HOST_ALIAS}", f"  UserKnownHostsFile {directory}/known_hosts",
        "  GlobalKnownHostsFile /dev/null", "  StrictHostKeyChecking yes", "  HostKeyAlgorithms ssh-ed25519",
        "  CheckHostIP no", "  UpdateHostKeys no",
        f"  IdentityFile {directory}/id_ed25519", "  IdentitiesOnly yes", "  IdentityAgent none",
        "  BatchMode yes", "  PasswordAuthentication no", "  KbdInteractiveAuthentication no",
        "  Compression no", "  ForwardAgent no", "  ForwardX11 no", "  ClearAllForwardings yes",
        "  ServerAliveInterval 0", "  LogLevel DEBUG1",
        f"  ProxyCommand /usr/bin/python3 {directory}/connect.py %h %p {directory}/socket.txt",
        "  ProxyUseFdpass yes", "",
    ])


@contextmanager
def client_files(host: Host, server: sshd.SshServer) -> Iterator[str]:
    """A private directory on the sender with the client's key, the pinned host key, the ssh config and the
    connect helper (each mode 0600, copied with the host's ``put``: over SFTP for an SSH host, so the key
    is never on a command line), for the ``with`` block; its path."""
    with host.private_dir("rsync") as directory:  # stamped with its owner: a killed run's files are swept
        files = {"id_ed25519": server.client_key, "known_hosts": server.known_hosts_line(HOST_ALIAS),
                 "ssh_config": client_config(server, directory), "connect.py": CONNECT_PY}
        _put_private(host, files, directory)
        yield directory


def _put_private(host: Host, files: dict[str, str], directory: str) -> None:
    """Copy each ``{name: text}`` to ``directory`` on ``host`` (mode 0600). The local copies exist only for the
    copying: a run killed later (SIGKILL) leaves no private key in this machine's temporary directory."""
    with tempfile.TemporaryDirectory(prefix="bbrlab-rsync-") as local:
        for name, text in files.items():
            path = Path(local) / name
            path.touch(mode=0o600)
            path.write_text(text)
            host.put(path, f"{directory}/{name}")  # fabric keeps the mode (0600)


def client_argv(directory: str, source: str, *, cca: str, local_port: int, local_ip: str | None,
                timeout_s: float) -> list[str]:
    """The sender's command: the copy of ``source`` under ``timeout``, its CCA and local port for the helper."""
    return ["env", f"BBRLAB_CCA={cca}", f"BBRLAB_SPORT={int(local_port)}", f"BBRLAB_SADDR={local_ip or ''}",
            "bash", "-c", _CLIENT, "bbrlab-rsync", directory, f"{timeout_s:g}", source]


@dataclass(frozen=True)
class ClientResult:
    """What the client reported: rsync's exit code and output, its wall time on the sender, the socket
    (CCA set and read back after connecting, local port) and the SSH algorithms negotiated."""

    exit_code: int | None
    started_unix_s: float | None
    ended_unix_s: float | None
    socket: dict
    ssh: dict
    rsync_output: str
    uptimes_s: tuple[float, float, float, float] | None = None  # /proc/uptime around t0 and around t1

    @property
    def elapsed_s(self) -> float | None:
        """The copy's wall time on the sender in seconds (to the microsecond); None when the client did not
        report both ends."""
        if self.started_unix_s is None or self.ended_unix_s is None:
            return None
        return round(self.ended_unix_s - self.started_unix_s, 6)

    def clock_step_s(self) -> float | None:
        """How far the wall-clock time of the copy lies outside what /proc/uptime allows (0.0 when within; None
        when either was not reported). Uptime moves in 10 ms steps and may differ in rate from the wall clock
        by the most NTP slews (500 ppm); both are allowed for."""
        elapsed, up = self.elapsed_s, self.uptimes_s
        if elapsed is None or up is None:
            return None
        slack_s = UPTIME_RESOLUTION_S + MAX_SLEW * max(elapsed, 0.0)
        low, high = up[2] - up[1] - UPTIME_RESOLUTION_S - slack_s, up[3] - up[0] + UPTIME_RESOLUTION_S + slack_s
        return round(max(low - elapsed, elapsed - high, 0.0), 6)

    @property
    def timed_out(self) -> bool:
        """Whether ``timeout`` ended the copy (exit code 124 after SIGTERM, 137 after SIGKILL)."""
        return self.exit_code in TIMED_OUT_EXITS


_KEX = {"algorithm": "kex", "host key algorithm": "host_key",
        "client->server cipher": "cipher"}


def parse_client_output(text: str) -> ClientResult:
    """Parse what :func:`client_argv`'s command printed."""
    head, _, rsync_out = text.partition("--- rsync\n")
    kv = _key_values(head)
    ssh: dict = {}
    for line in head.splitlines():
        m = re.search(r"kex: (algorithm|host key algorithm|client->server cipher): (\S+)(.*)$", line)
        if not m:
            continue
        ssh[_KEX[m.group(1)]] = m.group(2)
        if m.group(1) == "client->server cipher":
            rest = dict(re.findall(r"(MAC|compression): (\S+)", m.group(3)))
            ssh["mac"], ssh["compression"] = rest.get("MAC"), rest.get("compression")
    sock = {"cca_set": kv.get("socket_cca_set"), "cca_connected": kv.get("socket_cca_connected"),
            "local_port": int(kv["socket_local_port"]) if kv.get("socket_local_port", "").isdigit() else None,
            "peer": kv.get("socket_peer")}

    def number(key: str) -> float | None:
        try:
            return float(kv[key])
        except (KeyError, ValueError):
            return None

    code = kv.get("exit")
    try:
        uptimes = tuple(float(v) for v in kv["uptime"].split())
    except (KeyError, ValueError):
        uptimes = ()
    return ClientResult(int(code) if code and code.lstrip("-").isdigit() else None, number("t0"), number("t1"),
                        sock, ssh, rsync_out, uptimes if len(uptimes) == 4 else None)


# -- the receiver's side ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Received:
    """The copy on the receiver after the transfer: its size and, when complete, its sha256."""

    bytes: int
    sha256: str | None


#: $1 the copy, $2 the expected size: prints bytes=N and, when complete, sha256=...
_MEASURE = r"""
n=0; [ -e "$1" ] && n=$(stat -c %s -- "$1")
echo "bytes=$n"
if [ "$n" = "$2" ]; then echo "sha256=$(sha256sum < "$1" | cut -d' ' -f1)"; fi
"""


def measure(host: Host, path: str, expected_bytes: int, account: rxuser.RxUser = rxuser.AS_ROOT) -> Received:
    """The copy at ``path`` on ``host``: its size in bytes (0 when absent) and its sha256 when the size is
    ``expected_bytes``. Read as ``account`` (the receiver's, whose files they are: root never opens what
    the client wrote)."""
    argv = account.wrap(["sh", "-c", _MEASURE, "bbrlab-measure", path, str(int(expected_bytes))])
    kv = _key_values(host.output(argv, timeout=300))
    return Received(int(kv.get("bytes", 0)), kv.get("sha256"))


@dataclass
class Session:
    """Both ends of one run's copy: the receiver's sshd and poller, the sender's client directory, the file;
    ``received`` (the copy measured on the receiver) is set when the ``with`` block ends normally."""

    server: sshd.SshServer
    client_dir: str
    file: TestFile
    poller: progress.Poller
    received: Received | None = field(default=None)

    @property
    def port(self) -> int:
        """The port the data connection goes to (the sampler's filter)."""
        return self.server.port

    @property
    def account(self) -> rxuser.RxUser:
        """Who the receiving end (rrsync behind the run's sshd) runs as."""
        return self.server.account

    @property
    def caps(self) -> tuple[str, ...]:
        """The capabilities the receiving end kept: none."""
        return ()

    @property
    def dest_path(self) -> str:
        """The copy's path on the receiver, in the sshd's destination directory."""
        return f"{self.server.dest_dir}/{DEST_NAME}"


@contextmanager
def session(testbed, file: TestFile, *, lifetime_s: float, ready_timeout_s: float, login_grace_s: float,
            port: int = sshd.DEFAULT_PORT) -> Iterator[Session]:
    """The receiver's sshd and progress poller and the sender's client files, for the ``with`` block."""
    rx, tx = testbed.receiver.host, testbed.sender.host
    with ExitStack() as stack:
        server = stack.enter_context(sshd.server(
            rx, testbed.receiver.experiment_ip, RECEIVE_COMMAND, port=port, lifetime_s=lifetime_s,
            ready_timeout_s=ready_timeout_s, login_grace_s=login_grace_s))
        client_dir = stack.enter_context(client_files(tx, server))
        dest = f"{server.dest_dir}/{DEST_NAME}"
        poller = stack.enter_context(progress.poller(rx, dest, PROGRESS_INTERVAL_MS, lifetime_s))
        handle = Session(server, client_dir, file, poller)
        yield handle
        handle.received = measure(rx, dest, file.size_bytes, server.account)


# -- the workload ----------------------------------------------------------------------------------

class Rsync:
    """rsync over SSH of ``flow.params.file_mb`` (see the module docstring): the workload ``rsync``."""

    name = RsyncParams.name

    def client_limit_s(self, flow: Flow) -> float:
        """How long the client may take, in seconds: the flow's ``transfer_timeout_s`` plus the time to kill
        the copy and report."""
        return flow.params.transfer_timeout_s + CLIENT_MARGIN_S

    def prepare(self, testbed, flow: Flow) -> TestFile:
        """The sender's cached file of ``flow.params.file_bytes`` random bytes, made first when missing or changed
        (:func:`ensure_file`)."""
        return ensure_file(testbed.sender.host, flow.params.file_bytes)

    def start(self, testbed, flow: Flow, prepared: TestFile, *, lifetime_s: float, ready_timeout_s: float):
        """The :func:`session` for copying ``prepared``: the receiver's sshd and poller and the sender's
        client files, for the ``with`` block. A connection has the client's whole time limit to log in
        (a handshake across a lossy link is slow; the client can never use more)."""
        return session(testbed, prepared, lifetime_s=lifetime_s, ready_timeout_s=ready_timeout_s,
                       login_grace_s=self.client_limit_s(flow))

    def wait(self, testbed, flow: Flow, endpoint: Session, ports: list[int]) -> Result:
        """The copy on the sender from local port ``ports[0]`` with the flow's CCA, under its timeout, until it
        ends; the command's result whatever its exit code."""
        timeout_s = flow.params.transfer_timeout_s
        argv = client_argv(endpoint.client_dir, endpoint.file.path, cca=flow.cca, local_port=ports[0],
                           local_ip=testbed.sender.experiment_ip, timeout_s=timeout_s)
        return testbed.sender.host.run(argv, timeout=timeout_s + CLIENT_MARGIN_S + SSH_MARGIN_S, check=False)

    def result(self, flow: Flow, endpoint: Session, raw: Result, out: Path, meta: RunMetadata) -> ClientResult:
        """Write ``rsync.log`` and ``transfer.json`` into ``out``, fill ``meta.transfer`` and
        ``meta.cca.socket``; what the client reported."""
        parsed = parse_client_output(raw.stdout)
        rec.write_file(out / "rsync.log", parsed.rsync_output)
        samples = progress.parse(endpoint.poller.text or "")
        summary = summarise(flow, endpoint, parsed, samples)
        rec.write_file(out / "transfer.json", json.dumps(
            {**summary, "progress_t0_unix_s": samples[0][0] if samples else None,
             "progress": progress.series(samples)}, indent=1) + "\n")
        meta.transfer = recordjson.from_json(TransferSummary, summary)
        meta.cca.socket = parsed.socket["cca_connected"] or parsed.socket["cca_set"]
        return parsed

    def check(self, flow: Flow, endpoint: Session, raw: Result, parsed: ClientResult, ports: list[int]) -> list[int]:
        """:func:`check` the copy (raising :class:`~bbrlab.core.errors.RunFailed`) and its connection's local
        port; returns ``ports[:1]``, the SSH connection's local port."""
        check(flow, parsed, endpoint, raw)
        checks.data_ports([parsed.socket["local_port"]], ports[:1], "the SSH connection")
        return ports[:1]

    def check_link(self, scenario, parsed: ClientResult, delta) -> None:
        """Nothing: a copy's time is its result, however the link carried it."""

    def measured_mbit(self, run_dir: Path, record: dict) -> float | None:
        """The copy's goodput in the run's record (``metadata.transfer``), in Mbit/s."""
        return (record.get("metadata", {}).get("transfer") or {}).get("goodput_mbit")


def summarise(flow: Flow, endpoint: Session, parsed: ClientResult, samples: list[tuple[float, int]]) -> dict:
    """``metadata.transfer`` (docs/run-record.md)."""
    received = endpoint.received or Received(0, None)
    elapsed = parsed.elapsed_s
    completed = parsed.exit_code == 0
    return {
        "file_bytes": endpoint.file.size_bytes, "file_sha256": endpoint.file.sha256,
        "file_made": endpoint.file.made, "bytes_delivered": received.bytes,
        "completed": completed, "timed_out": parsed.timed_out, "timeout_s": flow.params.transfer_timeout_s,
        "elapsed_s": elapsed, "completion_s": elapsed if completed else None,
        "goodput_mbit": received.bytes * 8 / elapsed / 1e6 if elapsed else None,
        "receiver_sha256": received.sha256,
        "checksum_match": (received.sha256 == endpoint.file.sha256) if completed else None,
        "first_byte_s": progress.first_byte_s(samples),
        "progress_interval_ms": PROGRESS_INTERVAL_MS, "progress_samples": len(samples),
        "rsync_exit": parsed.exit_code, "ssh": parsed.ssh, "socket": parsed.socket,
        "server_port": endpoint.port, "versions": endpoint.file.versions,
    }


def check(flow: Flow, parsed: ClientResult, endpoint: Session, result: Result) -> None:
    """What must hold for an rsync run to be ``ok``: the copy completed with equal checksums on both ends,
    or it ran into its timeout (a result); the connection carried the asked congestion control."""
    if parsed.exit_code is None or parsed.elapsed_s is None:
        raise RunFailed(f"the rsync client reported nothing usable (exit {result.exit_code}): "
                        f"{(result.stderr or result.stdout).strip()[-300:]}")
    if parsed.elapsed_s < 0 or parsed.clock_step_s():
        raise RunFailed(f"the sender's clock was stepped during the copy: its wall clock says {parsed.elapsed_s} s, "
                        f"{parsed.clock_step_s() or 'an unknown amount'} s outside what /proc/uptime allows "
                        f"({parsed.uptimes_s}); the copy's time is unknown")
    if parsed.exit_code != 0 and not parsed.timed_out:
        raise RunFailed(f"rsync exited with {parsed.exit_code}: {parsed.rsync_output.strip()[-400:]}")
    seen = parsed.socket["cca_connected"] or parsed.socket["cca_set"]
    if seen != flow.cca:
        raise RunFailed(f"the SSH connection's socket reports congestion control {seen!r}, asked for {flow.cca!r}")
    received = endpoint.received
    if received is None:
        raise RunFailed("the copy on the receiver was not measured")
    if received.bytes > endpoint.file.size_bytes:
        raise RunFailed(f"the receiver holds {received.bytes} bytes of a {endpoint.file.size_bytes}-byte file")
    if parsed.exit_code == 0:
        if received.bytes != endpoint.file.size_bytes or received.sha256 != endpoint.file.sha256:
            raise RunFailed(f"rsync reported success but the receiver's copy differs: {received.bytes} bytes, "
                            f"sha256 {received.sha256}, sent {endpoint.file.size_bytes} bytes, "
                            f"sha256 {endpoint.file.sha256}")
        if parsed.socket["cca_connected"] is None:
            raise RunFailed("the connect helper did not read the congestion control back from the connected socket")


def recover(testbed) -> TransferLeftovers:
    """What a killed run left: the receiver's sshd (and its connections' processes) on the run's port, the
    sender's ssh clients connected to it, and the private directories whose owner is gone
    (:func:`bbrlab.core.leftdirs.sweep`): the receiver's (keys, the data received) and the sender's client
    files (the run's private key). The progress poller and the sender's client end by themselves (both run
    under a deadline)."""
    rx, tx = testbed.receiver.host, testbed.sender.host
    return TransferLeftovers(sshd_killed=sshd.kill_strays(rx), ssh_clients_killed=_kill_clients(tx, sshd.DEFAULT_PORT),
                             run_dirs_removed=RunDirsRemoved(receiver=leftdirs.sweep(rx, "sshd"),
                                                             sender=leftdirs.sweep(tx, "rsync")))


def _kill_clients(host: Host, port: int) -> list[int]:
    out = host.run(["ss", "-tnpH", "(", "dport", "=", f":{port}", ")"], check=False, timeout=20).stdout
    pids = sorted({int(m.group(1)) for m in re.finditer(r'"(?:ssh|rsync)",pid=(\d+)', out)})
    for pid in pids:
        host.run(["kill", "-KILL", str(pid)], check=False, timeout=10)
    return pids

