"""``bbrlab calibrate``: measure what the contended sender can carry at all (its CPU ceiling)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from bbrlab.testbed.driving import driving

DESCRIPTION = """\
Measures the sender's CPU ceiling at every timeslice x CPU share x RTT of a campaign: the highest
throughput of the least CPU-limited configuration (Cubic, 1 and several streams, over an unshaped link:
the RTT as netem delay, no rate limit, no bottleneck queue) in any of its runs, with the contention applied
exactly as in a run and each run as long as the campaign's. A run whose link rate is at or above the ceiling of its point measures the sender's CPU (under
QEMU TCG, or a small share of a slow vCPU), not its congestion control; figures draw the ceiling and the
fidelity report sets such points aside.

Writes DIR/calibration.json (schema bbrlab.calibration/1, docs/calibration.md); the runs themselves are
kept under DIR/calibration/<testbed-accelerator-kernel-grid>/ as a normal campaign (a killed calibration
resumes). `bbrlab campaign run SPEC --out DIR` then finds DIR/calibration.json and every run record points
to the ceiling of its point (metadata.ceiling); a calibration of another testbed, accelerator or sender
kernel is refused.

Each point also says which limit it measured: sender-cpu (the sender's vCPU wanted the CPU >= 90 % of the
time), emulator (the emulator's busiest CPU >= 90 % busy), both, or undetermined. At 100 % share a bridge
reference (no qdisc at all on the emulator) shows what netem itself costs.

The ceiling depends on everything else the machine does: on a shared machine calibrate right before the
campaign, and read the host load printed with the grid.

examples:
  bbrlab calibrate specs/demo.yaml --out runs/demo --plan     points, runs, expected time; nothing runs
  bbrlab calibrate specs/demo.yaml --out runs/demo            measure (about 5-10 min for the demo grid)
  bbrlab calibrate --timeslices 10 --shares 25 100 --rtts 20 --out runs/x --repetitions 2
  bbrlab calibrate --show runs/demo                           print the ceiling grid of a calibration
"""


def register(sub) -> None:
    """Add ``bbrlab calibrate`` to the subparsers ``sub``."""
    p = sub.add_parser("calibrate", help="measure the sender's CPU ceiling per timeslice x share (calibration.json)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", help="campaign spec (YAML) whose timeslices, shares and RTTs to calibrate")
    p.add_argument("--out", type=Path, help="campaign directory: calibration.json and calibration/ go here")
    p.add_argument("--timeslices", type=float, nargs="+", metavar="MS", help="timeslices in ms (instead of a spec)")
    p.add_argument("--shares", type=float, nargs="+", metavar="PCT", help="CPU shares in %% (100 = no policy)")
    p.add_argument("--rtts", type=float, nargs="+", metavar="MS", help="RTTs in ms")
    p.add_argument("--streams", type=int, nargs="+", default=None, metavar="N",
                   help="parallel stream counts tried at each point; the better one counts (default: 1 4)")
    p.add_argument("--repetitions", type=int, default=None, help="runs per point and stream count (default 3)")
    p.add_argument("--duration", type=int, default=None, metavar="S",
                   help="seconds per run (default: the spec's duration_s, so the ceiling bounds runs as long as "
                        "the campaign's; 5 for a grid given with --timeslices --shares --rtts)")
    p.add_argument("--no-bridge-reference", action="store_true",
                   help="skip the 100 %% share reference run with no qdisc on the emulator")
    p.add_argument("--testbed", metavar="NAME|FILE",
                   help="a local testbed's name or a testbed file (default: the spec's 'testbed', else "
                        "$BBRLAB_TESTBED, else the local testbed that is up: 'local', or the only one)")
    p.add_argument("--fresh", action="store_true",
                   help="measure anew: move this testbed's earlier calibration runs aside instead of reusing them")
    p.add_argument("--plan", action="store_true", help="only print the points, the runs and the expected time")
    p.add_argument("--show", type=Path, metavar="PATH", help="print the ceiling grid of DIR/calibration.json or a file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar and no per-run lines")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON at the end")
    p.set_defaults(func=run)


def spec_from_args(args):
    """The :class:`~bbrlab.calibration.plan.CalibrationSpec` the flags ask for (validated, nothing touched)."""
    from bbrlab.calibration.plan import CalibrationSpec
    from bbrlab.campaign.spec import load_spec
    from bbrlab.core.errors import ValidationError

    overrides = {k: v for k, v in (("streams", tuple(args.streams) if args.streams else None),
                                   ("repetitions", args.repetitions), ("duration_s", args.duration))
                 if v is not None}
    if args.no_bridge_reference:
        overrides["bridge_reference"] = False
    grid = {"timeslices_ms": args.timeslices, "cpu_shares_pct": args.shares, "rtts_ms": args.rtts}
    if args.spec:
        spec = load_spec(args.spec)
        given = {k: tuple(v) for k, v in grid.items() if v}
        return CalibrationSpec.for_campaign(spec, **given, **overrides), spec.testbed
    missing = [f"--{k}" for k, v in (("timeslices", args.timeslices), ("shares", args.shares), ("rtts", args.rtts))
               if not v]
    if missing:
        raise ValidationError("spec", None, f"a campaign spec, or all of --timeslices --shares --rtts "
                              f"(missing {', '.join(missing)})")
    return CalibrationSpec(name="calibration", **{k: tuple(v) for k, v in grid.items()}, **overrides), None


def _hms(seconds: float) -> str:
    return str(dt.timedelta(seconds=int(round(seconds))))


def run(args) -> int:
    """``bbrlab calibrate``: print a calibration's grid (``--show``) or the plan (``--plan``), or measure the
    ceilings into ``--out``/calibration.json. Returns 0, or 1 when a point got no ceiling because every run
    there failed."""
    from bbrlab.calibration.calibrate import format_grid
    from bbrlab.core.errors import ValidationError
    from bbrlab.run import ceiling

    if args.show:
        cal = ceiling.load(args.show)
        print(json.dumps(cal.to_dict(), indent=2) if args.json else format_grid(cal))
        return 0
    spec, spec_testbed = spec_from_args(args)
    if args.plan:
        points = spec.points()
        print(f"{spec.name}: {len(points)} points x {len(spec.streams)} stream counts x {spec.repetitions} "
              f"repetitions{' + the bridge reference' if spec.reference_point() else ''} = {len(spec.plan())} runs "
              f"of {spec.duration_s:g} s; expected {_hms(spec.expected_duration_s())}")
        for k in points:
            print(f"  {k.text}")
        return 0
    if args.out is None:
        raise ValidationError("--out", None, "the campaign directory to write calibration.json into")
    return _measure(args, spec, args.testbed or spec_testbed)


def _measure(args, spec, target: str | None) -> int:
    from tqdm import tqdm

    from bbrlab.calibration.calibrate import calibrate, format_grid
    from bbrlab.run.runner import Runner
    from bbrlab.testbed.target import resolve

    say = None if args.no_progress else tqdm.write
    with driving(resolve(target), "calibrate", out=str(args.out)) as tb:
        print(f"calibrating {len(spec.points())} points ({len(spec.plan())} runs of {spec.duration_s:g} s, about "
              f"{_hms(spec.expected_duration_s())}) on testbed {tb.name} ({tb.accelerator})", flush=True)
        runner = Runner(tb)
        try:
            cal = calibrate(tb, spec, args.out, runner=runner, progress=not args.no_progress, fresh=args.fresh,
                            say=say)
        finally:
            runner.close()
    print(json.dumps(cal.to_dict(), indent=2) if args.json else format_grid(cal))
    print(f"written: {cal.path}")
    unmeasured = [p.key for p in cal.points if p.ceiling_mbit is None]
    if unmeasured:
        print(f"no ceiling for {', '.join(unmeasured)}: every run failed there (see {args.out}/{cal.runs_dir})")
        return 1
    return 0
