"""KVM or TCG: decided by booting the guest kernel for real, with a deadline.

``/dev/kvm`` existing does not mean a guest boots under it (on this project's machines a stock
Debian guest hangs under KVM). :func:`probe_kvm` boots the cached guest image under KVM with no
network and watches the serial console for the init script's ``bbrlab-init ready`` line, with the kernel's boot
messages on (no ``quiet``): a console still empty after :data:`SILENT_DEADLINE_S` ends the probe early (the kernel
never started; under TCG, far slower than KVM, its first line came after 3.5-5.4 s in three boots here). The
answer is cached per host kernel and QEMU version, and expires (a failure after
:data:`FAILED_PROBE_MAX_AGE_S`, a success after :data:`USABLE_PROBE_MAX_AGE_S`, counted from the cache
file's modification time: a module loaded or a firmware setting changed since is noticed);
``bbrlab doctor --probe-kvm`` probes again at once. (The file's fields stay as they were: the cache is
shared by every checkout on the machine.)
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .image import cache_dir, cached_image, ensure_image
from .qemu import VmSpec, console_tail, is_our_qemu, make_overlay, qemu_version, start_vm, stop_vm

READY_LINE = "bbrlab-init ready"
PROBE_DEADLINE_S = 30.0
#: A KVM guest whose console is still empty this long after QEMU started never ran its kernel [s]. (On this
#: project's machines, whose KVM does not boot stock guests, the console stays empty for the whole 30 s.)
SILENT_DEADLINE_S = 10.0
FAILED_PROBE_MAX_AGE_S = 24 * 3600.0
USABLE_PROBE_MAX_AGE_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class AccelProbe:
    """The result of one probe boot: ``usable`` is True only when the guest reached its init."""

    usable: bool
    detail: str
    host_kernel: str = ""
    qemu_version: str = ""

    def to_dict(self) -> dict:
        """The probe result as a JSON-ready dict (how it is cached)."""
        return asdict(self)

    def expired(self, age_s: float) -> bool:
        """True when a result this old should be probed again."""
        max_age_s = USABLE_PROBE_MAX_AGE_S if self.usable else FAILED_PROBE_MAX_AGE_S
        return not 0 <= age_s <= max_age_s


def _cache_file() -> Path:
    key = f"{platform.release()}-qemu-{qemu_version()}".replace("/", "_").replace(" ", "_")
    return cache_dir() / "accel" / f"{key}.json"


def cached_kvm_probe() -> AccelProbe | None:
    """The cached answer for this host kernel and QEMU, or None when never probed, expired or unreadable."""
    path = _cache_file()
    try:
        data = json.loads(path.read_text())  # fields another bbrlab version added are ignored
        result = AccelProbe(**{k: v for k, v in data.items() if k in AccelProbe.__dataclass_fields__})
        age_s = time.time() - path.stat().st_mtime
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return None if result.expired(age_s) else result


def _save(result: AccelProbe) -> None:
    path = _cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    os.replace(tmp, path)


def probe_kvm(deadline_s: float = PROBE_DEADLINE_S) -> AccelProbe:
    """Boot the guest under KVM (bounded by ``deadline_s``), cache and return the answer."""
    host, qver = platform.release(), qemu_version()
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        result = AccelProbe(False, "/dev/kvm missing or not accessible", host, qver)
        _save(result)
        return result
    image = cached_image() or ensure_image()
    with tempfile.TemporaryDirectory(prefix="bbrlab-kvm-probe-") as tmp:
        spec = VmSpec(vm_name=f"bbrlab-kvmprobe-{os.getpid()}", hostname="kvmprobe", folder=Path(tmp),
                      accelerator="kvm", quiet_console=False)
        make_overlay(image, spec.overlay)
        t0 = time.monotonic()
        pid = start_vm(spec, image)
        try:
            result = _watch(spec, pid, t0, deadline_s, host, qver)
        finally:
            stop_vm(pid, spec.vm_name)
    _save(result)
    return result


def _watch(spec: VmSpec, pid: int, t0: float, deadline_s: float, host: str, qver: str) -> AccelProbe:
    while time.monotonic() - t0 < deadline_s:
        console = console_tail(spec, chars=1_000_000)
        if READY_LINE in console:
            return AccelProbe(True, f"guest init ready after {time.monotonic() - t0:.1f} s", host, qver)
        if not console.strip() and time.monotonic() - t0 >= SILENT_DEADLINE_S:
            return AccelProbe(False, f"the guest's console stayed empty for {SILENT_DEADLINE_S:.0f} s under KVM: its "
                              "kernel never started", host, qver)
        if not is_our_qemu(pid, spec.vm_name):
            log = (spec.folder / f"{spec.hostname}.qemu.log").read_text(errors="replace")
            first = log.strip().splitlines()[0][:200] if log.strip() else "no message"
            return AccelProbe(False, f"QEMU exited during the KVM boot: {first}",
                              host, qver)
        time.sleep(0.2)
    last = console_tail(spec, chars=200).strip().splitlines()
    return AccelProbe(False, f"guest not ready within {deadline_s:.0f} s under KVM (last console line: "
                      f"{last[-1] if last else 'none'})", host, qver)
