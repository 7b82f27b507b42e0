"""The machine a run ran on: the CPU model and speed, the core count, the kernel and an anonymised machine id of the
host that runs the sender VM (its hypervisor host; for the local testbed, this machine).

Two recordings of one condition on two machines of the same kind can differ by more than either one's
intervals (issue 36: a second machine's CPU ceilings were 35-70 % lower), so every record names the machine
(``metadata.testbed.machine``) and a comparison across machines says that it is one (``bbrlab compare``).

What is read, in one command on the host: ``/proc/cpuinfo`` (the first ``model name``, the mean of the
``cpu MHz`` lines, the ``processor`` count), cpufreq's ``base_frequency`` (the nominal speed, where the driver
publishes one) and ``cpuinfo_max_freq``, ``/etc/machine-id`` (else the DMI product UUID), the boot id and
``uname -r``. The raw ids are never written: each is replaced by the first 16 hex digits of the SHA-256 of a
bbrlab-specific prefix and the id (:func:`anonymised`), which tells machines and boots apart without naming them.
A VM cloned from one image may carry its image's machine-id, so two such clones share ``machine_id``; their
``boot_id`` (and usually their kernel build and measured speed) still differ.

``label`` is what tables show (the ``machine`` column): ``"<model> @ <MHz> MHz"`` with the nominal speed, else
the maximum, else the current speed rounded to 10 MHz (a VM with a constant TSC clock reports a steady
current speed that differs by fractions of a MHz between boots).
"""

from __future__ import annotations

import hashlib
import re
import statistics
from dataclasses import asdict, dataclass

from bbrlab.core.hosts import Host

#: Prefix hashed with a raw id, so the hash is bbrlab's own (the same id hashed by another tool gives another value).
ID_PREFIX = b"bbrlab machine id\0"
#: Hex digits kept of an anonymised id (64 bits: no collision among any plausible number of machines).
ID_DIGITS = 16
#: The files read, in order; each is printed after a marker line so that one command reads them all.
FILES = ("/proc/cpuinfo", "/etc/machine-id", "/sys/class/dmi/id/product_uuid", "/proc/sys/kernel/random/boot_id",
         "/sys/devices/system/cpu/cpu0/cpufreq/base_frequency",
         "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
MARKER = "@@bbrlab-file "
SCRIPT = ('for f in "$@"; do echo "' + MARKER + '$f"; cat "$f" 2>/dev/null; done; echo "' + MARKER
          + 'uname"; uname -r')


@dataclass(frozen=True)
class Machine:
    """The host that runs the sender VM, as a record names it (``metadata.testbed.machine``).

    Attributes
    ----------
    label : str
        ``"<cpu model> @ <MHz> MHz"`` (see the module's text); the ``machine`` column of the runs table.
    cpu_model : str or None
        ``/proc/cpuinfo``'s first ``model name``.
    cpu_mhz_nominal, cpu_mhz_max : float or None
        cpufreq's ``base_frequency`` (else the speed a model name states, "@ 2.60GHz") and ``cpuinfo_max_freq``
        [MHz]; None where the machine publishes none (most VMs).
    cpu_mhz_current : float or None
        The mean of ``/proc/cpuinfo``'s ``cpu MHz`` when the testbed was described [MHz].
    cpus : int or None
        Online CPUs (``processor`` entries of ``/proc/cpuinfo``).
    machine_id, machine_id_source : str or None
        :func:`anonymised` ``/etc/machine-id`` (else the DMI product UUID, readable by root) and which it was.
    boot_id : str or None
        The host's anonymised boot id: different after every boot of the host.
    kernel : str or None
        The host's ``uname -r``.
    """

    label: str
    cpu_model: str | None = None
    cpu_mhz_nominal: float | None = None
    cpu_mhz_max: float | None = None
    cpu_mhz_current: float | None = None
    cpus: int | None = None
    machine_id: str | None = None
    machine_id_source: str | None = None
    boot_id: str | None = None
    kernel: str | None = None

    def to_dict(self) -> dict:
        """The record's JSON (``metadata.testbed.machine``)."""
        return asdict(self)


def anonymised(raw: str) -> str:
    """The first :data:`ID_DIGITS` hex digits of SHA-256(:data:`ID_PREFIX` + ``raw`` stripped)."""
    return hashlib.sha256(ID_PREFIX + raw.strip().encode()).hexdigest()[:ID_DIGITS]


def split_files(text: str) -> dict[str, str]:
    """The output of :data:`SCRIPT` as ``{file: its text}`` (``uname``: ``uname -r``'s); a file that could not be
    read has empty text."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(MARKER):
            current = line[len(MARKER):]
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {name: "\n".join(lines).strip() for name, lines in out.items()}


def parse_cpuinfo(text: str) -> tuple[str | None, float | None, int | None]:
    """(model, mean current MHz, CPU count) of ``/proc/cpuinfo``'s text; None for what it does not state."""
    model, mhz, cpus = None, [], 0
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep:
            continue
        name, value = name.strip(), value.strip()
        if name == "processor":
            cpus += 1
        elif name == "model name" and model is None:
            model = " ".join(value.split())
        elif name == "cpu MHz":
            try:
                mhz.append(float(value))
            except ValueError:
                pass
    return model, (round(statistics.fmean(mhz), 3) if mhz else None), (cpus or None)


def _khz_to_mhz(text: str | None) -> float | None:
    try:
        return int(text.strip()) / 1000 if text and text.strip() else None
    except ValueError:
        return None


def stated_mhz(model: str | None) -> float | None:
    """The speed a CPU model name states (Intel's ``"... CPU @ 2.60GHz"``) [MHz]; None when it states none."""
    found = re.search(r"@\s*([0-9]+(?:\.[0-9]+)?)\s*GHz", model or "")
    return float(found.group(1)) * 1000 if found else None


def label(model: str | None, nominal_mhz: float | None, max_mhz: float | None, current_mhz: float | None) -> str:
    """``"<model> @ <MHz> MHz"``: the nominal speed, else the maximum, else the current rounded to 10 MHz."""
    mhz = nominal_mhz or max_mhz or (round(current_mhz, -1) if current_mhz else None)
    speed = f"{mhz:.0f} MHz" if mhz else "unknown speed"
    return f"{model or 'unknown CPU'} @ {speed}"


def of_files(files: dict[str, str]) -> Machine:
    """The :class:`Machine` of the texts :func:`split_files` gives."""
    model, current, cpus = parse_cpuinfo(files.get("/proc/cpuinfo", ""))
    nominal = _khz_to_mhz(files.get(FILES[4])) or stated_mhz(model)
    maximum = _khz_to_mhz(files.get(FILES[5]))
    source = next((f for f in FILES[1:3] if files.get(f)), None)
    boot = files.get("/proc/sys/kernel/random/boot_id")
    return Machine(label=label(model, nominal, maximum, current), cpu_model=model, cpu_mhz_nominal=nominal,
                   cpu_mhz_max=maximum, cpu_mhz_current=current, cpus=cpus,
                   machine_id=anonymised(files[source]) if source else None, machine_id_source=source,
                   boot_id=anonymised(boot) if boot else None, kernel=files.get("uname") or None)


def measure(host: Host) -> Machine:
    """The :class:`Machine` of ``host`` (the sender's hypervisor host), read in one command."""
    return of_files(split_files(host.output(["sh", "-c", SCRIPT, "sh", *FILES], timeout=20)))
