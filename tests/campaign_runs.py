"""A stand-in run function for the campaign loop's unit tests: no testbed, but real files in the staging folder,
and real metadata (a run writes :class:`~bbrlab.run.runmeta.RunMetadata`, so the campaign's record types)."""

from __future__ import annotations

from bbrlab.contention.outside import OutsideLoad
from bbrlab.core import recordjson
from bbrlab.run.runmeta import CcaUse, RunMetadata


def writing_run(calls: list, fail_ids: frozenset | set = frozenset()):
    """A run function that writes ``iperf.json`` and returns metadata (the campaign writes the record),
    appending ``(run_id, attempt)`` to ``calls``; it fails, by raising, for the ids in ``fail_ids``."""

    def run(scenario, staging, *, run_id, attempt):
        calls.append((run_id, attempt))
        if run_id in fail_ids:
            raise RuntimeError("receiver unreachable")
        (staging / "iperf.json").write_text("{}")
        return run_metadata(scenario)

    return run


def run_metadata(scenario) -> dict:
    """The metadata JSON a stand-in run of ``scenario`` returns: the CCA it asked for, the rest not measured."""
    return RunMetadata(cca=CcaUse(requested=scenario.flow.cca)).to_dict()


def host_other(other_busy_pct: float, top: list[dict] = ()) -> dict:
    """``metadata.host_other`` (:class:`~bbrlab.contention.outside.OutsideLoad`) of a host ``other_busy_pct`` %
    busy outside the testbed, on 2 CPUs over a 5 s window, with ``top`` its busiest processes."""
    return recordjson.to_json(OutsideLoad(
        other_busy_pct=other_busy_pct, other_cpus=round(2 * other_busy_pct / 100, 3), testbed_pct=10.0,
        process_busy_pct=other_busy_pct + 10.0, softirq_pct=0.0, steal_pct=0.0, window_s=5.0, cpus=2, ticks=1000,
        other_ticks=round(10 * other_busy_pct), testbed_ticks=100, testbed_processes=3, top=list(top)))
