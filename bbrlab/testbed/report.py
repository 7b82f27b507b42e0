"""What each role of a testbed can do, measured now (``bbrlab testbed status``)."""

from __future__ import annotations

from dataclasses import asdict

from .roles import Role, Testbed

QDISCS = ("netem", "tbf", "fq", "htb")
# For each qdisc: loaded, built in, or loadable as a module? Runs on the role, reads only. A kernel
# without a module tree (a custom host kernel) cannot be asked this way: "unknown".
QDISC_PROBE = r"""
for q in "$@"; do
  if [ -d /sys/module/sch_$q ]; then echo "$q loaded"
  elif grep -qs "/sch_$q.ko" /lib/modules/$(uname -r)/modules.builtin; then echo "$q builtin"
  elif modprobe -n -q sch_$q 2>/dev/null; then echo "$q module"
  elif [ ! -d /lib/modules/$(uname -r) ]; then echo "$q unknown"
  else echo "$q missing"; fi
done
"""


def role_status(role: Role) -> dict:
    """What one role can do now: its kernel, congestion controls and qdiscs (loaded, built in, module,
    missing or unknown); ``reachable`` False with the error when it cannot be asked.
    """
    out: dict = {"role": role.name, "host": _where(role), "experiment_ip": role.experiment_ip}
    try:
        out["kernel"] = role.kernel_release()
    except Exception as e:  # noqa: BLE001 - status reports, it does not fail
        out.update(reachable=False, error=str(e).splitlines()[0][:300])
        return out
    out["reachable"] = True
    h = role.host
    out["congestion_controls"] = h.output(["cat", "/proc/sys/net/ipv4/tcp_available_congestion_control"],
                                          check=False).split()
    probe = h.output(["sh", "-c", QDISC_PROBE, "sh", *QDISCS], check=False)
    out["qdiscs"] = dict(line.split(" ", 1) for line in probe.splitlines() if " " in line)
    return out


def _where(role: Role) -> str:
    h = role.host
    if getattr(h, "netns", ""):
        return f"netns {h.netns}"
    if hasattr(h, "address"):
        return f"{h.user}@{h.address}:{h.port}"
    return h.name


def testbed_status(tb: Testbed) -> dict:
    """Every role's :func:`role_status`, the sender's vCPU threads and QEMU pid, and the testbed's kind,
    accelerator and hypervisor (``bbrlab testbed status``).
    """
    roles = {name: role_status(role) for name, role in tb.roles.items()}
    sender = roles["sender"]
    try:
        sender["vcpu_threads"] = tb.sender.vcpu_threads()
        sender["qemu_pid"] = tb.sender.qemu_pid()
    except Exception as e:  # noqa: BLE001
        sender["vcpu_error"] = str(e)[:300]
    details = asdict(tb.local) if tb.local else {}
    return {"name": tb.name, "kind": tb.kind, "accelerator": tb.accelerator, "hypervisor": tb.hypervisor_name,
            **{k: v for k, v in details.items() if v}, "roles": roles}
