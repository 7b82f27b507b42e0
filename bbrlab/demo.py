"""``make demo``: the whole method once, on the local testbed, in under about 30 minutes.

Steps: bring the local testbed up (building the guest image the first time), load the patched BBR
(``bbr2b``) in the sender, calibrate the sender's CPU ceiling over the demo's timeslices and shares
(``bbrlab calibrate``, into the first campaign's directory), run the demo campaigns (a throughput grid at
two rates and one ss-sampled run per CCA) with every record pointing to its ceiling, ingest, execute
every notebook, bring the testbed down, and say where the figures are.

May import: every other room but ``cli``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bbrlab import kernel
from bbrlab import testbed as testbed_mod
from bbrlab.analysis.render import render
from bbrlab.calibration.calibrate import calibrate, format_grid
from bbrlab.calibration.plan import CalibrationSpec
from bbrlab.campaign.single import run_on_testbed
from bbrlab.campaign.spec import load_spec
from bbrlab.core.errors import BbrlabError
from bbrlab.core.resources import specs_dir
from bbrlab.run.ceiling import source_for
from bbrlab.run.runner import Runner
from bbrlab.testbed.local import image, lifecycle
from bbrlab.testbed.local.state import State

DEMO_SPECS = (specs_dir() / "demo.yaml", specs_dir() / "demo-sampled.yaml")

# Measured on this project's 2-core build machine under TCG (see the issue notes); used for the estimate only.
IMAGE_BUILD_S = 240.0
BOOT_S = 90.0
FIGURES_S = 120.0
#: The demo's calibration: 2 repetitions per point and stream count, as long as the demo's runs (the CLI's default is 3).
CALIBRATION_REPETITIONS = 2


@dataclass
class DemoPlan:
    """What the demo will do, worked out before anything starts: its campaigns, its calibration, and whether
    the image and testbed are there already.
    """

    specs: list  # CampaignSpec
    image_cached: bool
    testbed_running: bool
    calibration: object = None  # CalibrationSpec covering every spec's timeslices, shares and RTTs

    @property
    def runs(self) -> int:
        """Runs in all: every campaign's plus the calibration's."""
        return sum(len(s.plan()) for s in self.specs) + (len(self.calibration.plan()) if self.calibration else 0)

    @property
    def expected_s(self) -> float:
        """Expected wall time in seconds on a 2-core machine under QEMU TCG, image build and boot included
        when needed.
        """
        total = sum(s.expected_duration_s() for s in self.specs) + FIGURES_S
        if self.calibration is not None:
            total += self.calibration.expected_duration_s()
        if not self.testbed_running:
            total += BOOT_S + (0 if self.image_cached else IMAGE_BUILD_S)
        return total


def calibration_spec(specs):
    """The demo's calibration: every timeslice, share and RTT of its specs, fewer repetitions than the CLI's."""

    return CalibrationSpec.covering(specs, "demo-calibration", repetitions=CALIBRATION_REPETITIONS)


def _say(step: str, text: str) -> None:
    print(f"\n== [{step}] {text}", flush=True)


def make_plan(spec_paths=DEMO_SPECS, name: str = "local") -> DemoPlan:
    """The demo's :class:`DemoPlan` for testbed ``name``; loading the specs checks every value before
    anything starts.
    """
    specs = [load_spec(p) for p in spec_paths]  # every value checked before anything starts
    return DemoPlan(specs, image_cached=image.cached_image() is not None,
                    testbed_running=lifecycle.running(State.load(name)), calibration=calibration_spec(specs))


def run_demo(runs_dir: Path, figures_dir: Path, *, keep_testbed: bool = False, spec_paths=DEMO_SPECS,
             name: str = "local") -> int:
    """The whole demo: testbed ``name`` up, bbr2b loaded, calibration, the campaigns into ``runs_dir``, the
    figures into ``figures_dir``. A testbed the demo started goes down afterwards unless ``keep_testbed``.
    Returns 0, or 1 when a planned run did not complete or the figures failed (the error printed as
    ``bbrlab figures`` prints it).
    """
    plan = make_plan(spec_paths, name)
    minutes = plan.expected_s / 60
    print(f"bbrlab demo: {len(plan.specs)} campaigns, {plan.runs} runs; expected about {minutes:.0f} minutes "
          f"on a 2-core machine under QEMU TCG"
          f"{'' if plan.image_cached else ' (includes building the guest image once)'}.", flush=True)
    t0 = time.monotonic()
    started_here = not plan.testbed_running
    failures = 0
    try:
        _say("1/6", "local testbed up")
        tb = testbed_mod.up(name, progress=True, load_bbr2b=False)  # loaded next, strictly
        _say("2/6", "patched BBR (bbr2b) in the sender")
        ident = kernel.ensure_bbr2b(tb.sender.host)
        print(f"bbr2b loaded: srcversion {ident.get('srcversion')}, patch {str(ident.get('patch_sha256'))[:12]}")
        with testbed_mod.testbed_lock(name):
            runner = Runner(tb)
            try:
                _say("3/6", "the sender's CPU ceiling at each timeslice and share (bbrlab calibrate)")
                cal = calibrate(tb, plan.calibration, runs_dir / plan.specs[0].name, runner=runner, progress=True)
                print(format_grid(cal), flush=True)
                runner.calibration = cal
                _say("4/6", "campaigns")
                for spec in plan.specs:
                    out = runs_dir / spec.name
                    runner.calibration_source = source_for(cal, out)
                    st = run_on_testbed(spec, out, tb, runner=runner)  # the default options: a progress bar
                    failures += st.failed + st.remaining
                    print(f"{spec.name}: {st.done}/{st.planned} runs complete in {out}")
            finally:
                runner.close()
    finally:
        if started_here and not keep_testbed:
            _say("5/6", "local testbed down")
            testbed_mod.down(name, progress=True)
    _say("6/6", "tables and figures")

    # The figures command's own rendering, so the demo renders exactly what `bbrlab figures` does.
    try:
        rc = render(runs_dir, figures_dir)
    except BbrlabError as e:  # said as `bbrlab figures` says it
        print(f"bbrlab: error: {e}", file=sys.stderr)
        rc = 1
    elapsed_min = (time.monotonic() - t0) / 60
    print(f"\nbbrlab demo done in {elapsed_min:.1f} minutes.\n  runs:    {runs_dir}\n  figures: {figures_dir}"
          f"\n  executed notebooks: {figures_dir / 'notebooks'}", flush=True)
    if failures:
        print(f"  {failures} planned runs did not complete (see `bbrlab campaign status DIR`)", file=sys.stderr)
    return 1 if (rc or failures) else 0
