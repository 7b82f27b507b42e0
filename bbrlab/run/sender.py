"""The sender before a run: TCP made memoryless, what it offers read back, what it runs identified.

:func:`prepare` runs one command on the sender (every fork is slow in a TCG guest): it sets
``net.ipv4.tcp_no_metrics_save = 1`` and flushes ``ip tcp_metrics`` so one run cannot steer the next
(TCP caches ssthresh, RTT and cwnd per destination), then reads back the kernel release, the congestion
controls on offer and the sysctls that matter. The sysctl must read back as 1 and the flush must
succeed: on a sender where bbrlab lacks root, both fail, and a run recorded then would silently
depend on its predecessors, so :class:`SenderNotReady` is raised instead.

:func:`describe` measures what does not change during a campaign (tool versions, offloads).
"""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core import recordjson
from bbrlab.core.errors import BbrlabError, TestbedError
from bbrlab.core.hosts import Host
from bbrlab.kernel import ModuleIdentity
from bbrlab.kernel import module_identity as identify

SYSCTLS = (
    "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_congestion_control", "net.core.default_qdisc",
    "net.core.wmem_max", "net.core.rmem_max", "net.ipv4.tcp_wmem", "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_limit_output_bytes", "net.ipv4.tcp_autocorking",
)
OFFLOADS = ("tcp-segmentation-offload", "generic-segmentation-offload", "generic-receive-offload",
            "large-receive-offload", "tx-checksumming", "scatter-gather")
#: Congestion controls built into stock kernels; any other name is a module whose identity is recorded.
STOCK_CCAS = {"reno", "cubic", "bbr", "htcp", "vegas", "westwood", "dctcp", "bic", "illinois", "hybla",
              "highspeed", "scalable", "lp", "veno", "yeah", "nv", "cdg"}

#: bash, fixed text; the sysctl keys arrive as "$@". /proc is read with bash's ``read`` (dash reads
#: byte by byte, which /proc/sys answers with the first byte only); the only fork is ``ip tcp_metrics``.
_PREPARE = r"""
echo 1 2>/dev/null > /proc/sys/net/ipv4/tcp_no_metrics_save || echo "error=cannot write tcp_no_metrics_save"
ip tcp_metrics flush all >/dev/null 2>&1 || echo "error=ip tcp_metrics flush all failed (exit $?)"
read -r v < /proc/sys/kernel/osrelease; echo "kernel=$v"
read -r v < /proc/sys/kernel/random/boot_id; echo "boot_id=$v"
read -r v < /proc/sys/net/ipv4/tcp_available_congestion_control; echo "available=$v"
for key in "$@"; do
    path=/proc/sys/${key//.//}
    v=; [[ -r $path ]] && read -r v < "$path"; echo "sysctl:$key=$v"
done
"""
_VERSIONS = r"""
echo "ss=$(ss -V 2>/dev/null)"
echo "iperf3=$(iperf3 --version 2>/dev/null | head -n 1)"
"""


class SenderNotReady(BbrlabError):
    """The sender could not be put into the state a run needs (the message says what failed)."""


@dataclass(frozen=True)
class SenderState:
    """What :func:`prepare` read back from the sender."""

    kernel: str
    available: tuple[str, ...]
    sysctls: dict[str, str]
    boot_id: str = ""  # changes with every boot of the sender (a kernel switch)


@dataclass(frozen=True)
class SenderSysctls:
    """``metadata.sysctls``: the sender's sysctls of :data:`SYSCTLS` as :func:`prepare` read them back, name ->
    value with runs of blanks made one (``sender``). A name -> value map by design: which sysctls are read
    is :data:`SYSCTLS`, which grew over time (records of ``bbrlab.run/1`` hold one)."""

    sender: dict[str, str]

    def sender_value(self, name: str) -> str | None:
        """The sender's ``name`` sysctl as read back; None when it was not read."""
        return self.sender.get(name)


@dataclass(frozen=True)
class SenderOffloads:
    """``metadata.offloads``: ``ethtool -k`` of the sender's interface toward the receiver (:func:`offloads`):
    ``sender`` maps ``interface`` to its name and each of :data:`OFFLOADS` ethtool printed to its state
    (``on``, ``off``), or holds an ``error``. Keyed by ethtool's own names (``tx-checksumming``), so a map."""

    sender: dict[str, str]


@dataclass(frozen=True)
class ToolVersions:
    """``metadata.versions``: what ran the run: the sender's ``hypervisor`` (Testbed.hypervisor_name), bbrlab's
    version and git commit, the sender's ``ss -V`` and ``iperf3 --version`` (:func:`tool_versions`). Each is
    None when unknown; records of ``bbrlab.run/1`` name bbrlab, iperf3 and, some, the QEMU version (``qemu``,
    not written since)."""

    hypervisor: str | None = None
    bbrlab: str | None = None
    bbrlab_git: str | None = None
    ss: str | None = None
    iperf3: str | None = None
    qemu: str | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The fields in their order; ``qemu`` only where an old record names it."""
        return recordjson.record_layout(source, handler)


def _key_values(text: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    plain: dict[str, str] = {}
    sysctls: dict[str, str] = {}
    errors: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "error":
            errors.append(value.strip())
        elif key.startswith("sysctl:"):
            sysctls[key[len("sysctl:"):]] = " ".join(value.split())
        elif key:
            plain[key] = value.strip()
    return plain, sysctls, errors


def prepare(host: Host) -> SenderState:
    """Make TCP on ``host`` memoryless and read back what a run record needs; raise if that failed."""
    plain, sysctls, errors = _key_values(host.output(["bash", "-c", _PREPARE, "bbrlab-prepare", *SYSCTLS],
                                                     timeout=60))
    if sysctls.get("net.ipv4.tcp_no_metrics_save") != "1":
        errors.append(f"net.ipv4.tcp_no_metrics_save reads {sysctls.get('net.ipv4.tcp_no_metrics_save')!r}, not 1")
    if errors:
        raise SenderNotReady(f"{host.name}: {'; '.join(errors)}: each run would inherit TCP metrics of the "
                             "previous one (is bbrlab root on the sender?)")
    return SenderState(kernel=plain.get("kernel", ""), available=tuple(plain.get("available", "").split()),
                       sysctls=sysctls, boot_id=plain.get("boot_id", ""))


def tool_versions(host: Host, *, hypervisor: str | None, bbrlab: str, bbrlab_git: str | None) -> ToolVersions:
    """``metadata.versions``: the sender's ``hypervisor`` and bbrlab's version and commit as given, with ``ss -V``
    and ``iperf3 --version`` read on ``host`` in one command."""
    plain, _, _ = _key_values(host.output(["sh", "-c", _VERSIONS], timeout=60))
    return ToolVersions(hypervisor, bbrlab, bbrlab_git, plain.get("ss"), plain.get("iperf3"))


def offloads(host: Host, toward_ip: str) -> dict:
    """``ethtool -k`` of ``host``'s interface toward ``toward_ip`` (segmentation and receive offloads)."""
    route = host.run(["ip", "-o", "route", "get", toward_ip], check=False, timeout=20).stdout.split()
    if "dev" not in route:
        return {"error": f"no route to {toward_ip}"}
    dev = route[route.index("dev") + 1]
    res = host.run(["ethtool", "-k", dev], check=False, timeout=20)
    if not res.ok:
        return {"interface": dev, "error": (res.stderr or res.stdout).strip()[:200] or "ethtool failed"}
    out = {"interface": dev}
    for line in res.stdout.splitlines():
        key, _, value = line.strip().partition(":")
        if key in OFFLOADS:
            out[key] = value.strip().split()[0] if value.strip() else ""
    return out


def module_identity(host: Host, cca: str) -> ModuleIdentity | None:
    """The identity of a congestion control loaded as a module (None for the kernel's own ones); one that
    cannot be identified is recorded with the error."""
    if cca in STOCK_CCAS:
        return None

    try:
        return ModuleIdentity(**identify(host, cca))
    except TestbedError as e:
        return ModuleIdentity(cca, error=str(e))
