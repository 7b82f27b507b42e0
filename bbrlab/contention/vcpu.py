"""Finding the vCPU threads of a VM, without guessing from ``ps`` rows.

* QEMU: ``query-cpus-fast`` over the QMP socket gives each vCPU's ``thread-id``.
* libvirt: the same QMP command through ``virsh qemu-monitor-command`` on the hypervisor host.
* anything else (VirtualBox, Xen, ...): thread ids given explicitly by the researcher.

Each finder returns the thread ids sorted by vCPU index.

Hand-given thread ids are pinned (:func:`pin_given_threads`): each id to the thread that held it when the
testbed file first named it (its process id, name and start time, and the host's boot id), or to what the
file says about it (``comm``, ``pid``, ``start_ticks``). The pins are kept in a small state file; every
later use checks them, so a thread id that a new thread reused after the VM stopped is refused instead of
being put under SCHED_DEADLINE.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.giventhreads import GivenThread
from bbrlab.core.hosts import Host

from .threadstat import ThreadIdentity, read_identities


class VcpuDiscoveryError(BbrlabError):
    """The vCPU thread ids could not be found: QEMU's monitor (its QMP socket, directly or through ``socat``,
    or ``virsh``) could not be reached, did not answer in time, answered with an error or not in JSON, or
    listed no vCPUs."""

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


# -- hand-given thread ids, pinned to their threads -------------------------------------------------

class VcpuIdentityError(VcpuDiscoveryError):
    """A hand-given vCPU thread id no longer names the thread it was pinned to (or that the file describes)."""


def load_pins(path: Path) -> dict[int, ThreadIdentity] | None:
    """The pins stored at ``path`` (None: no pins yet)."""
    try:
        data = json.loads(path.read_text())
        return {int(d["tid"]): ThreadIdentity.from_dict(d) for d in data["threads"]}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise VcpuIdentityError(f"cannot read the vCPU thread pins {path}: {e} (remove the file to pin the "
                                "threads that hold the ids now)") from e


def save_pins(path: Path, pins: dict[int, ThreadIdentity], host: Host) -> None:
    """Store ``pins`` at ``path`` (atomically, readable by its owner only)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = {"hypervisor": host.name, "pinned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "threads": [p.to_dict() for p in pins.values()]}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def pin_given_threads(host: Host, given: Sequence[GivenThread], pin_path: Path,
                      field: str = "roles.sender.vcpu.thread_ids") -> dict[int, ThreadIdentity]:
    """Check the hand-given vCPU threads on ``host`` against the file and their pins; return the pins.

    The first time a list of ids is seen (no pins at ``pin_path``, or pins of another list: the file was
    edited) the threads holding the ids now are pinned, after checking what the file says about them.
    Afterwards every id must still name its pinned thread (same process, name, start time, host boot),
    else :class:`VcpuIdentityError` says which differ; nothing is changed on any thread.
    """
    tids = [g.tid for g in given]
    now = read_identities(host, tids)
    pins = load_pins(pin_path)
    first = pins is None or sorted(pins) != sorted(tids)
    problems = []
    for g in given:
        if g.tid not in now:
            problems.append(f"thread {g.tid} does not exist on {host.name} (the VM stopped, or its threads have "
                            "new ids)")
            continue
        differences = g.differences(now[g.tid]) + ([] if first else pins[g.tid].differences(now[g.tid]))
        if differences:
            problems.append(f"thread {g.tid} is not the vCPU thread it was given as: {'; '.join(differences)}")
    if problems:
        raise VcpuIdentityError(
            f"{field}: " + " | ".join(problems) + f". No policy was changed. A thread id freed when a VM stops can "
            "go to any new thread: give the VM's current vCPU thread ids in the testbed file (a new list is "
            f"pinned again), or remove {pin_path} to pin the threads that hold these ids now")
    if first:
        pins = {tid: now[tid] for tid in tids}
        save_pins(pin_path, pins, host)
    return {tid: pins[tid] for tid in tids}


# -- a local QEMU, by its threads' names --------------------------------------------------------

VCPU_THREAD_NAME = re.compile(r"CPU \d+/\w+")
#: ``-name`` of a local testbed's sender QEMU (bbrlab.testbed.local.lifecycle.vm_name).
TESTBED_SENDER_NAME = re.compile(rb"bbrlab-([a-z][a-z0-9-]{0,11})-sender,debug-threads=on")


def named_vcpu_threads(pid: int, field: str = "pid") -> list[int]:
    """vCPU thread ids of a local QEMU by QEMU's own thread names (needs ``debug-threads=on``); an error
    names ``field``."""
    task_dir = f"/proc/{pid}/task"
    if not os.path.isdir(task_dir):
        raise ValidationError(field, pid, "the pid of a running process on this machine")
    found = []
    for tid in sorted(os.listdir(task_dir), key=int):
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if VCPU_THREAD_NAME.fullmatch(name):
            found.append((int(name.split()[1].split("/")[0]), int(tid)))
    if not found:
        raise ValidationError(field, pid, "a QEMU started with -name NAME,debug-threads=on "
                              "(no thread named 'CPU N/...'); or use --qmp SOCKET")
    return [tid for _index, tid in sorted(found)]


def owning_testbed(tid: int) -> str | None:
    """The local testbed whose sender QEMU runs thread ``tid`` on this machine, or None."""
    try:
        with open(f"/proc/{tid}/status") as f:
            tgid = next(line.split()[1] for line in f if line.startswith("Tgid:"))
        with open(f"/proc/{tgid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, StopIteration):
        return None
    for arg in argv:
        m = TESTBED_SENDER_NAME.fullmatch(arg)
        if m:
            return m.group(1).decode()
    return None
