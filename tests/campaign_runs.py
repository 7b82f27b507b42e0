"""A stand-in run function for the campaign loop's unit tests: no testbed, but real files in the staging folder."""

from __future__ import annotations


def writing_run(calls: list, fail_ids: frozenset | set = frozenset()):
    """A run function that writes ``iperf.json`` and returns metadata (the campaign writes the record),
    appending ``(run_id, attempt)`` to ``calls``; it fails, by raising, for the ids in ``fail_ids``."""

    def run(scenario, staging, *, run_id, attempt):
        calls.append((run_id, attempt))
        if run_id in fail_ids:
            raise RuntimeError("receiver unreachable")
        (staging / "iperf.json").write_text("{}")
        return {"written_by": "test"}

    return run
