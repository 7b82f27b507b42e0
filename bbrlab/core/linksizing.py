"""How large the emulator's queues and token bucket are for a link, and whether the kernel's fields
can hold them.

The reasons for each size (netem's limit never drops; the bucket covers a late watchdog; unshaped links
are sized for a rate far above what a sender here reaches) are told in :mod:`bbrlab.link.qdisc`, which
builds the qdiscs from these numbers. They live apart from it so that
:class:`~bbrlab.core.scenario.Link` can refuse, when it is made, a link whose queues the kernel could not
hold, without importing the qdisc builder (which builds on ``Link``).

Takes any object with a link's fields (``rtt_ms``, ``rate_mbit``, ``mtu_bytes``, ``shaped``,
``bdp_bytes``, ``frame_bytes``, ``queue_limit_bytes``, ``buffer_bdp``, ``buffer_bytes``); imports nothing of bbrlab but
its errors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .errors import ValidationError

if TYPE_CHECKING:
    from .scenario import Link

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
    """netem's queue in packets, large enough never to drop (see the module docstring)."""
    if not link.shaped:
        sized_bytes = UNSHAPED_SIZING_RATE_MBIT * 1e6 / 8 * link.rtt_ms / 1e3
        return max(NETEM_MIN_LIMIT_PACKETS, math.ceil(NETEM_LIMIT_HEADROOM * sized_bytes / link.mtu_bytes))
    full_packets = (link.bdp_bytes + link.queue_limit_bytes) / link.mtu_bytes
    return max(NETEM_MIN_LIMIT_PACKETS, math.ceil(NETEM_LIMIT_HEADROOM * full_packets))


def tbf_burst_bytes(link: Link) -> int:
    """Bucket size: ``rate x TBF_BURST_TIME_MS``, at least ``TBF_BURST_MIN_PACKETS`` full frames."""
    by_time = link.rate_mbit * 1e6 / 8 * TBF_BURST_TIME_MS / 1e3
    by_packets = TBF_BURST_MIN_PACKETS * link.frame_bytes
    return int(math.ceil(max(by_time, by_packets)))


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
    burst = tbf_burst_bytes(link)
    burst_time_s = burst * 8 / (link.rate_mbit * 1e6)
    if burst > U32_MAX or burst_time_s > TBF_MAX_BURST_TIME_S:
        min_rate_mbit = burst * 8 / TBF_MAX_BURST_TIME_S / 1e6
        raise ValidationError(
            "link.rate_mbit", link.rate_mbit,
            f"at least {min_rate_mbit:.6g} Mbit/s with an MTU of {link.mtu_bytes} bytes: tbf's bucket of {burst} bytes "
            f"must drain within {TBF_MAX_BURST_TIME_S:.1f} s (a 32-bit count of psched ticks)")
