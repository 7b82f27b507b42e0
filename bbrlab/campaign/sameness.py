"""One campaign, one testbed: what a campaign's records ran on, and refusing to mix testbeds.

A campaign resumed on another testbed, accelerator, sender vCPU count or sender
kernel than its records ran on is refused before its first run (:func:`check_same_testbed`), and a run whose
sender turns out to run another kernel than the campaign's earlier runs of that kernel is not recorded,
unless ``allow_mixed`` (``--allow-mixed``); then every record made says so (``metadata.mixed``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from bbrlab.core import recordjson
from bbrlab.core.errors import NotARunFailure, ValidationError
from bbrlab.run import record as rec
from bbrlab.run.campaignadded import MixedMark
from bbrlab.run.runrecord import scenario_of
from bbrlab.scenario.scenario import Scenario
from bbrlab.testbed.record import TestbedRecord

#: What a resumed campaign's testbed must share with the one its records ran on (keys of
#: :class:`~bbrlab.testbed.record.TestbedRecord`); the sender kernel is its ``uname -r``.
SAME_TESTBED_KEYS = ("name", "kind", "accelerator", "sender_vcpus", "sender_kernel")
MIXED_OPTION = "--allow-mixed"


class MixedTestbed(ValidationError, NotARunFailure):
    """A campaign would mix testbeds (:func:`check_same_testbed`); never a failed attempt of a run."""


class _Ran(NamedTuple):
    """A record of the campaign (its JSON) and the testbed it says it ran on."""

    record: dict
    testbed: TestbedRecord


def _testbed(value: object) -> TestbedRecord | None:
    """``metadata.testbed`` of a record's JSON, or a ``Testbed.describe()``, typed; None when it is not one."""
    if not isinstance(value, dict):
        return None
    try:
        return TestbedRecord.from_dict(value)
    except ValueError:
        return None


def _records(out: Path) -> list[_Ran]:
    """Every record of the campaign (ok runs and failed attempts) that says what testbed it ran on, oldest
    first; unreadable ones are skipped (resume sets them aside)."""
    import json

    found = []
    for path in [*(out / rec.RUNS).glob(f"*/{rec.RECORD_FILE}"), *(out / rec.FAILED).glob(f"*/{rec.RECORD_FILE}")]:
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        testbed = _testbed((record.get("metadata") or {}).get("testbed")) if isinstance(record, dict) else None
        if testbed is not None and testbed.name:
            found.append(_Ran(record, testbed))
    return sorted(found, key=lambda r: str(r.record.get("started_at")))


def _ran_on(out_dir: str | Path) -> dict[str, _Ran]:
    out: dict[str, _Ran] = {}
    for ran in _records(Path(out_dir)):
        out.setdefault(ran.testbed.name, ran)
    return out


def testbeds_ran_on(out_dir: str | Path) -> dict[str, dict]:
    """The testbeds a campaign's records ran on: ``{name: first record of that testbed}``, in the order of
    those first runs (the campaign's first run first); empty for a new campaign."""
    return {name: ran.record for name, ran in _ran_on(out_dir).items()}


def _identity(testbed: TestbedRecord, kernel_dimension: bool, vcpus_dimension: bool = False) -> dict:
    left_out = {"sender_kernel"} if kernel_dimension else set()
    if vcpus_dimension:
        left_out.add("sender_vcpus")
    return {k: getattr(testbed, k) for k in SAME_TESTBED_KEYS if k not in left_out}


def testbed_differences(out_dir: str | Path, offered: list[dict], *, kernel_dimension: bool = False,
                        vcpus_dimension: bool = False) -> list[str]:
    """How the testbeds ``offered`` now (each ``Testbed.describe()``) differ from those the campaign in
    ``out_dir`` ran on, one sentence each; empty when they do not (or nothing is recorded yet).

    A testbed the records never name is a different testbed; one they name must match the first run it
    made in :data:`SAME_TESTBED_KEYS`; when several testbeds are offered, among them every one the records name, a
    testbed the records do not name yet is accepted if it is alike in all but its name (a campaign over several
    testbeds may stop before each has recorded a run). With a ``kernels:`` dimension (``kernel_dimension``) the sender
    boots each block's kernel, so its kernel is compared run by run instead (:func:`check_run_testbed`); with a
    ``sender_vcpus:`` dimension (``vcpus_dimension``) each run's vCPU count is its scenario's, read back by the run
    (:func:`bbrlab.run.checks.sender_vcpus`)."""
    ran = _ran_on(out_dir)
    if not ran:
        return []
    first = next(iter(ran.values()))
    offered_now = [_testbed(tb) or TestbedRecord() for tb in offered]
    # Several testbeds share one campaign: one that had not recorded a run yet when the campaign stopped is one of
    # its own, provided every testbed the records name is offered again and it is alike in all but its name.
    shared = len(offered_now) > 1 and set(ran) <= {tb.name for tb in offered_now}
    alike = {k: v for k, v in _identity(first.testbed, kernel_dimension, vcpus_dimension).items() if k != "name"}
    out = []
    for tb in offered_now:
        mine = ran.get(tb.name)
        if mine is None and shared and {k: getattr(tb, k) for k in alike} == alike:
            continue
        if mine is None:
            names = ", ".join(repr(n) for n in ran)
            out.append(f"testbed {tb.name!r} is not one the campaign ran on (it ran on {names}; first run "
                       f"{first.record['run_id']} on "
                       f"{_said(_identity(first.testbed, kernel_dimension, vcpus_dimension))})")
            continue
        was, now = (_identity(mine.testbed, kernel_dimension, vcpus_dimension),
                    _identity(tb, kernel_dimension, vcpus_dimension))
        for key in was:
            if was[key] != now[key]:
                out.append(f"testbed {tb.name!r}: {key} {now[key]!r} now, but the campaign's runs on it "
                           f"ran with {was[key]!r} (first run {mine.record['run_id']})")
    return out


def _said(identity: dict) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in identity.items() if k != "name")


def check_same_testbed(out_dir: str | Path, offered: list[dict], *, allow_mixed: bool = False,
                       kernel_dimension: bool = False, vcpus_dimension: bool = False) -> dict | None:
    """Refuse to resume the campaign in ``out_dir`` on testbeds other than those it ran on.

    ``offered``: each testbed the runs would go to, as ``Testbed.describe()`` gives it (see
    :func:`testbed_differences`). Raises :class:`MixedTestbed` (a :class:`ValidationError` naming
    ``--testbed``, what the campaign ran on and what is offered now) unless ``allow_mixed``. Returns what the
    records made now carry (``metadata.mixed``): ``{"allowed": True, "differences": [...]}`` with
    ``allow_mixed``, else None. Reads only; the single-testbed and the multi-testbed paths both call it
    before their first run."""
    differences = testbed_differences(out_dir, offered, kernel_dimension=kernel_dimension,
                                      vcpus_dimension=vcpus_dimension)
    if differences and not allow_mixed:
        raise MixedTestbed("--testbed", ", ".join(str(tb.get("name")) for tb in offered),
                           f"the testbed this campaign ran on: {'; '.join(differences)}. Resume it on that testbed, "
                           f"use another --out, or pass {MIXED_OPTION} to mix them (every record made then says so, "
                           "metadata.mixed)")
    return {"allowed": True, "differences": differences} if allow_mixed else None


def check_run_testbed(out_dir: str | Path, scenario: Scenario, metadata: dict, seen: dict, run_id: str) -> str | None:
    """The difference between the sender kernel run ``run_id`` just measured (``metadata.testbed.sender_kernel``)
    and the campaign's earlier runs of the same testbed and spec kernel (from the records, else this process's
    first such run, kept in ``seen``), or None when they agree."""
    testbed = _testbed(metadata.get("testbed")) or TestbedRecord()
    key = (testbed.name, scenario.kernel)
    if key not in seen:
        for ran in _records(Path(out_dir)):
            if (ran.testbed.name, scenario_of(ran.record).kernel) == key:
                seen[key] = (ran.testbed.sender_kernel, ran.record["run_id"])
                break
        else:
            seen[key] = (testbed.sender_kernel, run_id)
    was, first = seen[key]
    now = testbed.sender_kernel
    if key[0] is None or was == now:
        return None
    return (f"testbed {key[0]!r}: sender_kernel {now!r} in this run, but the campaign's runs "
            f"{'of kernel ' + repr(scenario.kernel) + ' ' if scenario.kernel else ''}ran on {was!r} (first run {first})")


def mixed_marker(mixed: dict) -> dict:
    """``metadata.mixed`` of one record (:class:`~bbrlab.run.campaignadded.MixedMark` as JSON): a copy, so later
    differences do not change records already made."""
    return recordjson.to_json(MixedMark(bool(mixed.get("allowed")), list(mixed.get("differences", []))))
