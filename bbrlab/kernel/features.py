"""Does a kernel have what the sender needs? Answered from files, before it boots.

Evidence, strongest first:

1. the modules tree ``lib/modules/<release>/``: ``modules.builtin`` lists what is built in, the
   ``*.ko[.xz|.zst|.gz]`` files what can be loaded;
2. the kernel's ``.config`` (``CONFIG_X=y`` built in, ``=m`` a module, which then must be in the
   tree): used when there is no modules tree (a kernel with everything built in).

Without either, nothing can be said and the kernel is refused (give its ``.config``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bbrlab.core.errors import BbrlabError


@dataclass(frozen=True)
class Feature:
    """A kernel part the testbed needs: its module name, its Kconfig symbol and why."""

    module: str
    config: str
    why: str


#: Without these the sender cannot boot, be reached, or be sampled.
REQUIRED: tuple[Feature, ...] = (
    Feature("virtio_pci", "CONFIG_VIRTIO_PCI", "QEMU's virtio devices"),
    Feature("virtio_blk", "CONFIG_VIRTIO_BLK", "the root disk"),
    Feature("virtio_net", "CONFIG_VIRTIO_NET", "management and experiment NICs"),
    Feature("ext4", "CONFIG_EXT4_FS", "the root file system"),
    Feature("qemu_fw_cfg", "CONFIG_FW_CFG_SYSFS", "the SSH key and setup script handed in by QEMU"),
    Feature("inet_diag", "CONFIG_INET_DIAG", "socket sampling (ss / netlink)"),
    Feature("tcp_diag", "CONFIG_INET_TCP_DIAG", "TCP socket sampling"),
)
#: Reported, not required: a kernel without them still runs other experiments.
OPTIONAL: tuple[Feature, ...] = (
    Feature("tcp_bbr", "CONFIG_TCP_CONG_BBR", "BBR"),
    Feature("sch_fq", "CONFIG_NET_SCH_FQ", "the fq qdisc"),
    Feature("sch_netem", "CONFIG_NET_SCH_NETEM", "netem"),
    Feature("sch_tbf", "CONFIG_NET_SCH_TBF", "tbf"),
)
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


class MissingFeatures(BbrlabError):
    """A kernel lacks parts the sender needs."""


@dataclass(frozen=True)
class FeatureReport:
    """Where each feature is: ``builtin``, ``module`` or ``missing``, and how that was learnt."""

    kernel: str
    found: dict[str, str]
    evidence: str  # "modules tree" or ".config"
    missing_required: tuple[str, ...] = field(default=())

    def require(self) -> FeatureReport:
        """Raise :class:`MissingFeatures` naming the kernel and each missing part."""
        if self.missing_required:
            wanted = {f.module: f for f in REQUIRED}
            parts = ", ".join(f"{m} ({wanted[m].config}: {wanted[m].why})" for m in self.missing_required)
            raise MissingFeatures(f"kernel {self.kernel} cannot be the sender: missing {parts}; checked "
                                  f"{self.evidence}. Build them in (=y) or as modules (=m).")
        return self


def normalise(name: str) -> str:
    """Module names treat '-' and '_' alike (``tcp-diag`` is ``tcp_diag``)."""
    return name.replace("-", "_")


def module_name(path: str) -> str:
    """The module name of a ``.ko`` path (any compression suffix dropped, ``-`` as ``_``)."""
    base = path.rsplit("/", 1)[-1]
    for suffix in MODULE_SUFFIXES:
        if base.endswith(suffix):
            return normalise(base[: -len(suffix)])
    return normalise(base)


def tree_modules(modules_dir: Path) -> tuple[set[str], set[str]]:
    """``(built in, loadable)`` module names of a ``lib/modules/<release>`` tree."""
    builtin_file = modules_dir / "modules.builtin"
    builtin = set()
    if builtin_file.is_file():
        builtin = {module_name(line.strip()) for line in builtin_file.read_text().splitlines() if line.strip()}
    loadable = {module_name(p.name) for p in modules_dir.rglob("*.ko*") if p.name.endswith(MODULE_SUFFIXES)}
    return builtin, loadable


def read_config(path: Path) -> dict[str, str]:
    """``CONFIG_X -> y|m|value`` of a kernel ``.config`` (unset options are absent)."""
    out = {}
    for m in re.finditer(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$", path.read_text(errors="replace"), re.M):
        out[m.group(1)] = m.group(2).strip('"')
    return out


def check_features(kernel: str, modules_dir: Path | None, config: Path | None, *,
                   modules_elsewhere: bool = False) -> FeatureReport:
    """Classify :data:`REQUIRED` and :data:`OPTIONAL` for a kernel from its files (see module doc).

    ``modules_elsewhere``: the kernel's whole modules tree is known to be where it boots (the guest
    image's own kernel), so a ``.config``'s ``=m`` counts as a module.
    """
    features = REQUIRED + OPTIONAL
    if modules_dir is not None and modules_dir.is_dir():
        builtin, loadable = tree_modules(modules_dir)
        if not (modules_dir / "modules.builtin").is_file() and config is None:
            raise MissingFeatures(f"kernel {kernel}: {modules_dir} has no modules.builtin and there is no .config: "
                                  "cannot tell what is built in")
        settings = read_config(config) if config is not None else {}
        found = {}
        for f in features:
            if f.module in builtin or settings.get(f.config) == "y":
                found[f.module] = "builtin"
            elif f.module in loadable:
                found[f.module] = "module"
            else:
                found[f.module] = "missing"
        evidence = f"the modules tree {modules_dir}" + (f" and {config}" if config else "")
    elif config is not None:
        settings = read_config(config)
        as_m = "module" if modules_elsewhere else "missing"
        found = {f.module: {"y": "builtin", "m": as_m}.get(settings.get(f.config, ""), "missing")
                 for f in features}
        evidence = str(config) if modules_elsewhere else f"{config} (no modules tree: '=m' parts count as missing)"
    else:
        raise MissingFeatures(f"kernel {kernel}: neither a modules tree (lib/modules/<release>) nor a .config "
                              "next to the kernel image: cannot check it has virtio, ext4, inet_diag, tcp_diag")
    missing = tuple(f.module for f in REQUIRED if found[f.module] == "missing")
    return FeatureReport(kernel, found, evidence, missing)
