"""Finding the vCPU threads of a VM, without guessing from ``ps`` rows.

* QEMU: ``query-cpus-fast`` over the QMP socket gives each vCPU's ``thread-id``.
* libvirt: the same QMP command through ``virsh qemu-monitor-command`` on the hypervisor host.
* anything else (VirtualBox, Xen, ...): thread ids given explicitly by the researcher.

Each finder returns the thread ids sorted by vCPU index.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from .errors import BbrlabError, ValidationError
from .hosts import Host


class VcpuDiscoveryError(BbrlabError):
    pass


def _threads_from_reply(reply: object, where: str) -> list[int]:
    if not isinstance(reply, list) or not reply:
        raise VcpuDiscoveryError(f"query-cpus-fast on {where} returned no vCPUs: {reply!r}")
    cpus = sorted(reply, key=lambda c: c.get("cpu-index", 0))
    return [int(c["thread-id"]) for c in cpus]


def qmp_vcpu_threads(socket_path: str, timeout_s: float = 10.0) -> list[int]:
    """Thread ids of a local QEMU's vCPUs, from its QMP unix socket, within ``timeout_s`` in all.

    QEMU serves one QMP client at a time: while another client holds the socket, the connection is
    accepted but no greeting comes, so every step (connect, greeting, negotiation, the query) counts
    against one deadline, and running out of it says why."""
    import socket

    deadline = time.monotonic() + timeout_s
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(socket_path)
            channel = _QmpChannel(sock, deadline)
            channel.expect("QMP")  # the greeting
            channel.execute("qmp_capabilities")
            return _threads_from_reply(channel.execute("query-cpus-fast"), socket_path)
    except TimeoutError:
        raise VcpuDiscoveryError(f"QMP socket {socket_path}: no answer within {timeout_s:g} s (QEMU serves one "
                                 "QMP client at a time: is another one connected?)") from None
    except OSError as e:
        raise VcpuDiscoveryError(f"cannot reach QMP socket {socket_path}: {e}") from e


class _QmpChannel:
    """JSON lines over a connected QMP socket, every read bounded by one deadline."""

    def __init__(self, sock, deadline: float):
        self.sock, self.deadline, self.buffer = sock, deadline, b""

    def _message(self) -> dict:
        while b"\n" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise VcpuDiscoveryError("QMP: QEMU closed the connection")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            raise VcpuDiscoveryError(f"QMP: not JSON: {line[:200]!r}") from None
        return message if isinstance(message, dict) else {}

    def expect(self, key: str) -> dict:
        while True:
            message = self._message()
            if key in message:
                return message

    def execute(self, command: str) -> object:
        self.sock.sendall(json.dumps({"execute": command}).encode() + b"\n")
        while True:
            message = self._message()  # events ({"event": ...}) may come first
            if "error" in message:
                raise VcpuDiscoveryError(f"QMP {command}: {message['error']}")
            if "return" in message:
                return message["return"]


def qmp_vcpu_threads_remote(host: Host, socket_path: str) -> list[int]:
    """Thread ids from a QMP socket on another host (through ``socat`` there)."""
    script = '{"execute":"qmp_capabilities"}\n{"execute":"query-cpus-fast"}\n'
    res = host.run(["socat", "-t", "2", "-", f"UNIX-CONNECT:{socket_path}"], stdin=script, sudo=True)
    for line in res.stdout.splitlines():
        msg = json.loads(line)
        if isinstance(msg.get("return"), list):
            return _threads_from_reply(msg["return"], f"{host.name}:{socket_path}")
    raise VcpuDiscoveryError(f"no query-cpus-fast answer from {host.name}:{socket_path}: {res.stdout[-300:]}")


def libvirt_vcpu_threads(host: Host, domain: str) -> list[int]:
    """Thread ids of a libvirt domain's vCPUs on its hypervisor host."""
    res = host.run(["virsh", "qemu-monitor-command", domain, '{"execute":"query-cpus-fast"}'], sudo=True)
    return _threads_from_reply(json.loads(res.stdout).get("return"), f"{host.name}:libvirt:{domain}")


def explicit_vcpu_threads(thread_ids: Sequence[object], field: str = "sender.vcpu_threads") -> list[int]:
    """Thread ids given by hand, for hypervisors bbrlab cannot ask (VirtualBox, Xen, ...)."""
    out = []
    for i, t in enumerate(thread_ids):
        if isinstance(t, bool) or not isinstance(t, int) or t <= 0:
            raise ValidationError(f"{field}[{i}]", t, "a positive thread id (see /proc/<pid>/task)")
        out.append(t)
    if not out:
        raise ValidationError(field, list(thread_ids), "at least one thread id")
    return out
