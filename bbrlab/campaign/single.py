"""A campaign on one testbed, in this process: the calibration it is checked against, the runner wired to
it, and the loop with the testbed's lock told what runs.

:func:`run_on_testbed` runs a campaign on a testbed the caller holds (its lock taken, the pre-flight done);
:func:`run_campaign_on` takes the lock and runs the pre-flight first, for the command line and the notebook
API. This module neither prints progress of its own beyond the ceilings' source nor parses options.

May import: ``bbrlab.core``, ``bbrlab.contention``, ``bbrlab.run``, ``bbrlab.testbed``, ``.directory``,
``.hostguard``, ``.loop``, ``.options``, ``.preflight``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from bbrlab.contention import outside
from bbrlab.run.ceiling import for_campaign
from bbrlab.run.recovery import clear_partitions
from bbrlab.run.runner import Runner
from bbrlab.testbed.driving import driving
from bbrlab.testbed.target import resolve

from . import hostguard
from .directory import CampaignStatus
from .loop import announcing, run_campaign
from .options import DEFAULT_OPTIONS, CampaignOptions
from .preflight import check_testbed


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def runner_for_campaign(tb, out_dir: str | Path, scenarios, calibration_path: Path | None = None) -> Runner:
    """A :class:`Runner` on ``tb`` carrying the calibration of ``out_dir`` (or ``calibration_path``) that
    matches ``tb`` and covers ``scenarios``; without one the records carry no CPU ceiling (said on stderr)."""
    calibration, source = for_campaign(tb, out_dir, scenarios, calibration_path)
    _say(f"ceilings from {calibration.path} (calibrated {calibration.created_at})" if calibration else
         f"no calibration in {out_dir}: the records carry no CPU ceiling (bbrlab calibrate SPEC --out DIR)")
    return Runner(tb, calibration=calibration, calibration_source=source)


def say_if_host_busy(spec, tb) -> None:
    """Sample this machine for a second and a half and say on stderr when it is busy outside the testbed
    now (:func:`bbrlab.campaign.hostguard.busy_now_line`): the guard would fail the runs as "host busy".
    Only where the sender's QEMU runs on this machine (the host the guard measures)."""
    if not tb.sender.hypervisor.is_local:
        return
    guard = hostguard.effective(getattr(spec, "host_guard", None))
    line = hostguard.busy_now_line(outside.sample_now(outside.of_testbed(tb)), guard)
    if line:
        state = ("runs measured so fail as host busy and are tried again later" if guard.max_other_busy_pct
                 else "host_guard is off: runs measured so are recorded as ok")
        _say(f"bbrlab: warning: {line}; {state}")


def run_on_testbed(spec, out_dir: str | Path, tb, *, options: CampaignOptions = DEFAULT_OPTIONS,
                   calibration_path: Path | None = None, runner: Runner | None = None,
                   on_run: Callable[[dict], None] | None = None) -> dict:
    """Run (or resume) ``spec`` on testbed ``tb`` into ``out_dir``; returns the campaign's status. The one way
    a campaign is opened on one testbed: ``bbrlab campaign run``, ``bbrlab calibrate`` and the demo all call it.

    CPU partitions a killed multi-testbed campaign left are removed first (said on stderr). A campaign whose
    records were made on another testbed is refused unless ``options.allow_mixed``
    (:func:`bbrlab.campaign.sameness.check_same_testbed`). ``runner`` is a :class:`Runner` the caller shares
    between campaigns (it keeps the link set and closes it itself); without one, a runner carrying the
    campaign's calibration is made (:func:`runner_for_campaign`) and the emulator's qdiscs are cleared at the
    end unless ``options.keep_link`` (a failure to clear them is reported, not raised over the campaign's own
    outcome). ``on_run`` gets each run's record as it is committed. Call it holding ``tb``'s lock."""
    for path in clear_partitions(tb):  # refused while the campaign that made it runs
        _say(f"removed the CPU partition {path} a killed campaign left")
    say_if_host_busy(spec, tb)
    own = runner is None
    if own:
        runner = runner_for_campaign(tb, out_dir, spec.plan(), calibration_path)
    try:
        runner.session.recover_first()  # before the testbed is described: leftovers may stall the sender
        return run_campaign(spec, out_dir, announcing(runner, tb.name, spec, out_dir), options=options,
                            testbed=tb.describe(), on_run=on_run)
    finally:
        if own and not options.keep_link:
            try:
                runner.close()
            except Exception as e:  # noqa: BLE001 - report, do not hide the campaign's own outcome
                _say(f"bbrlab: warning: could not clear the emulator's qdiscs: {e}")


def run_campaign_on(spec, out_dir: str | Path, testbed: str | None = None, *,
                    options: CampaignOptions = DEFAULT_OPTIONS, activity: str = "campaign run",
                    calibration_path: Path | None = None) -> CampaignStatus:
    """Drive testbed ``testbed`` (a local name or a lab's file; default: the spec's, else the local testbed that
    is up) through ``spec``'s campaign into ``out_dir``, as ``bbrlab campaign run`` and the notebook API do.

    The testbed's lock comes first (:func:`bbrlab.testbed.driving.driving`, which waits for a holder and says
    who it is): nothing of the testbed is read while another process may change it. Then the pre-flight
    (:func:`bbrlab.campaign.preflight.check_testbed`: sender kernels, every timeslice x share against the host's
    live limits) and :func:`run_on_testbed`. An interruption propagates once the testbed is restored."""
    with driving(resolve(testbed or spec.testbed), activity, campaign=spec.name, out=str(out_dir)) as tb:
        check_testbed(spec, tb)
        return run_on_testbed(spec, out_dir, tb, options=options, calibration_path=calibration_path)
