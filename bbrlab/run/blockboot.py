"""A block's boot: what a campaign with ``blocks: K`` asks of the testbed before a run (issue #36).

A campaign that splits each point's repetitions into blocks runs every block on a boot of its own
(:mod:`bbrlab.campaign.blocks`). The loop hands each attempt a :class:`BlockBoot`: the run's block, how many
there are, what a block boots afresh (the sender, or the emulator too), and the sender boot ids on which
runs of this block were already recorded. :func:`needs_fresh_boot` is the one rule the testbed session
(:class:`bbrlab.run.session.TestbedSession`) applies before the run: a new block boots afresh; so does a
resumed block whose earlier runs were on another boot than the sender's current one. The record carries
the block (``metadata.block``) and the boot ids (``metadata.testbed.sender_boot_id``, and
``emulator_boot_id``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: What a block may boot afresh: the sender alone, or the emulator with it.
REBOOTS = ("sender", "sender+emulator")


@dataclass(frozen=True)
class BlockBoot:
    """One run's block: ``block`` (0 first) of ``blocks``; ``reboot`` one of :data:`REBOOTS`; ``boot_ids`` the
    sender boot ids that already hold ok runs of this block (empty for a block not begun)."""

    block: int
    blocks: int
    reboot: str = "sender"
    boot_ids: tuple[str, ...] = ()

    @property
    def emulator(self) -> bool:
        """Whether the block boots the emulator afresh too."""
        return self.reboot == "sender+emulator"

    def to_dict(self) -> dict:
        """As sent to a Dask worker (JSON types only)."""
        d = asdict(self)
        d["boot_ids"] = list(self.boot_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> BlockBoot | None:
        """Read :meth:`to_dict` back (None stays None)."""
        if d is None:
            return None
        return cls(int(d["block"]), int(d["blocks"]), str(d.get("reboot", "sender")),
                   tuple(str(b) for b in d.get("boot_ids", ())))

    def record(self, booted: bool) -> BlockPlace:
        """``metadata.block`` of a run of this block (``booted``: this run's process booted the testbed afresh for
        it just before)."""
        return BlockPlace(self.block, self.blocks, self.reboot, booted)


@dataclass(frozen=True)
class BlockPlace:
    """``metadata.block``: the run's ``block``, the count (``blocks``), what a block reboots, and whether this
    run's process booted the testbed afresh for it just before (``fresh_boot``; false for the block's later
    runs). A run writes every field; an older record without the last two reads as a sender reboot, fresh
    boot unknown (None)."""

    block: int
    blocks: int
    reboot: str = "sender"
    fresh_boot: bool | None = None


def needs_fresh_boot(request: BlockBoot, session_block: int | None, current_boot_id: str) -> bool:
    """Whether the testbed must boot afresh before a run of ``request``'s block.

    ``session_block`` is the block this process last booted for (or found its boot for), None before its first
    run; ``current_boot_id`` the sender's boot id now. Within one process a block keeps its boot. Otherwise
    (a new block, or the first run of a resumed campaign) the sender's current boot is kept only when the
    block's earlier runs were recorded on it, so no two blocks share a boot and a block started in a killed
    process goes on where it was when its boot is still up."""
    if session_block == request.block:
        return False
    return current_boot_id not in request.boot_ids
