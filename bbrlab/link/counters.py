"""What one run did to the emulated link, counted from two read-backs of the emulator's qdiscs: the per-run
change of bbrlab's qdisc counters, what netem itself dropped, and the bottleneck queue the kernel held (which
tree and whose limit was in force: :mod:`bbrlab.link.bottleneck`), with the emulator ports' offloads. A run
record keeps them as ``metadata.link`` (:class:`LinkRecord`, docs/run-record.md).

``ports = (sender_side, receiver_side)`` everywhere: the receiver side carries the data, the sender side the
ACKs. ``to_dict`` gives the record's JSON (keys in the order records have always had them) and ``from_dict``
reads it back; the counters, whose JSON is their fields, are written and read by :mod:`bbrlab.core.recordjson`. What records made before a field existed lack stays absent (None here), so every committed
record reads and writes back byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bbrlab.core import recordjson
from bbrlab.scenario.linksizing import LIMIT_IN_FORCE
from bbrlab.scenario.scenario import Link

from .bottleneck import of_kind, queue_mode_of
from .emulator import Readback, is_ours
from .offloads import Offloads

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


@dataclass(frozen=True)
class NetemLoss:
    """What netem dropped itself on the data port: the packets that reached it (``entered``; None when the
    data port has no netem), those it dropped (``netem_dropped``), their ``fraction``, and the fraction the
    link configured (``configured_fraction``, once judged: :func:`bbrlab.run.checks.drops_as_configured`).

    In the authors' tree (tbf -> netem) netem's drops are its loss AND its queue's overflow, the bottleneck's
    drop there, which the counters cannot tell apart: ``includes_overflow`` is then True and ``tbf_dropped`` the
    frames tbf refused by itself; both are absent from the record of bbrlab's tree."""

    entered: int | None
    netem_dropped: int
    fraction: float | None
    configured_fraction: float | None = None
    includes_overflow: bool = False
    tbf_dropped: int | None = None

    def to_dict(self) -> dict:
        """The record's JSON (``includes_overflow`` and ``tbf_dropped`` in the authors' tree only,
        ``configured_fraction`` once judged)."""
        d: dict = {"entered": self.entered, "netem_dropped": self.netem_dropped}
        if self.includes_overflow:
            d.update(includes_overflow=True, tbf_dropped=self.tbf_dropped)
        d["fraction"] = self.fraction
        if self.configured_fraction is not None:
            d["configured_fraction"] = self.configured_fraction
        return d

    @classmethod
    def from_dict(cls, d: dict) -> NetemLoss:
        """The loss read from a record's ``metadata.link.loss``."""
        return cls(d["entered"], d["netem_dropped"], d["fraction"], d.get("configured_fraction"),
                   bool(d.get("includes_overflow", False)), d.get("tbf_dropped"))


@dataclass(frozen=True)
class QueueInForce:
    """Which tree the data port carried and whose limit was the bottleneck queue, as read back
    (:mod:`bbrlab.link.bottleneck`): ``queue_mode`` (``bbrlab``/``authors``), ``limit_in_force`` (``tbf``: bytes;
    ``netem``: packets), ``queue_packets`` (netem's limit in the authors' tree, else None), ``queue_bytes_basis``
    (how :attr:`QueueHeld.queue_bytes` was had) and ``tbf_limit_bytes`` (tbf's configured limit, in force or
    not). Every value None without a token bucket."""

    queue_mode: str | None
    limit_in_force: str | None
    queue_packets: int | None
    queue_bytes_basis: str | None
    tbf_limit_bytes: int | None


@dataclass(frozen=True)
class QueueHeld:
    """The bottleneck queue the kernel holds: ``queue_bytes`` (tbf's ``limit`` in bbrlab's tree; in the authors'
    tree netem's packet limit x full-size frames) and that over the link's BDP (``queue_bdp``, 6 decimals); each
    None when there is no token bucket (resp. the BDP is 0). ``in_force`` says which tree and limit that was
    (None in records made before it was recorded: they hold ``queue_bytes`` and ``queue_bdp`` alone)."""

    queue_bytes: int | None
    queue_bdp: float | None
    in_force: QueueInForce | None = None

    def to_dict(self) -> dict:
        """The record's JSON (inline in ``metadata.link``): ``queue_bytes`` and ``queue_bdp``, and with
        ``in_force`` its keys around them in the order run records have them."""
        if self.in_force is None:
            return {"queue_bytes": self.queue_bytes, "queue_bdp": self.queue_bdp}
        f = self.in_force
        return {"queue_mode": f.queue_mode, "limit_in_force": f.limit_in_force, "queue_bytes": self.queue_bytes,
                "queue_packets": f.queue_packets, "queue_bytes_basis": f.queue_bytes_basis,
                "tbf_limit_bytes": f.tbf_limit_bytes, "queue_bdp": self.queue_bdp}

    @classmethod
    def from_dict(cls, d: dict) -> QueueHeld:
        """The queue read from a record's ``metadata.link`` (whose other keys it ignores)."""
        in_force = QueueInForce(d["queue_mode"], d["limit_in_force"], d["queue_packets"], d["queue_bytes_basis"],
                                d["tbf_limit_bytes"]) if "queue_mode" in d else None
        return cls(d["queue_bytes"], d["queue_bdp"], in_force)


@dataclass
class LinkRecord:
    """``metadata.link`` of a run record: the run's ``counters``, the ``queue`` held (None in records made before
    it was recorded), the emulator ports' ``offloads`` as read back when the link was set (None in records made
    before they were recorded) and the ``loss`` netem applied (None until judged: a run that failed that check
    has none)."""

    counters: LinkCounters
    queue: QueueHeld | None = None
    loss: NetemLoss | None = None
    offloads: Offloads | None = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Where nested in a typed record, read and written by :meth:`from_dict` and :meth:`to_dict`
        (:func:`bbrlab.core.recordjson.own_layout`)."""
        from bbrlab.core.recordjson import own_layout

        return own_layout(cls)

    def to_dict(self) -> dict:
        """The record's JSON: ``counters``, then the queue's keys, then ``emulator_offloads``, then ``loss``."""
        d: dict = {"counters": recordjson.to_json(self.counters)}
        if self.queue is not None:
            d.update(self.queue.to_dict())
        if self.offloads is not None:
            d["emulator_offloads"] = self.offloads.to_dict()
        if self.loss is not None:
            d["loss"] = self.loss.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LinkRecord:
        """A run record's ``metadata.link``."""
        queue = QueueHeld.from_dict(d) if "queue_bytes" in d else None
        loss, offloads = d.get("loss"), d.get("emulator_offloads")
        return cls(recordjson.from_json(LinkCounters, d["counters"]), queue,
                   NetemLoss.from_dict(loss) if loss is not None else None,
                   Offloads.from_dict(offloads) if offloads is not None else None)


def counters(readbacks: Readback, ports: Sequence[str]) -> LinkCounters:
    """The counters of bbrlab's qdiscs (its root and the qdiscs under it) in a read-back of ``ports``."""
    def role(ifname: str) -> dict[str, QdiscCounters]:
        return {q.get("kind"): QdiscCounters(*(int(q.get(k) or 0) for k in COUNTER_KEYS))
                for q in readbacks.get(ifname, []) if is_ours(q) or str(q.get("parent", "")).startswith("bb")}

    sender_side, receiver_side = ports
    return LinkCounters(ack=role(sender_side), data=role(receiver_side))


def loss_observed(delta: LinkCounters, queue: str = "bbrlab") -> NetemLoss:
    """What netem dropped on the data port over ``delta``, separated from the bottleneck's drops where the tree
    allows.

    bbrlab's tree (``queue="bbrlab"``, netem -> tbf): netem counts as its own drops the packets it loses on
    purpose, its own overflow and what its child (tbf) refuses; so netem's own are its drops less tbf's, and the
    packets that reached netem are what left the tree plus every drop.

    The authors' tree (``queue="authors"``, tbf -> netem): netem's drops are its loss AND its queue's
    overflow, which is the bottleneck's drop there; the counters cannot tell them apart
    (``includes_overflow``). tbf counts netem's drops as its own too; what it dropped by itself (frames
    larger than its bucket) is ``tbf_dropped``.
    """
    netem = delta.data.get("netem")
    if netem is None:
        return NetemLoss(None, 0, None)
    tbf = delta.data.get("tbf")
    tbf_drops = tbf.drops if tbf is not None else 0
    entered = netem.packets + netem.drops
    if queue == "authors":
        return NetemLoss(entered, netem.drops, netem.drops / entered if entered else None,
                         includes_overflow=True, tbf_dropped=tbf_drops - netem.drops)
    dropped = netem.drops - tbf_drops
    return NetemLoss(entered, dropped, dropped / entered if entered else None)


def effective_queue(readbacks: Readback, ports: Sequence[str], link: Link) -> QueueHeld:
    """The bottleneck queue the kernel holds, from a read-back of ``ports = (sender_side, receiver_side)``.

    Which tree the data port carries (:func:`bbrlab.link.bottleneck.queue_mode_of`) says whose limit is in
    force: tbf's bytes in bbrlab's tree; netem's packets in the authors' tree, whose ``queue_bytes`` is then
    that x ``link.frame_bytes`` (see ``queue_bytes_basis``). ``queue_bdp`` is ``queue_bytes`` over ``link``'s BDP
    (6 decimals). Every value None when the data port has no token bucket (and ``queue_bdp`` when the BDP is 0
    bytes). Every run record keeps it (``metadata.link``), and the tables' buffer columns come from it."""
    qdiscs = readbacks.get(ports[1], [])
    mode = queue_mode_of(qdiscs)
    tbf = of_kind(qdiscs, "tbf")
    tbf_limit = (tbf.get("options") or {}).get("limit") if tbf else None
    queue_bytes, packets, basis = tbf_limit, None, "tbf's byte limit" if mode else None
    if mode == "authors":
        packets = (of_kind(qdiscs, "netem").get("options") or {}).get("limit")
        queue_bytes = packets * link.frame_bytes if packets is not None else None
        basis = (f"netem's packet limit x {link.frame_bytes}-byte full-size frames "
                 "(approximate: netem counts packets of any size)")
    bdp = link.bdp_bytes
    return QueueHeld(queue_bytes, round(queue_bytes / bdp, 6) if queue_bytes is not None and bdp else None,
                     QueueInForce(mode, LIMIT_IN_FORCE.get(mode), packets, basis, tbf_limit))
