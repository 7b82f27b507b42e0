"""The root qdisc of the sender's experiment interface, held for one run (``Scenario.sender_qdisc``).

:func:`held` finds the interface the sender reaches the receiver through (``ip route get``), sets the asked
qdisc there (``fq``: ``tc qdisc replace dev IF root fq``; ``default``: ``tc qdisc del dev IF root``, which
gives the interface back the kernel's own root qdisc and clears a leftover), reads the qdiscs back
(``tc -j qdisc show dev IF``) and refuses to run when the root is not what was asked. Whatever happens in
the block, the default is restored after it, in one command each way (forks are slow in a TCG guest).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bbrlab.core.errors import TestbedError
from bbrlab.core.hosts import Host
from bbrlab.scenario.competition import check_sender_qdisc

#: bash, fixed text; the receiver's address and the asked qdisc arrive as "$1" and "$2".
_SET = r"""
dev=$(ip -o route get "$1" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
[ -n "$dev" ] || { echo "error=no route to $1"; exit 0; }
echo "dev=$dev"
read -r v < /proc/sys/net/core/default_qdisc; echo "default=$v"
if [ "$2" = fq ]; then
    tc qdisc replace dev "$dev" root fq 2>&1 | sed 's/^/error=tc qdisc replace root fq: /'
else
    tc qdisc del dev "$dev" root >/dev/null 2>&1 || true
fi
echo "qdiscs=$(tc -j qdisc show dev "$dev")"
"""


class SenderQdiscError(TestbedError):
    """The sender's root qdisc could not be set, read back or restored (the message says which)."""


@dataclass(frozen=True)
class SenderQdisc:
    """What the sender's experiment interface had during the run: ``asked`` (default or fq), the
    ``interface``, the ``root`` qdisc's kind as read back and every qdisc on it as ``tc -j`` printed them;
    ``metadata.sender_qdisc`` of the run record, written field for field (:mod:`bbrlab.core.recordjson`)."""

    asked: str
    interface: str
    root: str | None
    qdiscs: list
    default_qdisc: str = ""  # the sender's net.core.default_qdisc


def _apply(host: Host, toward_ip: str, kind: str) -> SenderQdisc:
    out = host.output(["bash", "-c", _SET, "bbrlab-sender-qdisc", toward_ip, kind], timeout=60)
    values = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    errors = [v for k, v in (line.partition("=")[::2] for line in out.splitlines()) if k == "error"]
    if errors:
        raise SenderQdiscError(f"{host.name}: {'; '.join(errors)}")
    try:
        qdiscs = json.loads(values.get("qdiscs") or "null")
    except json.JSONDecodeError as e:
        raise SenderQdiscError(f"{host.name}: tc -j qdisc show printed no JSON ({e}): {out[:200]!r}") from None
    if not isinstance(qdiscs, list):
        raise SenderQdiscError(f"{host.name}: tc -j qdisc show gave {qdiscs!r}, not a list of qdiscs")
    root = next((q.get("kind") for q in qdiscs if isinstance(q, dict) and q.get("root")), None)
    return SenderQdisc(kind, values.get("dev", ""), root, qdiscs, values.get("default", ""))


def apply(host: Host, toward_ip: str, kind: str) -> SenderQdisc:
    """Set ``kind`` (:data:`~bbrlab.scenario.competition.SENDER_QDISCS`) on ``host``'s interface toward
    ``toward_ip`` and read it back; raise :class:`SenderQdiscError` when fq was asked and is not the root, or
    the default was asked and fq stays the root though the kernel's default is another qdisc."""
    check_sender_qdisc(kind)
    state = _apply(host, toward_ip, kind)
    if kind == "fq" and state.root != "fq":
        raise SenderQdiscError(f"{host.name}: asked root fq on {state.interface}, read back {state.root!r}")
    if kind == "default" and state.root == "fq" and state.default_qdisc != "fq":
        raise SenderQdiscError(f"{host.name}: fq is still the root of {state.interface} after "
                               f"'tc qdisc del root' (the kernel's default is {state.default_qdisc!r})")
    return state


@contextmanager
def held(host: Host, toward_ip: str, kind: str) -> Iterator[SenderQdisc]:
    """``kind`` on the sender's experiment interface for the block; the kernel's default after it, on every
    exit. A failed restore is raised when the block succeeded, else noted on the block's own error."""
    try:
        yield apply(host, toward_ip, kind)
    except BaseException as e:
        if kind != "default":  # also when setting it failed half-way
            _restore(host, toward_ip, note_on=e)
        raise
    if kind != "default":
        _restore(host, toward_ip)


def _restore(host: Host, toward_ip: str, note_on: BaseException | None = None) -> None:
    try:
        apply(host, toward_ip, "default")
    except Exception as e:
        if note_on is None:
            raise
        note_on.add_note(f"restoring the sender's default qdisc failed too: {e}")
