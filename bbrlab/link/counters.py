"""What one run did to the emulated link, counted from two read-backs of the emulator's qdiscs: the per-run
change of bbrlab's qdisc counters, what netem itself dropped, and the bottleneck queue the kernel held. A run
record keeps them as ``metadata.link`` (:class:`LinkRecord`, docs/run-record.md).

``ports = (sender_side, receiver_side)`` everywhere: the receiver side carries the data, the sender side the
ACKs. ``to_dict`` gives the record's JSON (keys in the order records have always had them) and ``from_dict``
reads it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from bbrlab.core.scenario import Link

from .emulator import Readback, is_ours

#: The counters kept of each qdisc; ``backlog`` is a level (bytes queued now), the others grow.
COUNTER_KEYS = ("packets", "bytes", "drops", "backlog")


@dataclass(frozen=True)
class QdiscCounters:
    """One qdisc's counters: packets and bytes it passed, packets it dropped, bytes queued (a level)."""

    packets: int
    bytes: int
    drops: int
    backlog: int

    def minus(self, before: QdiscCounters | None) -> QdiscCounters:
        """The change since ``before`` (None: since zero); ``backlog`` stays the level now."""
        if before is None:
            return self
        return QdiscCounters(self.packets - before.packets, self.bytes - before.bytes, self.drops - before.drops,
                             self.backlog)

    def to_dict(self) -> dict:
        """The record's JSON of these counters."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> QdiscCounters:
        """Counters read from a record."""
        return cls(*(d[k] for k in COUNTER_KEYS))


@dataclass(frozen=True)
class LinkCounters:
    """bbrlab's qdiscs on the ACK port (``ack``) and the data port (``data``), each by kind (netem, tbf)."""

    ack: dict[str, QdiscCounters]
    data: dict[str, QdiscCounters]

    def minus(self, before: LinkCounters) -> LinkCounters:
        """The change since ``before`` of every qdisc present now (a qdisc new since then counts from zero)."""
        def role(now: dict[str, QdiscCounters], then: dict[str, QdiscCounters]) -> dict[str, QdiscCounters]:
            return {kind: c.minus(then.get(kind)) for kind, c in now.items()}

        return LinkCounters(role(self.ack, before.ack), role(self.data, before.data))

    def to_dict(self) -> dict:
        """The record's JSON: ``{"ack"|"data": {kind: counters}}``."""
        return {"ack": {k: c.to_dict() for k, c in self.ack.items()},
                "data": {k: c.to_dict() for k, c in self.data.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> LinkCounters:
        """Counters read from a record's ``metadata.link.counters``."""
        return cls({k: QdiscCounters.from_dict(c) for k, c in d["ack"].items()},
                   {k: QdiscCounters.from_dict(c) for k, c in d["data"].items()})


@dataclass(frozen=True)
class NetemLoss:
    """What netem dropped itself on the data port: the packets that reached it (``entered``; None when the
    data port has no netem), those it dropped (``netem_dropped``), their ``fraction``, and the fraction the
    link configured (``configured_fraction``, once judged: :func:`bbrlab.run.checks.drops_as_configured`)."""

    entered: int | None
    netem_dropped: int
    fraction: float | None
    configured_fraction: float | None = None

    def to_dict(self) -> dict:
        """The record's JSON (``configured_fraction`` once judged)."""
        d = {"entered": self.entered, "netem_dropped": self.netem_dropped, "fraction": self.fraction}
        if self.configured_fraction is not None:
            d["configured_fraction"] = self.configured_fraction
        return d

    @classmethod
    def from_dict(cls, d: dict) -> NetemLoss:
        """The loss read from a record's ``metadata.link.loss``."""
        return cls(d["entered"], d["netem_dropped"], d["fraction"], d.get("configured_fraction"))


@dataclass(frozen=True)
class QueueHeld:
    """The bottleneck queue the kernel holds: the data port's tbf ``limit`` (``queue_bytes``) and that over the
    link's BDP (``queue_bdp``, 6 decimals); each None when there is no token bucket (resp. the BDP is 0)."""

    queue_bytes: int | None
    queue_bdp: float | None

    def to_dict(self) -> dict:
        """The record's JSON (inline in ``metadata.link``)."""
        return asdict(self)


@dataclass
class LinkRecord:
    """``metadata.link`` of a run record: the run's ``counters``, the ``queue`` held (None in records made before
    it was recorded) and the ``loss`` netem applied (None until judged: a run that failed that check has none)."""

    counters: LinkCounters
    queue: QueueHeld | None = None
    loss: NetemLoss | None = None

    def to_dict(self) -> dict:
        """The record's JSON: ``counters``, then ``queue_bytes`` and ``queue_bdp``, then ``loss``."""
        d: dict = {"counters": self.counters.to_dict()}
        if self.queue is not None:
            d.update(self.queue.to_dict())
        if self.loss is not None:
            d["loss"] = self.loss.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LinkRecord:
        """A run record's ``metadata.link``."""
        queue = QueueHeld(d["queue_bytes"], d["queue_bdp"]) if "queue_bytes" in d else None
        loss = d.get("loss")
        return cls(LinkCounters.from_dict(d["counters"]), queue, NetemLoss.from_dict(loss) if loss is not None else None)


def counters(readbacks: Readback, ports: Sequence[str]) -> LinkCounters:
    """The counters of bbrlab's qdiscs (its root and the qdiscs under it) in a read-back of ``ports``."""
    def role(ifname: str) -> dict[str, QdiscCounters]:
        return {q.get("kind"): QdiscCounters(*(int(q.get(k) or 0) for k in COUNTER_KEYS))
                for q in readbacks.get(ifname, []) if is_ours(q) or str(q.get("parent", "")).startswith("bb")}

    sender_side, receiver_side = ports
    return LinkCounters(ack=role(sender_side), data=role(receiver_side))


def loss_observed(delta: LinkCounters) -> NetemLoss:
    """What netem dropped on the data port over ``delta``, separated from the bottleneck's (tbf's) drops.

    netem counts as its own drops the packets it loses on purpose, its own overflow and what its child
    (tbf) refuses; the packets that reached netem are what left the tree plus every drop.
    """
    netem = delta.data.get("netem")
    if netem is None:
        return NetemLoss(None, 0, None)
    tbf = delta.data.get("tbf")
    dropped = netem.drops - (tbf.drops if tbf is not None else 0)
    entered = netem.packets + netem.drops
    return NetemLoss(entered, dropped, dropped / entered if entered else None)


def effective_queue(readbacks: Readback, ports: Sequence[str], link: Link) -> QueueHeld:
    """The bottleneck queue the kernel holds, from a read-back of ``ports``: the data port's tbf limit, and that
    over ``link``'s BDP. Every run record keeps it (``metadata.link``); the tables' buffer columns come from it."""
    tbf = next((q for q in readbacks.get(ports[1], []) if q.get("kind") == "tbf"), None)
    limit = (tbf.get("options") or {}).get("limit") if tbf else None
    bdp = link.bdp_bytes
    return QueueHeld(limit, round(limit / bdp, 6) if limit is not None and bdp else None)
