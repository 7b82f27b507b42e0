"""The suite's testbed network state, written into a failing system test's report.

A test that fails on the shared testbed (a flow that stalls, a peer that cannot be reached) leaves little to
go on once the session has ended and the testbed is gone. :func:`snapshot` reads, at the moment of the failure,
what the experiment path looks like from each of its parts: the sender's and the emulator's interfaces with
their counters, qdiscs and neighbour tables, the emulator's bridge table, each guest's last kernel messages, the scheduling of the QEMU threads, and the host's link and receiver
namespaces. Every read has a short bound, and a read that fails says so in the text instead of raising.
"""

from __future__ import annotations

import subprocess

#: What each guest is asked (one shell line each, run over the testbed's own SSH).
GUEST_READS = {
    "sender": "ip -s link show eth1; tc -s qdisc show dev eth1; ip neigh show dev eth1; dmesg | tail -n 15",
    "emulator": "ip -s link show eth1; ip -s link show eth2; tc -s qdisc show dev eth1; tc -s qdisc show dev eth2;"
                " bridge fdb show br br0 | grep -v permanent; dmesg | tail -n 15",
}
#: Seconds one read may take (a guest that no longer answers must not hold the report up).
READ_TIMEOUT_S = 15


def snapshot(testbed) -> str:
    """Text describing ``testbed``'s experiment path now (see the module docstring)."""
    parts = []
    for role, line in GUEST_READS.items():
        host = getattr(testbed, role).host
        try:
            res = host.run(["sh", "-c", line], timeout=READ_TIMEOUT_S, check=False)
            parts.append(f"--- {role}: {line}\n{res.stdout}{res.stderr}")
        except Exception as e:  # noqa: BLE001 - a failed read is part of the picture
            parts.append(f"--- {role}: cannot read ({type(e).__name__}: {e})")
    local = getattr(testbed, "local", None)
    for role, pid in (getattr(local, "qemu_pids", None) or {}).items():
        argv = ["ps", "-L", "-o", "tid,cls,rtprio,pri,psr,pcpu,stat,wchan:20,comm", "-p", str(pid)]
        parts.append(_host_read(f"{role} QEMU threads", argv))
    if local is not None:
        for suffix in ("link", "rx"):
            ns = f"bbrlab-{testbed.name}-{suffix}"
            for argv in (["ip", "-n", ns, "-s", "link"], ["ip", "-n", ns, "neigh"],
                         ["bridge", "-n", ns, "fdb", "show", "dynamic"]):
                parts.append(_host_read(ns, argv))
    return "\n".join(parts)


def _host_read(what: str, argv: list[str]) -> str:
    """One read on this machine, as a titled block (or the reason it failed)."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=READ_TIMEOUT_S)
        return f"--- host ({what}): {' '.join(argv)}\n{res.stdout}{res.stderr}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"--- host ({what}): {' '.join(argv)}: {e}"
