"""Blocks of repetitions across boots (issue #36): the spec's ``blocks`` and ``block_reboot`` keys, and what
the loop tells each run about its block.

``blocks: K`` splits every point's repetitions into K equal blocks of consecutive repetitions
(:meth:`bbrlab.campaign.spec.CampaignSpec.block_of`); the plan runs block after block, each in the spec's seeded
order, and each block on a fresh boot of the sender (``block_reboot: sender+emulator``: of the emulator too).
So the repetitions of a point sample the variation between boots, not only the minutes between two runs of one
boot, and the analysis treats the block, not the run, as the unit of replication (docs/statistics.md).

The loop asks the testbed for the boot with a :class:`bbrlab.run.blockboot.BlockBoot` per attempt
(:meth:`BlockBoots.request`); the sender boot ids a block already holds are read from the committed records
(:class:`BlockBoots`), so a resumed campaign decides exactly as an uninterrupted one would: a block's runs stay
on its boot while that boot is up, and no block reuses another's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from bbrlab.core.errors import ValidationError
from bbrlab.run.blockboot import BlockBoot

#: The most blocks a spec may ask for (each costs a boot of the sender: about 30 s under TCG).
MAX_BLOCKS = 100


def check_blocks_fit(blocks: int, repetitions: int, *, adaptive: bool) -> None:
    """The spec's ``blocks`` (a whole number from 1 to :data:`MAX_BLOCKS`, checked by its setting,
    :mod:`bbrlab.campaign.settings`) with its repetitions: a divisor of ``repetitions``, above 1 only with a fixed
    number of repetitions (not with adaptive repetitions or a threshold search, whose decisions run repetition by
    repetition)."""
    if repetitions % blocks:
        raise ValidationError("blocks", blocks, f"a divisor of repetitions ({repetitions}): every block holds the "
                              "same number of each point's repetitions")
    if blocks > 1 and adaptive:
        raise ValidationError("blocks", blocks, "1 with adaptive repetitions or a threshold search (their stopping "
                              "rules decide repetition by repetition); give a fixed number of repetitions")


def sender_boot_id(record: Mapping) -> str | None:
    """The sender boot id a record's run ran on (``metadata.testbed.sender_boot_id``), if it names one."""
    value = ((record.get("metadata") or {}).get("testbed") or {}).get("sender_boot_id")
    return value if isinstance(value, str) and value else None


class BlockBoots:
    """The sender boot ids each block's ok runs were recorded on, read from ``runs/`` and kept up to date as
    the loop commits runs."""

    def __init__(self, spec, out: Path, runs: Iterable[tuple[str, object]]):
        self.spec = spec
        self.blocks = int(getattr(spec, "blocks", 1) or 1)
        self.of_block: dict[int, set[str]] = {}
        if self.blocks <= 1:
            return
        from bbrlab.run import record as rec  # the loop has it loaded; the spec's check needs none of it

        for run_id, scenario in runs:
            if rec.is_complete(out, run_id):
                try:
                    record = json.loads((Path(out) / rec.RUNS / run_id / rec.RECORD_FILE).read_text())
                except (OSError, ValueError):
                    continue
                self.add(scenario, record)

    def add(self, scenario, record: Mapping) -> None:
        """Take note of a committed record of ``scenario``."""
        boot = sender_boot_id(record)
        if self.blocks > 1 and boot and record.get("status") == "ok":
            self.of_block.setdefault(self.spec.block_of(scenario.repetition), set()).add(boot)

    def request(self, scenario) -> BlockBoot | None:
        """What a run of ``scenario`` asks of the testbed (None: a campaign without blocks)."""
        if self.blocks <= 1:
            return None
        block = self.spec.block_of(scenario.repetition)
        return BlockBoot(block, self.blocks, self.spec.block_reboot, tuple(sorted(self.of_block.get(block, ()))))
