"""The one description of the emulator's qdiscs, and its two renderers.

A :class:`~bbrlab.scenario.scenario.Link` becomes a :class:`LinkTree`: one :class:`PortTree` per bridge port
of the emulator. Data flows sender -> receiver, so

* the **data port** (the receiver-side port; its egress carries data) gets netem (one-way data
  delay, optional jitter and loss) with a token bucket (tbf: the bottleneck rate and its queue);
* the **ack port** (the sender-side port; its egress carries ACKs) gets netem with the ack-direction
  delay, and nothing at all when that delay is zero (``delay_split="forward"``).

Nesting: netem at the root, tbf as its child (``netem -> tbf``)
--------------------------------------------------------------------
netem keeps every packet in its internal time-sorted queue (tfifo) until the packet's send time;
only then does it hand the packet to its child qdisc. With tbf as that child, tbf's byte ``limit``
counts exactly the packets waiting for the bottleneck, so ``limit = buffer x BDP`` is the router
buffer the paper describes, and tbf drops when it overflows, as a router would.

The other order (tbf root, netem child) does not model a buffer: tbf's limit only sizes tbf's own
default child, which netem replaces, so the bytes that queue for the rate and the bytes that are
merely "on the wire" (delayed) end up in one netem queue, whose limit is in packets. A buffer of
1 BDP could not be expressed, and the delayed bytes would count against it.

netem's own ``limit`` (packets) must never drop. With netem first it holds everything sent during
one one-way delay, and in current kernels (6.1.y stable included) its packet count also includes what
its child holds, i.e. the tbf queue. Both are bounded by the senders' windows. Slow start can overshoot to about
twice what the path holds (BDP + buffer) before the first loss is noticed, so the limit is
:data:`NETEM_LIMIT_HEADROOM` times (BDP + buffer) in full-size packets, and never below netem's
default of 1000. ACKs are smaller but never more numerous than the data packets they acknowledge,
so the same count serves the ack port.

Queue
-----
In bbrlab's tree tbf's ``limit`` is exactly :attr:`~bbrlab.scenario.scenario.Link.queue_limit_bytes`, the buffer as asked; a buffer
below two full-size frames is refused when the ``Link`` is built (:class:`bbrlab.scenario.link.Link`),
never enlarged. What the kernel then holds is read back into every run record
(:func:`bbrlab.link.counters.effective_queue`).

Burst
-----
tbf may send ``burst`` bytes back to back; tokens beyond that are lost. The qdisc watchdog fires
late (softirq scheduling, a busy vCPU under TCG), and whatever arrives during the lateness must fit
in the bucket, or tbf itself becomes the bottleneck below the configured rate. The burst is
therefore ``rate x`` :data:`TBF_BURST_TIME_MS`, one jiffy of Debian's HZ=250 kernels, and at least
:data:`TBF_BURST_MIN_PACKETS` full-size frames, so that low rates still pass a few packets per
wake-up. Measured on the TCG emulator VM at 100 Mbit/s (UDP at the rate, frames through tbf):
2 ms gave 97.2-98.3 Mbit/s, 5 ms 99.2 Mbit/s. tbf splits GRO super-packets that exceed the burst,
so the burst does not need to hold 64 KiB.

Unshaped links
--------------
A :meth:`~bbrlab.scenario.scenario.Link.unshaped` link (no rate) gets netem alone on the data port: the delay (and
loss), no token bucket, so no bottleneck queue of the emulator's making; with no delay at all no qdisc is
set. netem's limit cannot come from the link's BDP then: it is sized for
:data:`UNSHAPED_SIZING_RATE_MBIT` over the RTT, far above what a sender here can send, so that netem
still never drops and whatever limits the transfer is outside the emulator's qdiscs.

The authors' tree (``Link.queue = "authors"``)
------------------------------------------------
The paper authors' emulator script (sys-uos/bbr-cpu-contention, ``measure/setup_emulator.sh``) builds the
other order on BOTH ports: tbf at the root (their rate, ``burst`` = the rate in Mbit/s x 1000 bytes,
``limit`` = the buffer asked, in bytes) with netem as tbf's child (the one-way delay RTT/2 and ``limit
100000`` packets; loss on one port, which bbrlab puts on the data port as in its own tree). bbrlab builds
exactly that, under its own handles (``bb:`` and ``bb1:`` where theirs are ``1:`` and ``10:``). The ack port
gets the same tree with the ACK-direction delay, since their ACKs crossed the same qdiscs (netem with delay
0 under ``delay_split="forward"``; their script always split the RTT). The comment at the top of Linux's
``net/sched/sch_tbf.c`` says that with classful TBF the limit is only passed to the default bfifo child and
is no longer effective once the inner qdisc is changed: tbf never checks its ``limit`` itself. The
bottleneck queue is then netem's 100000 packets, which also hold the packets in the delay line (netem
keeps a packet until its send time, then tbf takes it when tokens allow: the delay and the wait for tokens
overlap, so a standing queue adds to the one-way delay only beyond it). The read-back
(:func:`bbrlab.link.counters.effective_queue`) says which limit was in force.

Jitter: netem sorts its queue by send time, so jitter reorders packets. It is off by default and
is applied to the data direction only. Loss is applied to the data direction only (one bottleneck
with one loss process). Gilbert-Elliott: ``Link.ge_h_pct``/``ge_k_pct`` are h and k (the chance of
*delivering* a packet in the bad and in the good state); netem takes ``1-h`` and ``1-k``.

Renderers: :func:`to_tc_argv` (argument lists for ``tc``, run through :class:`~bbrlab.core.hosts.Host`,
e.g. over SSH into the emulator VM) and :func:`apply_pyroute2` (netlink from this machine, optionally
inside a network namespace). Both read only the tree; neither knows about ``Link``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.scenario.linksizing import NETEM_MIN_LIMIT_PACKETS, U32_MAX
from bbrlab.scenario.scenario import Link

#: Handles of bbrlab's qdiscs ("bb" for bbrlab); a root qdisc with another non-zero handle is not ours.
ROOT_HANDLE = "bb:"
CHILD_HANDLE = "bb1:"
CHILD_PARENT = "bb:1"

Direction = Literal["data", "ack"]


class UnsupportedByRenderer(ValidationError):
    """The tree asks for something a renderer cannot express (checked before anything is applied)."""


class QdiscApplyError(BbrlabError):
    """The kernel refused a qdisc; the port has been put back to its default."""


@dataclass(frozen=True)
class Loss:
    """netem loss: ``uniform`` drops each packet with ``pct``; ``gemodel`` is netem's
    ``loss gemodel p r 1-h 1-k`` (all in percent)."""

    model: Literal["uniform", "gemodel"]
    pct: float = 0.0
    p_pct: float = 0.0
    r_pct: float = 100.0
    one_minus_h_pct: float = 100.0
    one_minus_k_pct: float = 0.0


@dataclass(frozen=True)
class Netem:
    """netem parameters in the kernel's units (microseconds, packets)."""

    delay_us: int
    jitter_us: int = 0
    limit_packets: int = NETEM_MIN_LIMIT_PACKETS
    loss: Loss | None = None
    seed: int | None = None

    kind = "netem"


@dataclass(frozen=True)
class Tbf:
    """Token bucket: ``rate_bit`` bits/s, ``burst_bytes`` bucket size, ``limit_bytes`` queue."""

    rate_bit: int
    burst_bytes: int
    limit_bytes: int

    kind = "tbf"

    @property
    def rate_bytes_per_s(self) -> int:
        """What the kernel stores (and ``tc -j`` reports): bytes per second."""
        return int(round(self.rate_bit / 8))


@dataclass(frozen=True)
class QdiscNode:
    """One qdisc: where it hangs (``parent`` is ``"root"`` or a class like ``"bb:1"``) and what it is."""

    handle: str
    parent: str
    qdisc: Netem | Tbf

    @property
    def kind(self) -> str:
        """The qdisc's kind (``netem``, ``tbf``)."""
        return self.qdisc.kind


@dataclass(frozen=True)
class PortTree:
    """The qdiscs of one emulator port, parents before children. Empty: the port is left alone."""

    ifname: str
    direction: Direction
    nodes: tuple[QdiscNode, ...]

    def find(self, kind: str) -> QdiscNode | None:
        """This port's node of qdisc ``kind``, or None when it has none."""
        return next((n for n in self.nodes if n.kind == kind), None)


@dataclass(frozen=True)
class LinkTree:
    """Both ports of the emulator for one link: ``(ack port, data port)``."""

    ack: PortTree
    data: PortTree

    @property
    def ports(self) -> tuple[PortTree, PortTree]:
        """The two ports' trees, the ACK (sender-side) port first, then the data (receiver-side) port."""
        return (self.ack, self.data)

    @property
    def kinds(self) -> set[str]:
        """Every qdisc kind the tree uses on either port (what the emulator's kernel must offer)."""
        return {n.kind for p in self.ports for n in p.nodes}


# -- building the tree from a Link ---------------------------------------------------------------
def _loss(link: Link) -> Loss | None:
    if link.loss_model == "uniform" and link.loss_pct > 0:
        return Loss("uniform", pct=link.loss_pct)
    if link.loss_model == "gemodel":
        return Loss("gemodel", p_pct=link.ge_p_pct, r_pct=link.ge_r_pct,
                    one_minus_h_pct=100.0 - link.ge_h_pct, one_minus_k_pct=100.0 - link.ge_k_pct)
    return None


def _us(ms: float) -> int:
    return int(round(ms * 1000))


def _tbf(link: Link) -> Tbf:
    """The token bucket of a shaped link: its rate, the tree's burst rule, the buffer asked as its limit."""
    return Tbf(rate_bit=int(round(link.rate_mbit * 1e6)), burst_bytes=link.tbf_burst_bytes(),
               limit_bytes=link.queue_limit_bytes)


def authors_port_tree(link: Link, ifname: str, direction: Direction) -> PortTree:
    """The authors' tree on one port: tbf at the root, netem (that direction's delay, the authors' packet
    limit; jitter, loss and seed on the data port only) as its child."""
    data = direction == "data"
    delay_ms = link.one_way_delays_ms()[0 if data else 1]
    netem = Netem(delay_us=_us(delay_ms), jitter_us=_us(link.jitter_ms) if data else 0,
                  limit_packets=link.netem_limit_packets(), loss=_loss(link) if data else None,
                  seed=link.loss_seed if data else None)
    return PortTree(ifname, direction, (QdiscNode(ROOT_HANDLE, "root", _tbf(link)),
                                        QdiscNode(CHILD_HANDLE, CHILD_PARENT, netem)))


def data_port_tree(link: Link, ifname: str) -> PortTree:
    """netem (delay, jitter, loss) at the root with tbf below it; tbf alone when netem has nothing to do;
    netem alone (or nothing) for an unshaped link; the authors' tree when ``link.queue`` asks for it."""
    if link.queue == "authors":
        return authors_port_tree(link, ifname, "data")
    delay_ms = link.one_way_delays_ms()[0]
    loss = _loss(link)
    needs_netem = delay_ms > 0 or link.jitter_ms > 0 or loss is not None or link.loss_seed is not None
    netem = Netem(delay_us=_us(delay_ms), jitter_us=_us(link.jitter_ms), limit_packets=link.netem_limit_packets(),
                  loss=loss, seed=link.loss_seed) if needs_netem else None
    if not link.shaped:
        return PortTree(ifname, "data", (QdiscNode(ROOT_HANDLE, "root", netem),) if netem else ())
    tbf = _tbf(link)
    if netem is None:
        return PortTree(ifname, "data", (QdiscNode(ROOT_HANDLE, "root", tbf),))
    return PortTree(ifname, "data", (QdiscNode(ROOT_HANDLE, "root", netem),
                                     QdiscNode(CHILD_HANDLE, CHILD_PARENT, tbf)))


def ack_port_tree(link: Link, ifname: str) -> PortTree:
    """netem with the ack-direction delay, or nothing when that delay is zero; the authors' tree when
    ``link.queue`` asks for it."""
    if link.queue == "authors":
        return authors_port_tree(link, ifname, "ack")
    delay_ms = link.one_way_delays_ms()[1]
    if delay_ms <= 0:
        return PortTree(ifname, "ack", ())
    netem = Netem(delay_us=_us(delay_ms), limit_packets=link.netem_limit_packets())
    return PortTree(ifname, "ack", (QdiscNode(ROOT_HANDLE, "root", netem),))


def build_tree(link: Link, ports: tuple[str, str]) -> LinkTree:
    """The qdiscs for ``link`` on the emulator ``ports = (sender_side_ifname, receiver_side_ifname)``."""
    sender_side, receiver_side = ports
    for i, name in enumerate(ports):
        if not isinstance(name, str) or not 1 <= len(name) <= 15 or "/" in name or name.strip() != name:
            raise ValidationError(f"ports[{i}]", name, "an interface name of 1 to 15 characters")
    if sender_side == receiver_side:
        raise ValidationError("ports", ports, "two different interfaces (sender side, receiver side)")
    return LinkTree(ack=ack_port_tree(link, sender_side), data=data_port_tree(link, receiver_side))


# -- renderer 1: tc argument lists -----------------------------------------------------------------
def _fmt(x: float) -> str:
    """A number for tc's percent parser: no exponent, no trailing zeros."""
    return f"{x:.6f}".rstrip("0").rstrip(".") or "0"


def _netem_args(n: Netem) -> list[str]:
    args = ["netem", "limit", str(n.limit_packets), "delay", f"{n.delay_us}us"]
    if n.jitter_us:
        args.append(f"{n.jitter_us}us")
    if n.loss and n.loss.model == "uniform":
        args += ["loss", "random", f"{_fmt(n.loss.pct)}%"]
    elif n.loss and n.loss.model == "gemodel":
        args += ["loss", "gemodel", f"{_fmt(n.loss.p_pct)}%", f"{_fmt(n.loss.r_pct)}%",
                 f"{_fmt(n.loss.one_minus_h_pct)}%", f"{_fmt(n.loss.one_minus_k_pct)}%"]
    if n.seed is not None:
        args += ["seed", str(n.seed)]
    return args


def _tbf_args(t: Tbf) -> list[str]:
    return ["tbf", "rate", f"{t.rate_bit}bit", "burst", f"{t.burst_bytes}b", "limit", f"{t.limit_bytes}b"]


def node_argv(ifname: str, node: QdiscNode) -> list[str]:
    """``tc qdisc add`` for one node."""
    where = ["root"] if node.parent == "root" else ["parent", node.parent]
    body = _netem_args(node.qdisc) if isinstance(node.qdisc, Netem) else _tbf_args(node.qdisc)
    return ["tc", "qdisc", "add", "dev", ifname, *where, "handle", node.handle, *body]


def to_tc_argv(spec: PortTree) -> list[list[str]]:
    """The ``tc`` commands that build ``spec`` on a port whose root qdisc is the kernel's default."""
    return [node_argv(spec.ifname, node) for node in spec.nodes]


def clear_argv(ifname: str) -> list[str]:
    """Remove the root qdisc (and everything below it); the kernel puts its default back."""
    return ["tc", "qdisc", "del", "dev", ifname, "root"]


# -- renderer 2: pyroute2 (netlink from this machine) ----------------------------------------------
def handle_int(handle: str) -> int:
    """tc notation to the kernel's 32-bit handle: ``"bb:"`` -> 0xbb0000, ``"bb:1"`` -> 0xbb0001."""
    major, _, minor = handle.partition(":")
    return (int(major, 16) << 16) | int(minor or "0", 16)


def pyroute2_kwargs(node: QdiscNode) -> dict:
    """Keyword arguments for ``IPRoute.tc("add", kind, index, **kwargs)`` (pyroute2 0.9 units)."""
    q = node.qdisc
    kw: dict = {"handle": handle_int(node.handle)}
    if node.parent != "root":
        kw["parent"] = handle_int(node.parent)
    if isinstance(q, Tbf):
        if q.rate_bytes_per_s > U32_MAX:
            raise UnsupportedByRenderer("tbf.rate_bit", q.rate_bit, "pyroute2's tbf takes at most 34 Gbit/s")
        kw.update(rate=q.rate_bytes_per_s, burst=q.burst_bytes, limit=q.limit_bytes)
        return kw
    if q.loss and q.loss.model == "gemodel":
        raise UnsupportedByRenderer("netem.loss", "gemodel", "pyroute2's netem encodes uniform loss only")
    if q.seed is not None:
        raise UnsupportedByRenderer("netem.seed", q.seed, "pyroute2's netem has no seed attribute")
    kw.update(delay=q.delay_us, jitter=q.jitter_us, limit=q.limit_packets,
              loss=q.loss.pct if q.loss else 0)
    return kw


def apply_pyroute2(spec: PortTree, netns: str | None = None) -> None:
    """Build ``spec`` with netlink on this machine (inside ``netns`` if given).

    Every node's arguments are computed first, so a tree the renderer cannot express is refused
    before the port changes. If the kernel refuses a node (e.g. a kernel without ``sch_netem``),
    the port's root qdisc is removed again, so no half-built tree stays behind.
    """
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    plan = [(node, pyroute2_kwargs(node)) for node in spec.nodes]
    with IPRoute(**({"netns": netns} if netns else {})) as ipr:
        found = ipr.link_lookup(ifname=spec.ifname)
        if not found:
            raise QdiscApplyError(f"no interface {spec.ifname!r}{f' in netns {netns}' if netns else ''}")
        index = found[0]
        for node, kwargs in plan:
            try:
                ipr.tc("add", node.kind, index, **kwargs)
            except NetlinkError as e:
                _remove_root(ipr, index)
                raise QdiscApplyError(_refusal(spec.ifname, node.kind, e.code, str(e))) from e


def clear_pyroute2(ifname: str, netns: str | None = None) -> None:
    """Remove the root qdisc of ``ifname`` on this machine (no error when it is the default already)."""
    from pyroute2 import IPRoute

    with IPRoute(**({"netns": netns} if netns else {})) as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if found:
            _remove_root(ipr, found[0])


def _remove_root(ipr, index: int) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipr.tc("del", index=index, handle=0, parent=0xFFFFFFFF)
    except NetlinkError:
        pass  # nothing but the kernel's default was there


def _refusal(ifname: str, kind: str, errno_code: int, detail: str) -> str:
    """A message that says what is missing; the typical case is a host kernel without netem."""
    import errno

    if errno_code == errno.ENOENT:
        hint = (f"this kernel has no sch_{kind}" +
                (": run the emulation on the emulator VM (a kernel with netem), not on this host"
                 if kind == "netem" else ""))
    else:
        hint = detail
    return f"the kernel refused qdisc {kind} on {ifname}: {hint}; the port was put back to its default"
