"""The emulated link of a scenario (:class:`Link`): its delay, rate, buffer and loss, what follows from them
(the BDP, the bottleneck queue in bytes) and how large the emulator's queues and token bucket are for it,
checked against what the kernel's fields can hold when the link is made.

The sizes' constants and the reasons for them are in :mod:`bbrlab.scenario.linksizing` (numbers only) and
:mod:`bbrlab.link.qdisc` (which builds the qdiscs from these sizes). Imports nothing of bbrlab but
``core``'s errors, range check and sizing constants.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Literal

from bbrlab.core.errors import ValidationError

from .linksizing import (
    AUTHORS_BURST_BYTES_PER_MBIT,
    AUTHORS_NETEM_LIMIT_PACKETS,
    ETHERNET_HEADER_BYTES,
    MAX_BUFFER_BDP,
    MAX_QUEUE_BYTES,
    MIN_QUEUE_FRAMES,
    NETEM_LIMIT_HEADROOM,
    NETEM_MIN_LIMIT_PACKETS,
    QUEUE_MODES,
    TBF_BURST_MIN_PACKETS,
    TBF_BURST_TIME_MS,
    TBF_MAX_BURST_TIME_S,
    U32_MAX,
    UNSHAPED_SIZING_RATE_MBIT,
    BufferBelowMinimum,
    authors_burst_bytes,
    authors_queue_bytes,
    round_up,
)
from .ranges import check_range

#: Highest loss a link may have: beyond half the packets lost a transfer measures the loss, not the CCA.
MAX_LOSS_PCT = 50

LossModel = Literal["none", "uniform", "gemodel"]
DelaySplit = Literal["symmetric", "forward"]
QueueMode = Literal["bbrlab", "authors"]
EmulatorOffloads = Literal["off", "on"]
#: ``Link.emulator_offloads``: TSO, GSO and GRO on the emulator's two ports all off (bbrlab: netem sees wire
#: packets) or all on (as the authors' emulator script sets them).
EMULATOR_OFFLOADS = ("off", "on")


@dataclass(frozen=True)
class Link:
    """The emulated bottleneck: delay, rate, buffer and loss, as set on the emulator.

    ``buffer_bdp`` sizes the token bucket's queue in bandwidth-delay products (the paper uses 1);
    ``buffer_bytes`` gives it directly instead. ``rate_mbit=None`` is an *unshaped* link: the delay (and
    loss) only, no token bucket and so no bottleneck queue (both buffers ``None``); build it with
    :meth:`unshaped`. It measures what the sender can carry at all (``bbrlab calibrate``). ``delay_split``: ``symmetric`` puts RTT/2 on each
    direction, ``forward`` puts the whole RTT on the data direction.
    Gilbert-Elliott loss (``gemodel``) takes ``ge_p_pct``, ``ge_r_pct``, ``ge_h_pct``, ``ge_k_pct``
    as netem's ``loss gemodel p r 1-h 1-k``.

    ``queue`` picks the emulator's qdisc tree (docs/link.md): ``bbrlab`` (netem -> tbf; tbf's byte limit, the
    buffer asked, is the bottleneck queue) or ``authors`` (tbf -> netem on both ports as the paper authors'
    emulator built it; tbf's limit is then not in force and netem's 100000 packets are the queue, whatever the
    buffer asked). ``emulator_offloads`` sets TSO, GSO and GRO on the emulator's ports: ``off`` (netem sees wire
    packets) or ``on`` (as the authors' emulator had them). Both are left out of :meth:`to_dict` at their
    defaults, so the run ids of links made before they existed do not change.
    """

    rtt_ms: float
    rate_mbit: float | None
    buffer_bdp: float | None = 1.0
    buffer_bytes: int | None = None
    loss_model: LossModel = "none"
    loss_pct: float = 0.0
    ge_p_pct: float = 0.0
    ge_r_pct: float = 100.0
    ge_h_pct: float = 0.0
    ge_k_pct: float = 100.0
    loss_seed: int | None = None
    jitter_ms: float = 0.0
    delay_split: DelaySplit = "symmetric"
    mtu_bytes: int = 1500
    queue: QueueMode = "bbrlab"
    emulator_offloads: EmulatorOffloads = "off"

    def __post_init__(self):
        self.validate()

    def validate(self, *, floor: bool = True) -> None:
        """Check every field and their combinations; raise :class:`ValidationError` naming the field and its allowed
        range. ``floor``: check the bottleneck queue's floor too (:meth:`recorded` does not)."""
        check_range("link.rtt_ms", self.rtt_ms, 0, 10_000, unit="ms")
        if self.rate_mbit is None:
            if self.buffer_bdp is not None or self.buffer_bytes is not None:
                raise ValidationError("link.buffer", (self.buffer_bdp, self.buffer_bytes),
                                      "none when rate_mbit is None (an unshaped link has no bottleneck queue; "
                                      "use Link.unshaped)")
        else:
            check_range("link.rate_mbit", self.rate_mbit, 0, 100_000, lo_open=True, unit="Mbit/s")
        if self.rate_mbit is not None and (self.buffer_bdp is None) == (self.buffer_bytes is None):
            raise ValidationError("link.buffer", (self.buffer_bdp, self.buffer_bytes),
                                  "exactly one of buffer_bdp or buffer_bytes")
        if self.buffer_bdp is not None:
            if isinstance(self.buffer_bdp, bool) or not isinstance(self.buffer_bdp, int | float):
                raise ValidationError("link.buffer_bdp", self.buffer_bdp, "a number in BDP")
            self._check_buffer_ceiling()  # 0 < buffer_bdp <= the largest this rate x RTT allows
        if self.buffer_bytes is not None:
            check_range("link.buffer_bytes", self.buffer_bytes, 1, 2**31 - 1, unit="bytes")
        if self.loss_model not in ("none", "uniform", "gemodel"):
            raise ValidationError("link.loss_model", self.loss_model, "one of none, uniform, gemodel")
        check_range("link.loss_pct", self.loss_pct, 0, MAX_LOSS_PCT, unit="%")
        if self.loss_model == "none" and self.loss_pct:
            raise ValidationError("link.loss_pct", self.loss_pct, "0 when loss_model is none (use uniform)")
        for name in ("ge_p_pct", "ge_r_pct", "ge_h_pct", "ge_k_pct"):
            check_range(f"link.{name}", getattr(self, name), 0, 100, unit="%")
        if self.loss_seed is not None:
            check_range("link.loss_seed", self.loss_seed, 0, 2**63 - 1)
        check_range("link.jitter_ms", self.jitter_ms, 0, 10_000, unit="ms")
        if self.jitter_ms > self.one_way_delays_ms()[0] and self.jitter_ms:
            raise ValidationError("link.jitter_ms", self.jitter_ms, "at most the per-direction delay")
        if self.delay_split not in ("symmetric", "forward"):
            raise ValidationError("link.delay_split", self.delay_split, "symmetric or forward")
        check_range("link.mtu_bytes", self.mtu_bytes, 576, 65_535, unit="bytes")
        self._check_queue_tree()
        self._check_kernel_limits()
        if floor:
            self._check_queue_floor()

    def _check_queue_tree(self) -> None:
        """``queue`` and ``emulator_offloads`` are known values; the authors' tree needs a rate."""
        if self.queue not in QUEUE_MODES:
            raise ValidationError("link.queue", self.queue, "one of bbrlab (netem -> tbf, tbf's limit is the "
                                  "queue), authors (tbf -> netem as the paper authors built it, netem's 100000 "
                                  "packets are the queue)")
        if self.queue == "authors" and not self.shaped:
            raise ValidationError("link.queue", self.queue, "bbrlab for an unshaped link (the authors' tree is a "
                                  "token bucket with netem below it: give rate_mbit)")
        if self.emulator_offloads not in EMULATOR_OFFLOADS:
            raise ValidationError("link.emulator_offloads", self.emulator_offloads,
                                  "off (TSO, GSO and GRO off on the emulator's ports) or on (all three on, as the "
                                  "authors' emulator had them)")

    def to_dict(self) -> dict:
        """The link as recorded (and hashed into run ids): every field, but ``queue`` and
        ``emulator_offloads`` only when they differ from their defaults."""
        d = asdict(self)
        if self.queue == "bbrlab":
            del d["queue"]
        if self.emulator_offloads == "off":
            del d["emulator_offloads"]
        return d

    @classmethod
    def recorded(cls, **given) -> Link:
        """The link a record (``record.json``'s ``scenario.link``) says a run had: checked as any link, but for the
        bottleneck queue's floor, which records made before it may be below (the kernel then held 3000 bytes; the
        record's qdisc read-back says so, and the tables show it)."""
        try:
            return cls(**given)
        except BufferBelowMinimum:
            link = object.__new__(cls)
            for f in fields(cls):
                object.__setattr__(link, f.name, given.get(f.name, f.default))
            link.validate(floor=False)
            return link

    @classmethod
    def unshaped(cls, rtt_ms: float, **kwargs) -> Link:
        """A link with ``rtt_ms`` of delay and no rate limit (other fields as keywords, e.g. ``delay_split``)."""
        return cls(rtt_ms=rtt_ms, rate_mbit=None, buffer_bdp=None, buffer_bytes=None, **kwargs)

    # -- derived quantities ----------------------------------------------------------------
    @property
    def shaped(self) -> bool:
        """Whether a token bucket limits the rate (False for :meth:`unshaped` links)."""
        return self.rate_mbit is not None

    @property
    def bdp_bytes(self) -> int | None:
        """Bandwidth-delay product of the configured link in bytes (None when unshaped)."""
        if self.rate_mbit is None:
            return None
        return int(round(self.rate_mbit * 1e6 / 8 * self.rtt_ms / 1e3))

    @property
    def queue_limit_bytes(self) -> int | None:
        """Bottleneck queue in bytes, exactly as asked: ``buffer_bytes``, or ``buffer_bdp x bdp_bytes`` rounded
        to a byte (None when unshaped: there is no bottleneck queue). A queue below :attr:`min_queue_bytes`
        is refused when the link is built, never enlarged behind the researcher's back."""
        if self.rate_mbit is None:
            return None
        if self.buffer_bytes is not None:
            return self.buffer_bytes
        return int(round(self.buffer_bdp * self.bdp_bytes))

    @property
    def frame_bytes(self) -> int:
        """What a full-size packet takes in the bottleneck queue: the MTU plus the Ethernet header."""
        return self.mtu_bytes + ETHERNET_HEADER_BYTES

    @property
    def min_queue_bytes(self) -> int:
        """The smallest bottleneck queue bbrlab sets: :data:`MIN_QUEUE_FRAMES` full-size frames."""
        return MIN_QUEUE_FRAMES * self.frame_bytes

    @property
    def queue_bdp(self) -> float | None:
        """The bottleneck queue in BDP (None when unshaped or when the BDP is 0 bytes)."""
        if not self.shaped or not self.bdp_bytes:
            return None
        return self.queue_limit_bytes / self.bdp_bytes

    # -- sizing of the emulator's queues and bucket (docs/link.md) ---------------------------------
    def netem_limit_packets(self) -> int:
        """netem's queue in packets: in bbrlab's tree large enough never to drop (the reasons: :mod:`bbrlab.link.qdisc`); in
        the authors' tree their fixed :data:`AUTHORS_NETEM_LIMIT_PACKETS`, which is then the bottleneck queue."""
        if self.queue == "authors":
            return AUTHORS_NETEM_LIMIT_PACKETS
        if not self.shaped:
            sized_bytes = UNSHAPED_SIZING_RATE_MBIT * 1e6 / 8 * self.rtt_ms / 1e3
            return max(NETEM_MIN_LIMIT_PACKETS, math.ceil(NETEM_LIMIT_HEADROOM * sized_bytes / self.mtu_bytes))
        full_packets = (self.bdp_bytes + self.queue_limit_bytes) / self.mtu_bytes
        return max(NETEM_MIN_LIMIT_PACKETS, math.ceil(NETEM_LIMIT_HEADROOM * full_packets))

    def tbf_burst_bytes(self) -> int:
        """Bucket size: ``rate x TBF_BURST_TIME_MS``, at least ``TBF_BURST_MIN_PACKETS`` full frames; in the
        authors' tree their rule (:func:`authors_burst_bytes`)."""
        if self.queue == "authors":
            return authors_burst_bytes(self.rate_mbit)
        by_time = self.rate_mbit * 1e6 / 8 * TBF_BURST_TIME_MS / 1e3
        by_packets = TBF_BURST_MIN_PACKETS * self.frame_bytes
        return int(math.ceil(max(by_time, by_packets)))

    def max_buffer_bdp(self) -> float:
        """The largest buffer in BDP bbrlab sets at this link's rate x RTT: :data:`MAX_BUFFER_BDP`, or up to the
        authors' queue at full-size frames (:func:`authors_queue_bytes`) where that is more (tbf's 32-bit byte
        count is checked apart, :meth:`_check_kernel_limits`). :data:`MAX_BUFFER_BDP` when the BDP is 0 bytes."""
        bdp = self.bdp_bytes
        if not bdp:
            return float(MAX_BUFFER_BDP)
        return max(float(MAX_BUFFER_BDP), math.floor(authors_queue_bytes(self.frame_bytes) / bdp * 1e4) / 1e4)

    def _check_buffer_ceiling(self) -> None:
        """Raise :class:`ValidationError` unless ``0 < buffer_bdp <=`` :meth:`max_buffer_bdp` (or it is None)."""
        if self.buffer_bdp is None or 0 < self.buffer_bdp <= self.max_buffer_bdp():
            return
        raise ValidationError(
            "link.buffer_bdp", self.buffer_bdp,
            f"0 < buffer_bdp <= {self.max_buffer_bdp():g} BDP at {self.rate_mbit:g} Mbit/s x {self.rtt_ms:g} ms: "
            f"{MAX_BUFFER_BDP} BDP, or up to the authors' queue ({AUTHORS_NETEM_LIMIT_PACKETS} full-size frames of "
            f"{self.frame_bytes} bytes = {authors_queue_bytes(self.frame_bytes)} bytes) where that is more")

    def _check_authors_burst(self) -> None:
        """The authors' tree needs a burst of at least one full-size frame: tbf drops a frame larger than its
        bucket (unless it is a GSO aggregate, which it splits), so below that rate no full-size frame passes."""
        if self.queue != "authors" or authors_burst_bytes(self.rate_mbit) >= self.frame_bytes:
            return
        min_rate = self.frame_bytes / AUTHORS_BURST_BYTES_PER_MBIT
        raise ValidationError(
            "link.rate_mbit", self.rate_mbit,
            f"at least {min_rate:g} Mbit/s with queue authors: its tbf burst (rate in Mbit/s x "
            f"{AUTHORS_BURST_BYTES_PER_MBIT} bytes) must hold one full-size frame of {self.frame_bytes} bytes "
            "(or use queue bbrlab)")

    def _check_kernel_limits(self) -> None:
        """Raise :class:`ValidationError` when this link's qdiscs would not fit the kernel's fields: tbf's
        ``limit`` and ``burst`` are 32-bit byte counts, its burst time a 32-bit tick count, netem's ``limit``
        a 32-bit packet count. Computed from the same functions that build the tree."""
        if self.netem_limit_packets() > U32_MAX:
            raise ValidationError("link.rtt_ms" if not self.shaped else "link.buffer_bdp",
                                  self.rtt_ms if not self.shaped else self.buffer_bdp,
                                  f"a path of at most {U32_MAX} packets in netem's queue (a 32-bit count)")
        if not self.shaped:
            return  # no token bucket
        queue = self.queue_limit_bytes
        if queue > U32_MAX:
            field = "link.buffer_bdp" if self.buffer_bytes is None else "link.buffer_bytes"
            raise ValidationError(
                field, self.buffer_bdp if self.buffer_bytes is None else self.buffer_bytes,
                f"a queue of at most {U32_MAX} bytes (tbf's limit is a 32-bit byte count); {self.rate_mbit:g} Mbit/s x "
                f"{self.rtt_ms:g} ms x {self.buffer_bdp} BDP gives {queue} bytes")
        self._check_authors_burst()
        burst = self.tbf_burst_bytes()
        burst_time_s = burst * 8 / (self.rate_mbit * 1e6)
        if burst > U32_MAX or burst_time_s > TBF_MAX_BURST_TIME_S:
            min_rate_mbit = burst * 8 / TBF_MAX_BURST_TIME_S / 1e6
            raise ValidationError(
                "link.rate_mbit", self.rate_mbit,
                f"at least {min_rate_mbit:.6g} Mbit/s with an MTU of {self.mtu_bytes} bytes: tbf's bucket of {burst} bytes "
                f"must drain within {TBF_MAX_BURST_TIME_S:.1f} s (a 32-bit count of psched ticks)")

    def buffer_bdp_range(self) -> tuple[float, float] | None:
        """``(lowest, highest)`` buffer in BDP that this link's rate x RTT allows: at least two full-size frames,
        at most :meth:`max_buffer_bdp` and tbf's 32-bit byte count. None when no BDP multiple is possible (a 0-byte
        BDP at RTT 0, or a BDP so small that the floor is above the largest multiple)."""
        bdp = self.bdp_bytes
        if not bdp:
            return None
        lowest = round_up((self.min_queue_bytes - 0.5) / bdp)
        highest = min(self.max_buffer_bdp(), math.floor(MAX_QUEUE_BYTES / bdp * 1e4) / 1e4)
        return (lowest, highest) if lowest <= highest else None

    def _check_queue_floor(self) -> None:
        """Raise :class:`BufferBelowMinimum` when this link's bottleneck queue is below two full-size frames,
        naming the buffer field and the range allowed at its rate x RTT."""
        if not self.shaped or self.queue_limit_bytes >= self.min_queue_bytes:
            return
        floor = (f"the bottleneck queue must hold {MIN_QUEUE_FRAMES} full-size frames of {self.frame_bytes} bytes "
                 f"(MTU {self.mtu_bytes} + Ethernet header), i.e. at least {self.min_queue_bytes} bytes; tbf drops a "
                 "frame that does not fit")
        where = f"at {self.rate_mbit:g} Mbit/s x {self.rtt_ms:g} ms (BDP {self.bdp_bytes} bytes)"
        if self.buffer_bytes is not None:
            raise BufferBelowMinimum("link.buffer_bytes", self.buffer_bytes,
                                     f"{self.min_queue_bytes} <= buffer_bytes <= {MAX_QUEUE_BYTES}: {floor}")
        span = self.buffer_bdp_range()
        if span is None:
            raise BufferBelowMinimum("link.buffer_bdp", self.buffer_bdp,
                                     f"no buffer in BDP {where}: give the buffer in bytes instead "
                                     f"(buffer_bytes >= {self.min_queue_bytes}); {floor}")
        raise BufferBelowMinimum("link.buffer_bdp", self.buffer_bdp,
                                 f"{span[0]:g} <= buffer_bdp <= {span[1]:g} BDP {where}: {floor} "
                                 f"({self.buffer_bdp:g} BDP is {self.queue_limit_bytes} bytes)")

    def one_way_delays_ms(self) -> tuple[float, float]:
        """(data direction, ack direction) delay in ms."""
        if self.delay_split == "forward":
            return float(self.rtt_ms), 0.0
        return self.rtt_ms / 2, self.rtt_ms / 2

    @property
    def effective_loss_pct(self) -> float:
        """The loss netem applies at random, in percent: ``loss_pct`` for the uniform model, 0 otherwise (Gilbert-Elliott loss has no single figure)."""
        return self.loss_pct if self.loss_model == "uniform" else 0.0
