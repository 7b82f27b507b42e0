"""``bbrlab campaign``: run, resume, inspect and plan measurement campaigns.

    bbrlab campaign plan specs/demo.yaml              how many runs, how long (nothing runs)
    bbrlab campaign run specs/demo.yaml --out runs/demo   run; run again to resume after a crash
    bbrlab campaign run SPEC --out DIR --testbed a --testbed b   over two testbeds at once (docs/scaling.md)
    bbrlab campaign run SPEC --out DIR --scheduler tls://HOST:8786 --tls-ca-file ...   over a lab's bbrlab workers
    bbrlab campaign status runs/demo [--json]         planned / done / failed / running / remaining
    bbrlab campaign thresholds DIR [--figure F]       a threshold search's results beside the paper's
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import sys
from pathlib import Path

from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.single import run_campaign_on
from bbrlab.core.errors import ValidationError
from bbrlab.core.signals import BETWEEN_RUNS, Interrupted
from bbrlab.scenario.workloads import IperfParams, RsyncParams

from .worker import add_tls_options, lab_tls

RUN_EPILOG = """\
one testbed (as always):
  bbrlab campaign run specs/demo.yaml --out runs/demo --testbed local

several testbeds on this machine (each a Dask worker; local ones in CPU partitions, at most one per CPU):
  bbrlab testbed up --name tba && bbrlab testbed up --name tbb
  bbrlab campaign run specs/demo.yaml --out runs/demo --testbed tba --testbed tbb

a lab (docs/scaling.md): a scheduler, one bbrlab worker per testbed, then the campaign from anywhere,
all over mutual TLS with the lab's CA (bbrlab tls ca, then bbrlab tls cert for each host):
  dask scheduler --host HOST --dashboard-address 127.0.0.1:8787 --tls-ca-file ca.pem --tls-cert sched.pem \\
      --tls-key sched-key.pem
  bbrlab worker --testbed lab-a.yaml --scheduler tls://HOST:8786 --tls-ca-file ca.pem --tls-cert a.pem --tls-key a-key.pem
  bbrlab campaign run specs/fig4.yaml --out runs/fig4 --scheduler tls://HOST:8786 \
      --tls-ca-file ca.pem --tls-cert me.pem --tls-key me-key.pem

Every record names its testbed and host (metadata.worker); Ctrl-C stops the runs in flight, restores
every testbed and leaves the campaign resumable with the same command.
"""


def register(sub) -> None:
    """Add ``bbrlab campaign`` (verbs run, status, plan, schema, thresholds) to the subparsers ``sub``."""
    p = sub.add_parser("campaign", help="run a campaign spec (YAML) on a testbed, resume it, show its progress",
                       description="Campaigns: a grid of scenarios x repetitions, run in a seeded order. A killed "
                                   "campaign resumes where it stopped when run again with the same --out.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    run = verbs.add_parser(
        "run", help="run (or resume) SPEC into --out DIR, on one testbed or several at once",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run (or resume) a campaign. Run the same command again to resume it after a crash or\n"
                    "Ctrl-C: complete runs are kept, the rest run.",
        epilog=RUN_EPILOG)
    run.add_argument("spec", help="campaign spec (YAML), or the name of a shipped spec (e.g. demo)")
    run.add_argument("--out", required=True,
                     help="campaign directory: a new or empty one, or one this spec ran into before (resumed)")
    run.add_argument("--testbed", metavar="NAME|FILE", action="append",
                     help="a local testbed's name or a testbed file (default: the spec's 'testbed', else "
                          "$BBRLAB_TESTBED, else the local testbed that is up: 'local', or the only one). Give it "
                          "again for each further testbed: the runs are shared out among them (one Dask worker per "
                          "testbed on this machine, several local testbeds each in a CPU partition of its own)")
    run.add_argument("--scheduler", metavar="tls://HOST:PORT",
                     help="run on the testbed workers of this Dask scheduler instead (start one per testbed with "
                          "bbrlab worker --testbed NAME|FILE --scheduler tls://HOST:PORT); not with --testbed")
    add_tls_options(run, "this driver's host")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--keep-link", action="store_true", help="leave the last link's qdiscs on the emulator(s)")
    run.add_argument("--retry-failed", action="store_true",
                     help="give runs whose attempts are used up max_attempts more (after fixing the cause)")
    run.add_argument("--calibration", type=Path, metavar="PATH", action="append",
                     help="the sender's CPU ceilings to point every run to: a calibration.json or a directory "
                          "holding one (default: DIR/calibration.json when it exists; see bbrlab calibrate). One "
                          "made on another testbed, accelerator or sender kernel is refused. Over several testbeds: "
                          "one per testbed (each is matched to the testbed it was made on), or none")
    run.add_argument("--allow-mixed", action="store_true",
                     help="resume even on another testbed, accelerator, sender vCPU count or sender kernel than the "
                          "campaign's records ran on (refused without it); every record made says so "
                          "(metadata.mixed)")
    run.add_argument("--dashboard", action="store_true",
                     help="over several testbeds on this machine: serve Dask's dashboard and print its address")
    run.set_defaults(func=run_run)

    st = verbs.add_parser("status", help="counts for a campaign directory")
    st.add_argument("dir")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=run_status)

    plan = verbs.add_parser("plan", help="validate SPEC and show the number of runs and the expected duration")
    plan.add_argument("spec", help="campaign spec (YAML), or the name of a shipped spec (e.g. demo)")
    plan.add_argument("--json", action="store_true", help="machine-readable output, with every run id in order")
    plan.add_argument("--spread", type=float, default=DEFAULT_SPREAD, metavar="FRACTION",
                      help="adaptive repetitions: the expected count assumes runs spread with this standard "
                           f"deviation, as a fraction of the link rate (default {DEFAULT_SPREAD})")
    plan.set_defaults(func=run_plan)

    schema = verbs.add_parser("schema", help="print the campaign spec's JSON Schema (its keys and their shapes)")
    schema.set_defaults(func=run_schema)

    th = verbs.add_parser("thresholds", help="the thresholds a threshold search found, beside the paper's")
    th.add_argument("dir", help="the campaign directory of a spec with 'search:'")
    th.add_argument("--figure", type=Path, metavar="PATH", help="also draw them into this image (png, svg, pdf)")
    th.add_argument("--json", action="store_true", help="machine-readable output")
    th.set_defaults(func=run_thresholds)


#: The spread assumed for ``campaign plan``'s expected count, a cautious one: about 90 % of data/'s points (2 runs
#: each; 2026-11) spread less (standard deviation over the rate: median 0.1 %, mean 1.5 %, largest 10 %).
DEFAULT_SPREAD = 0.05


def _hms(seconds: float) -> str:
    return str(dt.timedelta(seconds=int(round(seconds))))


def run_schema(args) -> int:
    """``bbrlab campaign schema``: print the spec's JSON Schema (:func:`bbrlab.campaign.spec_schema.spec_json_schema`).
    Returns 0."""
    from bbrlab.campaign.spec_schema import spec_json_schema

    print(json.dumps(spec_json_schema(), indent=2))
    return 0


def run_plan(args) -> int:
    """``bbrlab campaign plan SPEC``: validate the spec and print its number of runs, the expected duration
    and the first run ids (every id with ``--json``); nothing runs. Returns 0."""
    from bbrlab.campaign.spec import ESTIMATED_OVERHEAD_S, load_spec
    from bbrlab.core.resources import spec_path

    spec = load_spec(spec_path(args.spec))
    runs = spec.plan()
    info = {"campaign": spec.name, "grid_points": len(spec.grid()), "repetitions": spec.repetitions,
            "runs": len(runs), "duration_s": spec.duration_s, "overhead_s_estimate": ESTIMATED_OVERHEAD_S,
            "expected_duration_s": spec.expected_duration_s(), "order": spec.order, "seed": spec.seed,
            "blocks": spec.blocks, "block_reboot": spec.block_reboot}
    if spec.adaptive is not None:
        if not 0 < args.spread <= 1:
            raise ValidationError("--spread", args.spread, "0 < spread <= 1 (a fraction of the link rate)")
        points = info["grid_points"] * max(1, len(spec.kernels))
        expected = spec.expected_runs(args.spread)
        info.update(adaptive=spec.adaptive.to_dict(), min_runs=points * spec.adaptive.fewest_reps(), max_runs=len(runs),
                    expected_runs=expected, expected_spread=args.spread,
                    expected_duration_s=spec.expected_duration_s() * expected / len(runs))
    if spec.search is not None:
        info.update(_search_counts(spec))
        info["expected_duration_s"] = spec.expected_duration_s() * info["expected_runs"] / len(runs)
    if args.json:
        print(json.dumps({**info, "run_ids": [s.run_id for s in runs]}, indent=2))
        return 0
    what = f"of {spec.duration_s:g} s"
    if RsyncParams.name in spec.workloads:
        what = (f"(iperf3: {spec.duration_s:g} s; rsync: {spec.file_mb:g} MB, at most {spec.transfer_timeout_s:g} s)"
                if IperfParams.name in spec.workloads else f"(rsync: {spec.file_mb:g} MB, at most {spec.transfer_timeout_s:g} s)")
    print(f"{spec.name}: {info['grid_points']} grid points x {spec.repetitions} repetitions = {len(runs)} runs "
          f"{what}, order {spec.order} (seed {spec.seed})" + (f", in {spec.blocks} blocks, each on a fresh boot of the "
                                                             f"{spec.block_reboot.replace('+', ' and ')}"
                                                             if spec.blocks > 1 else ""))
    if spec.adaptive is not None:
        a = spec.adaptive
        print(f"adaptive repetitions: {a.min_reps} to {a.max_reps} per point, stopping once the median's "
              f"interval reaches 95 % (6 runs or more) within +-{a.precision:.3g} x the rate: at least {info['min_runs']} runs, at most "
              f"{info['max_runs']}, expected {info['expected_runs']} (if runs spread by {args.spread:g} x the rate; "
              "--spread; points near a threshold spread more)")
    if spec.search is not None:
        r = spec.search.shape  # its target a fraction of the rate
        print(f"threshold search: {info['curves']} curve(s), median >= {r.target:g} x the rate, shares {r.low:g} to "
              f"{r.high:g} % every {r.step:g}, +-{r.resolution:g} points at {spec.search.confidence:g}: the plan lists "
              f"the whole lattice ({info['max_runs']} runs, the most it could take); clear curves take about "
              f"{info['expected_runs']} (a bisection's probes x min {r.min_reps}), shares near a threshold more; "
              f"run in rounds of {r.block} runs of every open probe, ordered by seed {spec.search.seed}, not in the "
              "plan's order below")
    print(f"expected duration: {_hms(info['expected_duration_s'])} (assuming {ESTIMATED_OVERHEAD_S:g} s overhead "
          "per run" + (", rsync copies at the link's rate less its loss: slow copies take longer" if RsyncParams.name
                       in spec.workloads else "") + ")")
    for s in runs[:5]:
        print(f"  {s.run_id}")
    if len(runs) > 5:
        print(f"  ... {len(runs) - 5} more")
    return 0


def run_thresholds(args) -> int:
    """``bbrlab campaign thresholds DIR``: print each searched threshold with its interval, the level it holds
    at and the paper's value, then the coverage per curve and jointly (:mod:`bbrlab.analysis.thresholds`);
    with ``--figure`` draw them. Returns 0."""
    from bbrlab.analysis.thresholds import coverage_lines, format_table, threshold_figure, threshold_table
    from bbrlab.core.errors import BbrlabError

    try:
        table = threshold_table(args.dir)
    except ValueError as e:
        raise BbrlabError(str(e)) from None
    if args.json:
        print(table.to_json(orient="records"))
    else:
        print(format_table(table))
        print("\n".join(coverage_lines(args.dir)))
    if args.figure:
        threshold_figure(table).savefig(args.figure)
        print(f"figure: {args.figure}")
    return 0


def _search_counts(spec) -> dict:
    """A search plan's counts: each curve's bisection takes about log2(lattice) probes of ``min`` to ``max``
    runs; at most it runs the whole lattice."""
    rule = spec.search
    curves = spec.runs // spec.repetitions // len(spec.cpu_shares_pct)
    probes = math.ceil(math.log2(len(spec.cpu_shares_pct) + 1))
    return {"search": rule.to_dict(), "curves": curves, "expected_runs": curves * probes * rule.min_reps,
            "max_runs": spec.runs}


def run_status(args) -> int:
    """``bbrlab campaign status DIR``: print the campaign directory's counts
    (:func:`bbrlab.campaign.directory.status`), as JSON with ``--json``; returns 0."""
    from bbrlab.campaign.directory import status

    st = status(args.dir)
    if args.json:
        print(json.dumps(st.to_dict()))
    else:
        print(f"{st.campaign}: {st.done}/{st.planned} done, {st.failed} failed "
              f"({st.failed_attempts} failed attempts), {st.running} running, {st.remaining} remaining"
              + (f", {st.skipped} skipped by the stopping rule" if st.points is not None else ""))
        for reason, n in sorted((st.points or {}).items()):
            print(f"  {n} {reason}")
    return 0


def run_run(args) -> int:
    """``bbrlab campaign run SPEC --out DIR``: check the options, the spec and the directory, then run (or
    resume) the campaign on one testbed here, on several through a local Dask cluster, or on the workers of
    ``--scheduler``; prints the final counts as JSON. Returns 0 when every run completed, else 1."""
    from bbrlab.campaign.directory import check_out_dir
    from bbrlab.campaign.scaleout import scheduler_address
    from bbrlab.campaign.spec import load_spec
    from bbrlab.campaign.tls import lab_security
    from bbrlab.core.resources import spec_path

    testbeds, calibrations = list(args.testbed or []), list(args.calibration or [])
    check_run_options(testbeds, args.scheduler, calibrations, args.dashboard)
    if args.scheduler:
        lab_security(scheduler_address(args.scheduler), lab_tls(args))  # its form and TLS, before anything is read
    elif args.tls_ca_file or args.tls_cert or args.tls_key or args.insecure:
        from bbrlab.core.errors import ValidationError

        raise ValidationError("--tls-ca-file" if args.tls_ca_file else "--tls-cert" if args.tls_cert else
                              "--tls-key" if args.tls_key else "--insecure", True, "given only with --scheduler "
                              "(a campaign over testbeds named here makes its own certificate)")
    spec = load_spec(spec_path(args.spec))  # every value checked before anything is touched
    check_out_dir(spec, args.out)
    if not args.scheduler and len(testbeds) < 2:
        return _run_one(args, spec, testbeds[0] if testbeds else None, calibrations[0] if calibrations else None)
    return _run_many(args, spec, testbeds, calibrations)


def check_run_options(testbeds: list[str], scheduler: str | None, calibrations: list, dashboard: bool) -> None:
    """The options of ``campaign run`` that only make sense together, checked before anything is read."""
    from bbrlab.core.errors import ValidationError

    if scheduler and testbeds:
        raise ValidationError("--testbed", testbeds, "absent with --scheduler: the cluster's workers bring their "
                              "testbeds (bbrlab worker --testbed NAME|FILE --scheduler ADDRESS on each)")
    if dashboard and len(testbeds) < 2:
        raise ValidationError("--dashboard", True, "given only with two or more --testbed (a scheduler of "
                              "--scheduler serves its own dashboard, usually on port 8787)")
    if len(calibrations) > 1 and not scheduler and len(testbeds) < 2:
        raise ValidationError("--calibration", [str(c) for c in calibrations], "one for one testbed (one per "
                              "testbed when the campaign runs over several)")


def options_of(args) -> CampaignOptions:
    """The campaign's options from ``campaign run``'s flags, built once here and handed down whole."""
    return CampaignOptions(retry_failed=args.retry_failed, allow_mixed=args.allow_mixed, keep_link=args.keep_link,
                           progress=not args.no_progress)


def _stopped(spec, out, in_flight: str = "the run in flight was not recorded") -> None:
    from bbrlab.campaign.directory import status

    st = status(out)
    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
        print(f"bbrlab: campaign {spec.name} stopped: {st.done}/{st.planned} runs complete in "
              f"{out}; {in_flight}. The same command resumes it.", file=sys.stderr)


def _run_many(args, spec, testbeds: list[str], calibrations: list[Path]) -> int:
    """Over several testbeds (docs/scaling.md): a Dask cluster started here, or the one at --scheduler."""
    from bbrlab.campaign import scaleout

    common = {"calibration_paths": calibrations, "options": options_of(args)}
    try:
        if args.scheduler:
            st = scaleout.run_on_scheduler(spec, args.out, args.scheduler, tls=lab_tls(args), **common)
        else:
            st = scaleout.run_local(spec, args.out, testbeds, dashboard=args.dashboard, **common)
    except Interrupted:
        if (Path(args.out) / "plan.json").is_file():
            _stopped(spec, args.out, "the runs in flight were not recorded and every testbed was restored")
        raise
    print(json.dumps(st.to_dict()))
    return _exit_status(st, args.out)


def _exit_status(st, out) -> int:
    """0 when every run completed; else 1, with each run that used up its attempts and why on stderr."""
    from bbrlab.campaign.directory import given_up

    if st.complete:
        return 0
    failed = given_up(out)
    if failed:
        print(f"bbrlab: {len(failed)} run(s) failed at every attempt; the last attempt of each "
              f"({Path(out) / 'failed'}):", file=sys.stderr)
        for attempt, reason in failed.items():
            print(f"  {attempt}: {reason}", file=sys.stderr)
        print("bbrlab: `campaign run ... --retry-failed` gives them new attempts", file=sys.stderr)
    return 1


def _run_one(args, spec, testbed: str | None, calibration_path: Path | None) -> int:
    """One testbed, in this process (:func:`bbrlab.campaign.single.run_campaign_on`: the testbed's lock first,
    then the pre-flight, then the campaign)."""
    try:
        st = run_campaign_on(spec, args.out, testbed, options=options_of(args), calibration_path=calibration_path)
    except Interrupted as stop:
        if (Path(args.out) / "plan.json").is_file():
            _stopped(spec, args.out, *([BETWEEN_RUNS] if stop.between_runs else []))
        raise
    print(json.dumps(st.to_dict()))
    return _exit_status(st, args.out)
