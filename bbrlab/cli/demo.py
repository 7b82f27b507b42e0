"""``bbrlab demo``: the main job on the local testbed, start to figures (what `make demo` runs)."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    """Add ``bbrlab demo`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "demo", help="boot the local testbed, run the demo campaigns, render every figure",
        description="Runs the whole method once on this machine: local testbed up (the guest image is built "
                    "the first time), bbr2b loaded in the sender, the sender's CPU ceiling calibrated "
                    "(bbrlab calibrate), the campaigns in specs/demo.yaml and "
                    "specs/demo-sampled.yaml, ingest, every notebook, testbed down. Prints the expected "
                    "duration first and where the figures are at the end. Run it again to resume: complete "
                    "runs are kept.")
    p.add_argument("--runs", type=Path, default=Path("build/demo/runs"),
                   help="where the campaign directories go (default: build/demo/runs)")
    p.add_argument("--figures", type=Path, default=Path("build/demo/figures"),
                   help="where figures and executed notebooks go (default: build/demo/figures)")
    p.add_argument("--keep-testbed", action="store_true", help="leave the testbed running at the end")
    p.add_argument("--plan", action="store_true", help="only print what would run and how long it should take")
    p.set_defaults(func=run)


def run(args) -> int:
    """``bbrlab demo``: print the plan and its expected duration (``--plan``), or run the whole demo
    (:func:`bbrlab.demo.run_demo`). Returns 0, or 1 when a planned run did not complete or a figure failed."""
    from bbrlab.demo import make_plan, run_demo

    if args.plan:
        plan = make_plan()
        c = plan.calibration
        print(f"{c.name}: {len(c.plan())} runs of {c.duration_s:g} s (the CPU ceiling at {len(c.points())} points)")
        for s in plan.specs:
            print(f"{s.name}: {len(s.plan())} runs of {s.duration_s:g} s")
        print(f"expected: about {plan.expected_s / 60:.0f} minutes (image cached: {plan.image_cached}, "
              f"testbed running: {plan.testbed_running})")
        return 0
    return run_demo(args.runs, args.figures, keep_testbed=args.keep_testbed)
