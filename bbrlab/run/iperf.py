"""iperf3: the server on the receiver, the client on the (contended) sender, and the client's JSON.

Data flows from the client to the server, so the client runs on the sender VM, as in the paper.

- The server is started with ``-1`` (one test, then exit) under coreutils ``timeout`` so it can never
  outlive a run, as the unprivileged receiver account (:mod:`bbrlab.run.rxuser`, root only where it cannot
  be had; CAP_NET_ADMIN kept only for a congestion control the kernel does not allow every user), and is
  ready when ``ss -ltn`` on the receiver shows its port listening (polled with a deadline, no fixed sleeps).
- The client binds its data streams to known local ports (``--cport P`` gives ``P, P+1, ...`` for
  ``-P N`` streams in iperf3 3.12), so the ss sampler can select exactly the data connections and
  leave out iperf3's control connection. It also runs under ``timeout --kill-after``: a hung transfer
  is killed on the sender itself, without polling the contended VM during the run.
- :func:`parse_result` extracts what the run record and the analyses need; :class:`IperfError` carries
  iperf3's own error text when a test failed.
- Every iperf3 bbrlab starts carries :data:`MARKER` in its environment (``env BBRLAB_IPERF3=1 ...``), so
  recovery (:func:`kill_port_users`) stops only those: a lab's receiver may run its own iperf3 server on
  the same port, and a campaign must not kill it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields

from bbrlab.core.commands import Result
from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hostloop import RUNNING_SH
from bbrlab.core.hosts import Host
from bbrlab.core.ownedpids import KILL_OURS_SH, Spawned
from bbrlab.scenario.scenario import check_cca

from . import rxuser

DEFAULT_PORT = 5201
#: Seconds a client may run beyond its duration before ``timeout`` kills it (connect + teardown).
CLIENT_MARGIN_S = 15.0


class IperfError(BbrlabError):
    """iperf3 failed (its JSON has an ``error``), or its output is not iperf3 JSON."""


#: In the environment of every iperf3 bbrlab starts: what recovery recognises its own by.
MARKER = "BBRLAB_IPERF3=1"


def _marked(argv: list[str]) -> list[str]:
    return ["env", MARKER, *argv]


def _port(value: object, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValidationError(field_name, value, "a TCP port number from 1 to 65535")
    return value


def server_argv(port: int = DEFAULT_PORT, *, lifetime_s: float = 300.0,
                account: rxuser.RxUser = rxuser.AS_ROOT, caps: tuple[str, ...] = ()) -> list[str]:
    """The receiver's server: one test in JSON, as ``account`` with capabilities ``caps``, killed after
    ``lifetime_s`` whatever happens."""
    _port(port, "port")
    return _marked(["timeout", "--kill-after=5", f"{lifetime_s:.0f}",
                    *account.wrap(["iperf3", "-s", "-1", "-J", "-p", str(port)], caps)])


#: iperf3's server puts the client's congestion control (``-C``) on its own socket too, and fails the test
#: when it cannot. An unprivileged process may set only the kernel's allowed ones; any other needs this.
CCA_CAPS = ("net_admin",)


def server_caps(host: Host, cca: str | None) -> tuple[str, ...]:
    """The capabilities an unprivileged server needs on ``host`` for a test with ``cca``: none when the
    client sets no congestion control (None: a UDP test) or the kernel allows it to every user
    (``net.ipv4.tcp_allowed_congestion_control``), else :data:`CCA_CAPS`."""
    if cca is None:
        return ()
    allowed = host.run(["cat", "/proc/sys/net/ipv4/tcp_allowed_congestion_control"], check=False,
                       timeout=10).stdout.split()
    return () if cca in allowed else CCA_CAPS


def client_argv(server_ip: str, *, cca: str, duration_s: float, streams: int = 1, port: int = DEFAULT_PORT,
                cport: int | None = None, margin_s: float = CLIENT_MARGIN_S) -> list[str]:
    """The sender's client: ``-C CCA``, JSON with the server's side included (``--get-server-output``).

    ``cport`` binds the data streams to ``cport .. cport + streams - 1``.
    """
    check_cca(cca, "flow.cca")
    if not isinstance(server_ip, str) or not server_ip or server_ip.startswith("-") or any(c.isspace() for c in server_ip):
        raise ValidationError("server_ip", server_ip, "an IP address or host name")
    _port(port, "port")
    if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= 128:
        raise ValidationError("flow.streams", streams, "a whole number from 1 to 128")
    argv = ["timeout", "--kill-after=5", f"{duration_s + margin_s:.0f}",
            "iperf3", "-c", server_ip, "-p", str(port), "-t", f"{duration_s:g}", "-P", str(streams),
            "-C", cca, "-J", "--get-server-output"]
    if cport is not None:
        _port(cport, "cport")
        _port(cport + streams - 1, "cport + streams - 1")
        argv += ["--cport", str(cport)]
    return _marked(argv)


def listening(host: Host, port: int) -> bool:
    """Whether a TCP socket listens on ``port`` on ``host`` (``ss -ltnH``)."""
    out = host.output(["ss", "-ltnH", "(", "sport", "=", f":{_port(port, 'port')}", ")"], timeout=10)
    return bool(out.strip())


def wait_listening(host: Host, port: int, *, timeout_s: float = 10.0, poll_s: float = 0.05) -> None:
    """Poll until ``port`` listens on ``host``; raise :class:`IperfError` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not listening(host, port):
        if time.monotonic() > deadline:
            raise IperfError(f"iperf3 server on {host.name} did not listen on port {port} within {timeout_s} s")
        time.sleep(poll_s)


def start_server(host: Host, log_path: str, *, port: int = DEFAULT_PORT, lifetime_s: float = 300.0,
                 ready_timeout_s: float = 10.0, account: rxuser.RxUser = rxuser.AS_ROOT,
                 caps: tuple[str, ...] = ()) -> int:
    """Start the server on ``host`` as ``account`` with capabilities ``caps`` and return its pid (its
    ``timeout``'s, root's) once it listens. Its output goes to ``log_path``, opened by root.

    A server already listening on ``port`` is refused: it would take the test instead of ours.
    """
    return start_server_process(host, log_path, port=port, lifetime_s=lifetime_s,
                                ready_timeout_s=ready_timeout_s, account=account, caps=caps).pid


def start_server_process(host: Host, log_path: str, *, port: int = DEFAULT_PORT, lifetime_s: float = 300.0,
                         ready_timeout_s: float = 10.0, account: rxuser.RxUser = rxuser.AS_ROOT,
                         caps: tuple[str, ...] = ()) -> Spawned:
    """:func:`start_server`, returning the pid with its start ticks (for :func:`stop`)."""
    if listening(host, port):
        raise IperfError(f"port {port} on {host.name} is already in use (a stray iperf3 server?)")
    spawned = host.spawn_process(server_argv(port, lifetime_s=lifetime_s, account=account, caps=caps), log_path)
    try:
        wait_listening(host, port, timeout_s=ready_timeout_s)
    except BaseException:
        stop(host, spawned.pid, start_ticks=spawned.start_ticks)
        raise
    return spawned


@dataclass(frozen=True)
class Server:
    """A running one-test iperf3 server: its host, pid, port, log (in a private directory) and the account
    it runs as."""

    host: Host
    pid: int
    port: int
    log_path: str
    account: rxuser.RxUser = rxuser.AS_ROOT
    caps: tuple[str, ...] = ()  # the capabilities it kept (an unprivileged account's)


@contextmanager
def server(host: Host, *, port: int = DEFAULT_PORT, lifetime_s: float = 300.0, ready_timeout_s: float = 10.0,
           user: str = rxuser.NAME, cca: str | None = None) -> Iterator[Server]:
    """An iperf3 server on ``host`` for the ``with`` block, as the unprivileged ``user``
    (:func:`bbrlab.run.rxuser.receiver_user`; root with a note where it cannot be had) keeping CAP_NET_ADMIN
    only when the test's ``cca`` needs it (:func:`server_caps`; None: the client sets none): listening
    when the block starts, stopped (SIGKILL after 10 s) and its private log directory removed when it
    ends, whatever happened."""
    account = rxuser.receiver_user(host, user) if user != rxuser.ROOT else rxuser.AS_ROOT
    caps = () if account.is_root else server_caps(host, cca)
    with host.private_dir("iperf3") as directory:
        log_path = f"{directory}/server.json"
        spawned = start_server_process(host, log_path, port=port, lifetime_s=lifetime_s,
                                       ready_timeout_s=ready_timeout_s, account=account, caps=caps)
        try:
            yield Server(host, spawned.pid, port, log_path, account, caps)
        finally:
            stop(host, spawned.pid, start_ticks=spawned.start_ticks)


def run_client(host: Host, server_ip: str, *, cca: str, duration_s: float, streams: int = 1,
               port: int = DEFAULT_PORT, cport: int | None = None, ssh_margin_s: float = 30.0) -> Result:
    """Run the client on ``host`` (the sender) to completion; its result, whatever the exit code.

    The client runs under ``timeout`` on the host itself; ``ssh_margin_s`` more is allowed for the
    command as a whole (a slow or contended guest), then :class:`~bbrlab.core.commands.CommandTimeout`.
    """
    argv = client_argv(server_ip, cca=cca, duration_s=duration_s, streams=streams, port=port, cport=cport)
    return host.run(argv, timeout=duration_s + CLIENT_MARGIN_S + ssh_margin_s, check=False)


def alive(host: Host, pid: int) -> bool:
    """Whether ``pid`` runs on ``host`` (a zombie does not count)."""
    script = RUNNING_SH + 'running "$1"'
    return host.run(["sh", "-c", script, "bbrlab-alive", str(int(pid))], check=False, timeout=10).ok


#: $1 pid, $2 its start ticks (may be empty); the rest: files to remove. TERM to the session (spawn uses setsid)
#: and the pid, wait up to ``$WAIT`` twentieths of a second, then KILL; both only while the pid still names the
#: process that started at $2. One command: cheap on any host, and on a slow guest.
_STOP = RUNNING_SH + KILL_OURS_SH + r"""
pid=$1; ticks=$2; shift 2
running "$pid" && same "$pid" "$ticks" && { kill -TERM -- "-$pid" 2>/dev/null; kill -TERM "$pid" 2>/dev/null; }
i=0
while running "$pid" && same "$pid" "$ticks" && [ $i -lt "$WAIT" ]; do sleep 0.05; i=$((i + 1)); done
kill_ours "$pid" "$ticks"
rm -f "$@"
exit 0
"""


def stop(host: Host, pid: int, *, timeout_s: float = 10.0, remove: list[str] | tuple[str, ...] = (),
         start_ticks: int | None = None) -> None:
    """Terminate process ``pid`` and its session (spawn starts it with setsid), wait until it is gone
    (SIGKILL after ``timeout_s``), and remove the files in ``remove``. With ``start_ticks`` (from
    :meth:`~bbrlab.core.hosts.Host.spawn_process`) nothing is signalled once ``pid`` names another process."""
    steps = max(1, int(timeout_s / 0.05))
    ticks = "" if start_ticks is None else str(int(start_ticks))
    host.run(["env", f"WAIT={steps}", "sh", "-c", _STOP, "bbrlab-stop", str(int(pid)), ticks, *remove],
             timeout=timeout_s + 20, check=False)


def port_users(host: Host, port: int, *, listening: bool) -> list[int]:
    """Pids of iperf3 processes with a TCP socket on ``port`` in ``host``'s network namespace.

    ``listening``: servers (listening on ``port`` or serving a test there); otherwise clients connected to it. Found with
    ``ss -p``, so on a shared machine only the processes of that namespace's sockets are seen.
    """
    _port(port, "port")
    if listening:  # servers: listening, or serving a test on the port
        argvs = [["ss", "-ltnpH", "(", "sport", "=", f":{port}", ")"], ["ss", "-tnpH", "(", "sport", "=", f":{port}", ")"]]
    else:
        argvs = [["ss", "-tnpH", "(", "dport", "=", f":{port}", ")"]]
    out = "".join(host.run(argv, check=False, timeout=20).stdout for argv in argvs)
    return sorted({int(m.group(1)) for m in re.finditer(r'"iperf3",pid=(\d+)', out)})


#: Prints each pid given whose environment holds :data:`MARKER` ($1 the marker, the rest pids).
_MARKED_SH = r"""
marker=$1; shift
for pid; do tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF -- "$marker" && echo "$pid"; done
exit 0
"""


def bbrlab_started(host: Host, pids: list[int]) -> list[int]:
    """The pids of ``pids`` that bbrlab started (their environment holds :data:`MARKER`)."""
    if not pids:
        return []
    out = host.run(["sh", "-c", _MARKED_SH, "bbrlab-marked", MARKER, *(str(int(p)) for p in pids)],
                   sudo=True, check=False, timeout=20).stdout
    return sorted({int(line) for line in out.split() if line.isdigit()})


def kill_port_users(host: Host, port: int, *, listening: bool) -> list[int]:
    """Kill (SIGKILL) the iperf3 processes :func:`port_users` finds that bbrlab started (:data:`MARKER`);
    anyone else's iperf3 on the port is left alone. Returns the pids killed."""
    pids = bbrlab_started(host, port_users(host, port, listening=listening))
    for pid in pids:
        host.run(["kill", "-KILL", str(pid)], check=False, timeout=10)
    return pids


@dataclass(frozen=True)
class Interval:
    """One iperf3 reporting interval, summed over the streams."""

    t_start_s: float
    t_end_s: float
    throughput_mbit: float
    retransmits: int | None


@dataclass(frozen=True)
class IperfSummary:
    """iperf3's view of one client's test, without its intervals: ``metadata.iperf`` of a run record, field for
    field. Rates in Mbit/s, CPU in percent. The values iperf3 printed itself (retransmits, CPU, the start's
    Unix time) keep their JSON number type: iperf3 prints a whole number without a fraction."""

    receiver_mbit: float
    sender_mbit: float
    retransmits: int | None
    sender_tcp_congestion: str | None
    receiver_tcp_congestion: str | None
    data_ports: list[int]
    streams: int
    duration_s: float
    cpu_sender_pct: int | float | None
    cpu_receiver_pct: int | float | None
    start_unix_s: int | float | None
    version: str | None


@dataclass(frozen=True)
class IperfResult:
    """What the analyses need from one client JSON. Rates in Mbit/s, CPU in percent; without ``intervals``,
    its :meth:`summary`."""

    receiver_mbit: float
    sender_mbit: float
    retransmits: int | None
    sender_tcp_congestion: str | None
    receiver_tcp_congestion: str | None
    data_ports: tuple[int, ...]
    streams: int
    duration_s: float
    cpu_sender_pct: float | None
    cpu_receiver_pct: float | None
    start_unix_s: float | None
    version: str | None
    intervals: tuple[Interval, ...] = field(default=())

    def to_dict(self) -> dict:
        """Every field by name, JSON-ready (``data_ports`` and ``intervals`` as lists)."""
        d = asdict(self)
        d["data_ports"] = list(self.data_ports)
        d["intervals"] = [asdict(i) for i in self.intervals]
        return d

    def summary(self) -> IperfSummary:
        """The result without its intervals: a run record's ``metadata.iperf``."""
        values = {f.name: getattr(self, f.name) for f in fields(IperfSummary)}
        return IperfSummary(**(values | {"data_ports": list(self.data_ports)}))


def parse_json(text: str) -> dict:
    """iperf3's JSON as a dict; :class:`IperfError` with iperf3's message when the test failed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise IperfError(f"iperf3 output is not JSON ({e}): {text[:300]!r}") from None
    if not isinstance(data, dict):
        raise IperfError(f"iperf3 output is not a JSON object: {text[:300]!r}")
    if data.get("error"):
        raise IperfError(f"iperf3: {data['error']}")
    return data


def parse_result(text: str) -> IperfResult:
    """Parse a client's ``--json`` output (sender side, with the server's output when asked)."""
    data = parse_json(text)
    try:
        start, end = data["start"], data["end"]
        sent, received = end["sum_sent"], end["sum_received"]
    except KeyError as e:
        raise IperfError(f"iperf3 JSON lacks {e}: not a finished client test") from None
    ports = tuple(sorted(int(c["local_port"]) for c in start.get("connected", [])))
    cpu = end.get("cpu_utilization_percent") or {}
    intervals = tuple(
        Interval(
            t_start_s=float(iv["sum"]["start"]),
            t_end_s=float(iv["sum"]["end"]),
            throughput_mbit=float(iv["sum"]["bits_per_second"]) / 1e6,
            retransmits=iv["sum"].get("retransmits"),
        )
        for iv in data.get("intervals", [])
        if "sum" in iv
    )
    test_start = start.get("test_start", {})
    timestamp = start.get("timestamp", {})
    return IperfResult(
        receiver_mbit=float(received["bits_per_second"]) / 1e6,
        sender_mbit=float(sent["bits_per_second"]) / 1e6,
        retransmits=sent.get("retransmits"),
        sender_tcp_congestion=end.get("sender_tcp_congestion"),
        receiver_tcp_congestion=end.get("receiver_tcp_congestion"),
        data_ports=ports,
        streams=int(test_start.get("num_streams", len(ports))),
        duration_s=float(test_start.get("duration", 0)),
        cpu_sender_pct=cpu.get("host_total"),
        cpu_receiver_pct=cpu.get("remote_total"),
        start_unix_s=timestamp.get("timesecs"),
        version=start.get("version"),
        intervals=intervals,
    )


def version(host: Host) -> str:
    """``iperf3 --version``'s first words, e.g. ``iperf 3.12``."""
    out = host.run(["iperf3", "--version"], check=False, timeout=10).stdout
    return out.splitlines()[0].split(" (")[0].strip() if out else "unknown"
