"""What each congestion control on a running host is: BBR version and patched or not, from the kernel.

A run's identity must come from what ran, not from names (``bbr`` is BBRv1 on Debian's kernels
and BBRv3 on Google's; ``bbr2b`` is our patched v1 but a researcher may call a module anything).
:func:`probe_ccas` runs ``guest/cca_probe.py`` on the host in one command (about a second under
TCG; call it once per boot, on an idle sender, not during a measurement). The probe asks the
running kernel:

- **BBR version**: a loopback socket with the CCA is asked for its congestion-control info by
  one exact inet_diag request. Only the BBR family answers with ``INET_DIAG_BBRINFO``; mainline
  BBR (v1) fills the 20-byte ``struct tcp_bbr_info``, Google's v2alpha and v3 kernels the
  extended struct with ``bbr_version`` (2, 3) at byte 39. Not BBR: ``bbr_version`` is None.
- **owner module**: the module whose reference count rises when one socket switches from the
  built-in ``reno`` to the CCA (the kernel pins a CCA's module per socket). None: built in.
- **patched**: the owner module carries bbrlab's ``bbrlab_patch_sha256`` (modinfo), read from a
  module file whose srcversion equals the loaded module's. A patch built into the kernel image is
  not seen (``patched`` False, ``module`` None).

The run record fields built from it are ``metadata.cca.bbr_version`` and ``metadata.cca.patched``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import resources

from bbrlab.core.errors import TestbedError
from bbrlab.core.hosts import Host

PROBE_TIMEOUT_S = 60


@dataclass(frozen=True)
class CcaIdentity:
    """One congestion control as the running kernel shows it."""

    name: str
    bbr_version: int | None  # 1, 2, 3 for the BBR family; None for any other CCA
    patched: bool
    module: str | None = None  # the kernel module providing it; None when built in
    patch_sha256: str | None = None
    srcversion: str | None = None
    info_bytes: int = 0  # size of the INET_DIAG_BBRINFO the kernel returned (20: BBRv1's struct)

    def to_dict(self) -> dict:
        """The identity as a JSON-ready dict (how a run records it)."""
        return asdict(self)


def probe_script() -> str:
    """The Python source of the guest-side probe (``kernel/guest/cca_probe.py``), run on the sender."""
    return resources.files("bbrlab.kernel").joinpath("guest/cca_probe.py").read_text()


def parse_probe(text: str) -> dict[str, CcaIdentity]:
    """The probe's output (one line per CCA, tab-separated ``key=value``) as :class:`CcaIdentity` values."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        d = dict(item.split("=", 1) for item in line.split("\t"))
        out[d["name"]] = CcaIdentity(
            name=d["name"], bbr_version=int(d["bbr_version"]) if d.get("bbr_version") else None,
            patched=bool(d.get("patch_sha256")), module=d.get("module") or None,
            patch_sha256=d.get("patch_sha256") or None, srcversion=d.get("srcversion") or None,
            info_bytes=int(d.get("info_bytes") or 0))
    return out


def probe_ccas(host: Host) -> dict[str, CcaIdentity]:
    """Every congestion control ``host``'s running kernel offers, identified (see the module docstring)."""
    res = host.run(["python3", "-c", probe_script()], check=False, timeout=PROBE_TIMEOUT_S, sudo=True)
    if not res.ok:
        raise TestbedError(f"the congestion-control probe failed on {host.name}: {res.stderr.strip()[-500:]}")
    return parse_probe(res.stdout)


def cca_identity(host: Host, cca: str) -> CcaIdentity:
    """One CCA's identity; a clear error when the host does not offer it."""
    found = probe_ccas(host)
    if cca not in found:
        raise TestbedError(f"{host.name} offers no congestion control {cca!r} (it offers {', '.join(found)})")
    return found[cca]


class CcaIdentities:
    """The probe's answers for one host, taken once per boot of its kernel and reused.

    The run path calls :meth:`get` for every run (before contention is applied); the host is probed
    again only when its ``/proc/sys/kernel/random/boot_id`` changed (the sender was rebooted, e.g.
    into another kernel), so a campaign pays the probe once per kernel block.
    """

    def __init__(self) -> None:
        self.boot_id: str | None = None
        self.found: dict[str, CcaIdentity] = {}

    def get(self, host: Host, cca: str, boot_id: str | None = None) -> CcaIdentity:
        """``cca``'s identity on ``host``; ``boot_id`` when the caller has just read it (saves a command)."""
        boot_id = boot_id or host.output(["cat", "/proc/sys/kernel/random/boot_id"])
        if boot_id != self.boot_id:
            self.found, self.boot_id = probe_ccas(host), boot_id
        if cca not in self.found:
            raise TestbedError(f"{host.name} offers no congestion control {cca!r} (it offers "
                               f"{', '.join(self.found)})")
        return self.found[cca]
