"""The numbers behind the emulator's queues and token bucket: the constants of both queue trees and the
sizes that take plain numbers. :class:`~bbrlab.scenario.link.Link` computes a link's sizes from them and refuses,
when it is made, a link whose queues the kernel could not hold.

The reasons for each size (netem's limit never drops; the bucket covers a late watchdog; unshaped links
are sized for a rate far above what a sender here reaches) are told in :mod:`bbrlab.link.qdisc`, which
builds the qdiscs from these numbers.

Two queue trees (``Link.queue``): ``bbrlab`` (netem -> tbf; tbf's byte limit is the bottleneck queue) and
``authors`` (tbf -> netem, as the paper authors' emulator script builds it: their burst rule, and netem's
packet limit of :data:`AUTHORS_NETEM_LIMIT_PACKETS`, which is then the queue; docs/link.md).
Imports nothing of bbrlab but its errors.
"""

from __future__ import annotations

import math

from bbrlab.core.errors import ValidationError

#: Bytes a full-size frame takes in the bottleneck queue: the IP MTU plus the Ethernet header (tbf's bfifo
#: counts every frame with its Ethernet header).
ETHERNET_HEADER_BYTES = 14
#: The smallest bottleneck queue, in full-size frames. tbf drops every frame that does not fit in its queue
#: (it cannot send a frame it could not queue first), so a queue below one frame passes nothing and one frame
#: is a link that drops whenever two packets meet; bbrlab asks for room for two.
MIN_QUEUE_FRAMES = 2
#: The largest buffer in BDP bbrlab sets in any case; larger ones up to the authors' queue are allowed too
#: (:meth:`~bbrlab.scenario.link.Link.max_buffer_bdp`).
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


def authors_burst_bytes(rate_mbit: float) -> int:
    """The authors' tbf burst in bytes: the rate in Mbit/s x 1000, truncated to whole bytes as their
    script's integer arithmetic does."""
    return int(math.floor(rate_mbit * AUTHORS_BURST_BYTES_PER_MBIT + 1e-9))


def authors_queue_bytes(frame_bytes: int) -> int:
    """The authors' queue in bytes at full-size frames: :data:`AUTHORS_NETEM_LIMIT_PACKETS` x ``frame_bytes``
    (an approximation: netem counts packets, whatever their size)."""
    return AUTHORS_NETEM_LIMIT_PACKETS * frame_bytes


# -- the smallest queue --------------------------------------------------------------------------------
class BufferBelowMinimum(ValidationError):
    """The bottleneck queue a link asks for is smaller than ``Link.min_queue_bytes`` (for its rate x RTT)."""


def round_up(x: float, digits: int = 4) -> float:
    """``x`` rounded up to ``digits`` significant digits (so that the value a message suggests is accepted)."""
    if x <= 0:
        return 0.0
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale - 1e-9) / scale


