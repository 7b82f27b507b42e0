"""Finding the vCPU threads of a VM, without guessing from ``ps`` rows.

* QEMU: ``query-cpus-fast`` over the QMP socket gives each vCPU's ``thread-id``.
* libvirt: the same QMP command through ``virsh qemu-monitor-command`` on the hypervisor host.
* anything else (VirtualBox, Xen, ...): thread ids given explicitly by the researcher.

Each finder returns the thread ids sorted by vCPU index.
"""

from __future__ import annotations

import json
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
    """Thread ids of a local QEMU's vCPUs, from its QMP unix socket."""
    from qemu.qmp.legacy import QEMUMonitorProtocol

    qmp = QEMUMonitorProtocol(socket_path)
    try:
        qmp.connect(negotiate=True)
        qmp.settimeout(timeout_s)
        reply = qmp.cmd_obj({"execute": "query-cpus-fast"})
        return _threads_from_reply(reply.get("return"), socket_path)
    except OSError as e:
        raise VcpuDiscoveryError(f"cannot reach QMP socket {socket_path}: {e}") from e
    finally:
        qmp.close()


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
