"""What congestion control a run really used: name, BBR version, patch, kernel, and its display label.

A run is identified by what ran, not by what it was called: ``bbr`` is BBRv1 on Debian's 6.1 kernel and
BBRv3 on a BBRv3 kernel, and the paper authors' patched module keeps the name ``bbr``. Every table row
carries the same four fields for both data layouts, plus a label (``variant``) that figures group and
label by, so no figure can merge BBRv1 with BBRv3, or stock with patched BBR:

=============== ===============================================================================
``cca``         the congestion control's name as configured (``bbr``, ``bbr1``, ``bbr2b``, ``cubic``)
``bbr_version`` 1, 2 or 3; missing (``<NA>``) for a congestion control that is not BBR
``patched``     the run used the inflight-deficit patch (bbrlab's ``bbr2b``, the authors' ``_fixed``)
``kernel``      the sender's kernel (release for bbrlab runs, the authors' kernel name for theirs)
``variant``     ``"Cubic"``, ``"BBRv1"``, ``"BBRv1 patched"``, ``"BBRv3 patched"`` ...
=============== ===============================================================================

Sources of the identity:

- bbrlab records written from now on say it themselves (``metadata.cca.bbr_version``, ``.patched``);
- older bbrlab records are read by :func:`from_module` (the one fallback): the module the record names
  and the sender kernel's release;
- the authors' layout by :func:`from_authors`: ``cca`` together with their kernel name, as their own
  parser reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bbrlab.run.runmeta import RunMetadata
    from bbrlab.scenario.scenario import Scenario

#: Names of congestion controls that are not BBR, as figures print them.
CCA_LABELS = {"cubic": "Cubic", "reno": "Reno", "vegas": "Vegas", "dctcp": "DCTCP", "westwood": "Westwood"}
_EXPLICIT_VERSION = re.compile(r"bbr(?:v)?([123])(?![0-9])")


@dataclass(frozen=True)
class Identity:
    """The identity of one run's congestion control (see the module docstring)."""

    cca: str | None
    bbr_version: int | None
    patched: bool
    kernel: str | None
    patch_tag: str | None = None

    @property
    def variant(self) -> str:
        """The display label figures group by, e.g. ``"BBRv3 patched"``."""
        return variant_label(self.cca, self.bbr_version, self.patched, self.patch_tag)


def variant_label(cca: str | None, bbr_version: int | None, patched: bool, patch_tag: str | None = None) -> str:
    """``"BBRv1"``, ``"BBRv3 patched"``, ``"BBRv1 patched (new)"``, ``"Cubic"``; ``"BBR (version unknown)"``.

    Examples
    --------
    >>> variant_label("bbr2b", 1, True)
    'BBRv1 patched'
    >>> variant_label("cubic", None, False)
    'Cubic'
    """
    if bbr_version is None:
        if is_bbr(cca):
            base = "BBR (version unknown)"
        else:
            base = CCA_LABELS.get(str(cca).lower(), str(cca)) if cca else "unknown CCA"
    else:
        base = f"BBRv{int(bbr_version)}"
    if patched:
        base += " patched" + (f" ({patch_tag})" if patch_tag else "")
    return base


def is_bbr(cca: str | None) -> bool:
    """True for a congestion control of the BBR family (``bbr``, ``bbr2``, ``bbr3``, ``bbr2b`` ...); False
    for None.
    """
    return bool(cca) and str(cca).lower().startswith("bbr")


def explicit_version(cca: str | None) -> int | None:
    """The version a name states itself (``bbr1``, ``bbr3``, ``bbrv2``); None for ``bbr``, ``bbr2b`` ..."""
    if not cca:
        return None
    name = str(cca).lower()
    if name in ("bbr2b", "bbr3b"):  # bbrlab's patched modules: the digit is not a version
        return None
    m = _EXPLICIT_VERSION.fullmatch(name)
    return int(m.group(1)) if m else None


# -- bbrlab records ------------------------------------------------------------------------------

def from_record(scenario: Scenario, meta: RunMetadata) -> Identity:
    """The identity of one bbrlab run record, from its typed scenario and metadata.

    ``metadata.cca.bbr_version`` and ``metadata.cca.patched`` are used when the record states a version (a
    congestion control that is not BBR states none and reads the same either way); otherwise
    :func:`from_module` derives them from the module and kernel the record names.
    """
    said = meta.cca
    cca = scenario.flow.cca or (said.requested if said else None)
    kernel = meta.testbed.sender_kernel
    if said is not None and said.bbr_version is not None:
        return Identity(cca, int(said.bbr_version), bool(said.patched), kernel)
    module = meta.module
    return from_module(cca, module.name if module else None, module.patch_sha256 if module else None, kernel)


def from_module(cca: str | None, module_name: str | None, patch_sha256: str | None, kernel: str | None) -> Identity:
    """The fallback for records written before they stated their BBR version.

    - a congestion control that is not BBR: no version, not patched;
    - a module that carries a ``patch_sha256`` (bbrlab's ``bbr2b``, built from the sender kernel's own
      ``tcp_bbr.c``) is patched; its version is that of the kernel's ``bbr``;
    - the version of ``bbr`` is the kernel's: 3 on a kernel whose release names BBRv3 (bbrlab's v3
      recipe appends ``-bbrv3``), else 1 (Debian's and mainline kernels ship BBRv1);
    - a name that states a version (``bbr1``, ``bbr3``) keeps it.

    ``module_name`` and ``patch_sha256`` are those of the module the record names (``metadata.module``), None
    when it names none.
    """
    if not is_bbr(cca):
        return Identity(cca, None, False, kernel)
    name = str(cca).lower()
    named_module = str(module_name or "").lower() == name
    patched = name in ("bbr2b", "bbr3b") or (named_module and bool(patch_sha256))
    version = explicit_version(cca) or kernel_bbr_version(kernel)
    return Identity(cca, version, patched, kernel)


def kernel_bbr_version(kernel: str | None) -> int:
    """The BBR version a kernel registers as ``bbr``: 3 when its release names BBRv3, else 1."""
    return 3 if kernel and re.search(r"bbr-?v?3", str(kernel).lower()) else 1


# -- the authors' layout ---------------------------------------------------------------------------

def from_authors(cca: str | None, kernel: str | None) -> Identity:
    """The identity of a run in the paper authors' layout, from ``meta.json``'s ``cca`` and ``kernel``.

    Their kernel names are ``kernel6-1`` (Debian 6.1: ``bbr`` is BBRv1), ``BBRv2`` (``bbr2`` is BBRv2,
    ``bbr`` is BBRv1) and ``BBRv3`` (``bbr`` is BBRv3, ``bbr1`` is BBRv1), each with a ``_fixed``
    suffix (and sometimes more, e.g. ``_fixed_new``) when the kernel carries their patched module,
    which keeps the name ``bbr``. A BBR congestion control on a ``_fixed`` kernel is patched; the text
    after ``_fixed`` is kept as the patch tag so that their patch revisions stay apart.

    Examples
    --------
    >>> from_authors("bbr", "BBRv3_fixed").variant
    'BBRv3 patched'
    >>> from_authors("bbr1", "BBRv3").variant
    'BBRv1'
    """
    name = str(kernel or "")
    base, fixed, tag = name.partition("_fixed")
    if not is_bbr(cca):
        return Identity(cca, None, False, kernel)
    version = explicit_version(cca)
    if version is None:
        version = 3 if re.search(r"bbrv3", base.lower()) else 1
    return Identity(cca, version, bool(fixed), kernel, tag.strip("_-") or None)


def from_socket_log_name(stem: str) -> tuple[Identity, float, int] | None:
    """(identity, cpu_share_pct, repetition) from an authors' socket log name, or None if it is not one.

    Names are ``ss_<no|25|patched_25>_scheduling_bbr<1|2|3>[_<N>]``: ``no`` is the full CPU,
    ``25`` a 25 % share, ``patched_25`` the patched module at 25 %; the digit after ``bbr`` is the BBR
    version. The kernel is not in the name.
    """
    m = re.fullmatch(r"ss_(no|\d+|patched_\d+)_scheduling_bbr([123])(?:_(\d+))?", stem)
    if not m:
        return None
    scenario, version, rep = m.group(1), int(m.group(2)), int(m.group(3) or 0)
    patched = scenario.startswith("patched_")
    share = 100.0 if scenario == "no" else float(scenario.removeprefix("patched_"))
    return Identity(None, version, patched, None), share, rep
