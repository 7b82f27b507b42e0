"""Which bottleneck queue the emulator's kernel holds, read from its qdisc read-back.

bbrlab builds one of two trees on the data port (:mod:`bbrlab.link.qdisc`):

* ``bbrlab``: netem at the root, tbf as its child. tbf's byte ``limit`` is the bottleneck queue (netem's
  packet limit is sized never to drop). A tbf alone (no delay, no loss) is the same queue.
* ``authors``: tbf at the root, netem as its child, as the paper authors' emulator script builds it. tbf
  does not check its ``limit`` itself: it only sizes the default bfifo child, which netem replaced (the
  comment at the top of Linux's ``net/sched/sch_tbf.c``). The queue is netem's packet limit.

Which tree a port carries is read from the kernel's answer (which qdisc is the root, what hangs below it),
not taken from the request (:func:`queue_mode_of`); a run whose read-back differs from its request fails
anyway (:func:`bbrlab.link.emulator.check_readback`). :func:`bbrlab.link.counters.effective_queue` gives every
run record the queue that was in force, in bytes and in BDP, and for the authors' tree also in packets: its
bytes are then netem's packets x full-size frames (MTU + Ethernet header), an approximation, since netem
counts packets of any size (with GRO on, aggregates of many frames). :func:`configured_from_readback`
recovers the link's values from a read-back.
"""

from __future__ import annotations

from collections.abc import Sequence

from bbrlab.core.errors import TestbedError

#: A read-back of the emulator's ports: ``{ifname: [qdisc, ...]}``, each qdisc as ``tc -raw -j -s qdisc show``
#: reports it (kind, handle, parent, options, counters), kept verbatim in every run record (``metadata.qdiscs``).
Readback = dict[str, list[dict]]


def of_kind(qdiscs: list[dict], kind: str) -> dict | None:
    """The first qdisc of ``kind`` (``tbf``, ``netem``) in one port's read-back, None when there is none."""
    return next((q for q in qdiscs if q.get("kind") == kind), None)


def queue_mode_of(qdiscs: list[dict]) -> str | None:
    """The tree on one port's read-back: ``authors`` when the root is a tbf with a netem below it,
    ``bbrlab`` for any other tree with a tbf (netem root with tbf below, or tbf alone), None without a tbf."""
    tbf, netem = of_kind(qdiscs, "tbf"), of_kind(qdiscs, "netem")
    if tbf is None:
        return None
    if tbf.get("root") and netem is not None and not netem.get("root"):
        return "authors"
    return "bbrlab"


def configured_from_readback(readbacks: Readback, ports: Sequence[str]) -> dict:
    """``{"rtt_ms", "rate_mbit", "queue_bytes", "loss_pct", "queue"}`` as the kernel holds them on ``ports``.

    The RTT is the sum of both netem delays; the rate and tbf's limit (``queue_bytes``, in force or not) come
    from the data port's tbf, ``queue`` is its tree (:func:`queue_mode_of`).
    """
    sender_side, receiver_side = ports
    out: dict = {"rtt_ms": 0.0, "rate_mbit": None, "queue_bytes": None, "loss_pct": 0.0}
    for ifname in (sender_side, receiver_side):
        for q in readbacks.get(ifname, []):
            opts = q.get("options") or {}
            if q.get("kind") == "netem":
                out["rtt_ms"] += (opts.get("delay") or {}).get("delay", 0.0) * 1e3
                if ifname == receiver_side:
                    out["loss_pct"] = (opts.get("loss-random") or {}).get("loss", 0.0) * 100
            elif q.get("kind") == "tbf" and ifname == receiver_side:
                out["rate_mbit"] = opts.get("rate", 0) * 8 / 1e6
                out["queue_bytes"] = opts.get("limit")
    if out["rate_mbit"] is None:
        raise TestbedError(f"no bbrlab token bucket on {receiver_side}: set a link first (bbrlab link set)")
    out["rtt_ms"] = round(out["rtt_ms"], 3)
    out["queue"] = queue_mode_of(readbacks.get(receiver_side, []))
    return out
