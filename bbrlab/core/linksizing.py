"""How large the emulator's queues and token bucket are for a link, and whether the kernel's fields
can hold them.

The reasons for each size (netem's limit never drops; the bucket covers a late watchdog; unshaped links
are sized for a rate far above what a sender here reaches) are told in :mod:`bbrlab.link.qdisc`, which
builds the qdiscs from these numbers. They live apart from it so that
:class:`~bbrlab.core.scenario.Link` can refuse, when it is made, a link whose queues the kernel could not
hold, without importing the qdisc builder (which builds on ``Link``).

Two queue trees (``Link.queue``): ``bbrlab`` (netem -> tbf; tbf's byte limit is the bottleneck queue) and
``authors`` (tbf -> netem, as the paper authors' emulator script builds it: their burst rule, and netem's
packet limit of :data:`AUTHORS_NETEM_LIMIT_PACKETS`, which is then the queue; docs/link.md).

Takes any object with a link's fields (``rtt_ms``, ``rate_mbit``, ``mtu_bytes``, ``shaped``,
``bdp_bytes``, ``frame_bytes``, ``min_queue_bytes``, ``queue_limit_bytes``, ``buffer_bdp``, ``buffer_bytes``,
``queue``); imports nothing of bbrlab but its errors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .errors import ValidationError

if TYPE_CHECKING:
    from .scenario import Link

#: Bytes a full-size frame takes in the bottleneck queue: the IP MTU plus the Ethernet header (tbf's bfifo
#: counts every frame with its Ethernet header).
ETHERNET_HEADER_BYTES = 14
#: The smallest bottleneck queue, in full-size frames. tbf drops every frame that does not fit in its queue
#: (it cannot send a frame it could not queue first), so a queue below one frame passes nothing and one frame
#: is a link that drops whenever two packets meet; bbrlab asks for room for two.
MIN_QUEUE_FRAMES = 2
#: The largest buffer in BDP bbrlab sets in any case; larger ones up to the authors' queue are allowed too
#: (:func:`max_buffer_bdp`).
MAX_BUFFER_BDP = 1000
#: tbf's limit is a 32-bit count of bytes.
MAX_QUEUE_BYTES = 2**32 - 1
#: The queue trees (``Link.queue``): bbrlab's netem -> tbf, and the authors' tbf -> netem.
QUEUE_MODES = ("bbrlab", "authors")
#: Whose limit is the bottleneck queue in each tree: tbf's bytes, or netem's packets.
LIMIT_IN_FORCE = {"bbrlab": "tbf", "authors": "netem"}
#: The authors' emulator script (sys-uos/bbr-cpu-contention, measure/setup_emulator.sh) gives netem
#: ``limit 100000`` (packets) under a tbf root, on both ports.
AUTHORS_NETEM_LIMIT_PACKETS = 100_000
#: Their tbf burst: the rate in Mbit/s x 1000, in bytes (8 ms at the rate; 100000 bytes at 100 Mbit/s).
AUTHORS_BURST_BYTES_PER_MBIT = 1000
NETEM_MIN_LIMIT_PACKETS = 1000
NETEM_LIMIT_HEADROOM = 4
TBF_BURST_TIME_MS = 4.0
TBF_BURST_MIN_PACKETS = 10
#: The rate an unshaped link's netem queue is sized for (its packet limit; memory is used only when filled).
UNSHAPED_SIZING_RATE_MBIT = 10_000.0
#: tbf's netlink rate field without the 64-bit extension is 32-bit bytes/s (about 34 Gbit/s).
U32_MAX = 2**32 - 1
#: tc converts tbf's burst into the time it takes at the rate, as a 32-bit count of psched ticks;
#: /proc/net/psched gives 1000/64 ticks per microsecond, so that time must stay below about 274.9 s.
PSCHED_TICKS_PER_US = 1000 / 64
TBF_MAX_BURST_TIME_S = U32_MAX / PSCHED_TICKS_PER_US / 1e6


def netem_limit_packets(link: Link) -> int:
    """netem's queue in packets: in bbrlab's tree large enough never to drop (see the module docstring); in
    the authors' tree their fixed :data:`AUTHORS_NETEM_LIMIT_PACKETS`, which is then the bottleneck queue."""
    if link.queue == "authors":
        return AUTHORS_NETEM_LIMIT_PACKETS
    if not link.shaped:
        sized_bytes = UNSHAPED_SIZING_RATE_MBIT * 1e6 / 8 * link.rtt_ms / 1e3
        return max(NETEM_MIN_LIMIT_PACKETS, math.ceil(NETEM_LIMIT_HEADROOM * sized_bytes / link.mtu_bytes))
    full_packets = (link.bdp_bytes + link.queue_limit_bytes) / link.mtu_bytes
    return max(NETEM_MIN_LIMIT_PACKETS, math.ceil(NETEM_LIMIT_HEADROOM * full_packets))


def authors_burst_bytes(rate_mbit: float) -> int:
    """The authors' tbf burst in bytes: the rate in Mbit/s x 1000, truncated to whole bytes as their
    script's integer arithmetic does."""
    return int(math.floor(rate_mbit * AUTHORS_BURST_BYTES_PER_MBIT + 1e-9))


def tbf_burst_bytes(link: Link) -> int:
    """Bucket size: ``rate x TBF_BURST_TIME_MS``, at least ``TBF_BURST_MIN_PACKETS`` full frames; in the
    authors' tree their rule (:func:`authors_burst_bytes`)."""
    if link.queue == "authors":
        return authors_burst_bytes(link.rate_mbit)
    by_time = link.rate_mbit * 1e6 / 8 * TBF_BURST_TIME_MS / 1e3
    by_packets = TBF_BURST_MIN_PACKETS * link.frame_bytes
    return int(math.ceil(max(by_time, by_packets)))


def authors_queue_bytes(frame_bytes: int) -> int:
    """The authors' queue in bytes at full-size frames: :data:`AUTHORS_NETEM_LIMIT_PACKETS` x ``frame_bytes``
    (an approximation: netem counts packets, whatever their size)."""
    return AUTHORS_NETEM_LIMIT_PACKETS * frame_bytes


def max_buffer_bdp(link: Link) -> float:
    """The largest buffer in BDP bbrlab sets at ``link``'s rate x RTT: :data:`MAX_BUFFER_BDP`, or up to the
    authors' queue at full-size frames (:func:`authors_queue_bytes`) where that is more (tbf's 32-bit byte
    count is checked apart, :func:`check_kernel_limits`). :data:`MAX_BUFFER_BDP` when the BDP is 0 bytes."""
    bdp = link.bdp_bytes
    if not bdp:
        return float(MAX_BUFFER_BDP)
    return max(float(MAX_BUFFER_BDP), math.floor(authors_queue_bytes(link.frame_bytes) / bdp * 1e4) / 1e4)


def check_buffer_ceiling(link: Link) -> None:
    """Raise :class:`ValidationError` unless ``0 < link.buffer_bdp <=`` :func:`max_buffer_bdp` (or it is None)."""
    if link.buffer_bdp is None or 0 < link.buffer_bdp <= max_buffer_bdp(link):
        return
    raise ValidationError(
        "link.buffer_bdp", link.buffer_bdp,
        f"0 < buffer_bdp <= {max_buffer_bdp(link):g} BDP at {link.rate_mbit:g} Mbit/s x {link.rtt_ms:g} ms: "
        f"{MAX_BUFFER_BDP} BDP, or up to the authors' queue ({AUTHORS_NETEM_LIMIT_PACKETS} full-size frames of "
        f"{link.frame_bytes} bytes = {authors_queue_bytes(link.frame_bytes)} bytes) where that is more")


def check_authors_burst(link: Link) -> None:
    """The authors' tree needs a burst of at least one full-size frame: tbf drops a frame larger than its
    bucket (unless it is a GSO aggregate, which it splits), so below that rate no full-size frame passes."""
    if link.queue != "authors" or authors_burst_bytes(link.rate_mbit) >= link.frame_bytes:
        return
    min_rate = link.frame_bytes / AUTHORS_BURST_BYTES_PER_MBIT
    raise ValidationError(
        "link.rate_mbit", link.rate_mbit,
        f"at least {min_rate:g} Mbit/s with queue authors: its tbf burst (rate in Mbit/s x "
        f"{AUTHORS_BURST_BYTES_PER_MBIT} bytes) must hold one full-size frame of {link.frame_bytes} bytes "
        "(or use queue bbrlab)")


def check_kernel_limits(link: Link) -> None:
    """Raise :class:`ValidationError` when ``link``'s qdiscs would not fit the kernel's fields: tbf's
    ``limit`` and ``burst`` are 32-bit byte counts, its burst time a 32-bit tick count, netem's ``limit``
    a 32-bit packet count. Computed from the same functions that build the tree."""
    if netem_limit_packets(link) > U32_MAX:
        raise ValidationError("link.rtt_ms" if not link.shaped else "link.buffer_bdp",
                              link.rtt_ms if not link.shaped else link.buffer_bdp,
                              f"a path of at most {U32_MAX} packets in netem's queue (a 32-bit count)")
    if not link.shaped:
        return  # no token bucket
    queue = link.queue_limit_bytes
    if queue > U32_MAX:
        field = "link.buffer_bdp" if link.buffer_bytes is None else "link.buffer_bytes"
        raise ValidationError(
            field, link.buffer_bdp if link.buffer_bytes is None else link.buffer_bytes,
            f"a queue of at most {U32_MAX} bytes (tbf's limit is a 32-bit byte count); {link.rate_mbit:g} Mbit/s x "
            f"{link.rtt_ms:g} ms x {link.buffer_bdp} BDP gives {queue} bytes")
    check_authors_burst(link)
    burst = tbf_burst_bytes(link)
    burst_time_s = burst * 8 / (link.rate_mbit * 1e6)
    if burst > U32_MAX or burst_time_s > TBF_MAX_BURST_TIME_S:
        min_rate_mbit = burst * 8 / TBF_MAX_BURST_TIME_S / 1e6
        raise ValidationError(
            "link.rate_mbit", link.rate_mbit,
            f"at least {min_rate_mbit:.6g} Mbit/s with an MTU of {link.mtu_bytes} bytes: tbf's bucket of {burst} bytes "
            f"must drain within {TBF_MAX_BURST_TIME_S:.1f} s (a 32-bit count of psched ticks)")


# -- the smallest queue --------------------------------------------------------------------------------
class BufferBelowMinimum(ValidationError):
    """The bottleneck queue a link asks for is smaller than ``Link.min_queue_bytes`` (for its rate x RTT)."""


def _round_up(x: float, digits: int = 4) -> float:
    """``x`` rounded up to ``digits`` significant digits (so that the value a message suggests is accepted)."""
    if x <= 0:
        return 0.0
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale - 1e-9) / scale


def buffer_bdp_range(link: Link) -> tuple[float, float] | None:
    """``(lowest, highest)`` buffer in BDP that ``link``'s rate x RTT allows: at least two full-size frames,
    at most :func:`max_buffer_bdp` and tbf's 32-bit byte count. None when no BDP multiple is possible (a 0-byte
    BDP at RTT 0, or a BDP so small that the floor is above the largest multiple)."""
    bdp = link.bdp_bytes
    if not bdp:
        return None
    lowest = _round_up((link.min_queue_bytes - 0.5) / bdp)
    highest = min(max_buffer_bdp(link), math.floor(MAX_QUEUE_BYTES / bdp * 1e4) / 1e4)
    return (lowest, highest) if lowest <= highest else None


def check_queue_floor(link: Link) -> None:
    """Raise :class:`BufferBelowMinimum` when ``link``'s bottleneck queue is below two full-size frames,
    naming the buffer field and the range allowed at its rate x RTT."""
    if not link.shaped or link.queue_limit_bytes >= link.min_queue_bytes:
        return
    floor = (f"the bottleneck queue must hold {MIN_QUEUE_FRAMES} full-size frames of {link.frame_bytes} bytes "
             f"(MTU {link.mtu_bytes} + Ethernet header), i.e. at least {link.min_queue_bytes} bytes; tbf drops a "
             "frame that does not fit")
    where = f"at {link.rate_mbit:g} Mbit/s x {link.rtt_ms:g} ms (BDP {link.bdp_bytes} bytes)"
    if link.buffer_bytes is not None:
        raise BufferBelowMinimum("link.buffer_bytes", link.buffer_bytes,
                                 f"{link.min_queue_bytes} <= buffer_bytes <= {MAX_QUEUE_BYTES}: {floor}")
    span = buffer_bdp_range(link)
    if span is None:
        raise BufferBelowMinimum("link.buffer_bdp", link.buffer_bdp,
                                 f"no buffer in BDP {where}: give the buffer in bytes instead "
                                 f"(buffer_bytes >= {link.min_queue_bytes}); {floor}")
    raise BufferBelowMinimum("link.buffer_bdp", link.buffer_bdp,
                             f"{span[0]:g} <= buffer_bdp <= {span[1]:g} BDP {where}: {floor} "
                             f"({link.buffer_bdp:g} BDP is {link.queue_limit_bytes} bytes)")
