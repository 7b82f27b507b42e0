"""TSO, GSO and GRO on the emulator's two ports (``Link.emulator_offloads``): set, read back, compare.

bbrlab's emulator forwards packet by packet: its setup script turns GRO off on both bridge ports at boot
and its NICs accept no segmentation-offloaded frames from the host (``bbrlab.testbed.local.lifecycle``,
``bbrlab.testbed.local.qemu.VmSpec.receive_offloads``), so netem delays and drops wire-sized packets. The
paper authors' emulator script turned TSO, GSO and GRO on on both ports; netem there saw GRO's aggregates.
``emulator_offloads = "on"`` does what their script did, ``"off"`` turns all three off: every
:func:`bbrlab.link.emulator.apply` applies the link's value and reads it back with ``ethtool -k`` in one command,
and refuses (:class:`OffloadMismatch`) a port that did not take it (a feature the NIC has fixed). What was read
back (:class:`Offloads`) is a run record's ``metadata.link.emulator_offloads``.

On the local testbed the emulator's NICs still take no GSO frames from the host with ``on`` (that is fixed
when QEMU starts): GRO in the emulator's kernel merges what arrives, so netem sees aggregates as the authors'
did, and TSO/GSO let them leave as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.scenario.link import EMULATOR_OFFLOADS

#: ethtool's short names (for ``-K``) and the names ``-k`` prints for them.
FEATURES = {"tso": "tcp-segmentation-offload", "gso": "generic-segmentation-offload",
            "gro": "generic-receive-offload"}
#: One command: set every feature on every port ("$1" the state, the ports after it), then print each port's
#: features after a ``== PORT`` line. The values arrive as arguments, never pasted into the script.
_SCRIPT = ('state=$1; shift; for p in "$@"; do ethtool -K "$p" tso "$state" gso "$state" gro "$state" '
           '|| exit 1; done; for p in "$@"; do echo "== $p"; ethtool -k "$p" || exit 1; done')


class OffloadMismatch(TestbedError):
    """An emulator port reports offloads other than the ones asked for."""


@dataclass(frozen=True)
class Offloads:
    """The offloads of the emulator's ports: the state ``asked`` (``on``/``off``) and, per port, TSO, GSO and GRO
    as ``ethtool -k`` read them back (``{port: {"tso"|"gso"|"gro": "on"|"off"}}``)."""

    asked: str
    ports: dict[str, dict[str, str]]

    def to_dict(self) -> dict:
        """The record's JSON (``metadata.link.emulator_offloads``): ``{"asked": state, "ports": {...}}``."""
        return {"asked": self.asked, "ports": {p: dict(f) for p, f in self.ports.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> Offloads:
        """The offloads read from a record."""
        return cls(d["asked"], {p: dict(f) for p, f in d["ports"].items()})


def set_argv(ports: Sequence[str], state: str) -> list[str]:
    """The one command that sets TSO, GSO and GRO to ``state`` (``on``/``off``) on ``ports`` and prints
    ``ethtool -k`` of each."""
    if state not in EMULATOR_OFFLOADS:
        raise ValidationError("link.emulator_offloads", state, "off or on")
    return ["sh", "-c", _SCRIPT, "offloads", state, *ports]


def parse_features(text: str) -> dict[str, dict[str, str]]:
    """``{port: {"tso"|"gso"|"gro": "on"|"off"}}`` from :func:`set_argv`'s output (``[fixed]`` dropped)."""
    names = {long: short for short, long in FEATURES.items()}
    out: dict[str, dict[str, str]] = {}
    port = None
    for line in text.splitlines():
        if line.startswith("== "):
            port = line[3:].strip()
            out[port] = {}
            continue
        key, _, value = line.strip().partition(":")
        if port is not None and key in names and value.strip():
            out[port][names[key]] = value.split()[0]
    return out


def differences(readback: dict[str, dict[str, str]], ports: Sequence[str], state: str) -> list[str]:
    """Every feature of every port that is not ``state`` (or missing) in ``readback``."""
    return [f"{port} {short} {readback.get(port, {}).get(short, 'missing')}, asked {state}"
            for port in ports for short in FEATURES if readback.get(port, {}).get(short) != state]


def apply(host: Host, ports: Sequence[str], state: str) -> Offloads:
    """Set TSO, GSO and GRO to ``state`` on ``ports`` of ``host`` and read them back (:class:`Offloads`). Raises
    :class:`OffloadMismatch` when a port did not take it, :class:`TestbedError` when ethtool fails (e.g. not
    installed)."""
    res = host.run(set_argv(ports, state), check=False, timeout=60)
    if not res.ok:
        detail = (res.stderr or res.stdout).strip()[-300:] or f"exit {res.exit_code}"
        raise TestbedError(f"cannot set the offloads of {', '.join(ports)} on {host.name} with ethtool: {detail}")
    readback = parse_features(res.stdout)
    diffs = differences(readback, ports, state)
    if diffs:
        raise OffloadMismatch("the emulator's ports did not take the offloads asked for: " + "; ".join(diffs))
    return Offloads(state, {p: readback[p] for p in ports})
