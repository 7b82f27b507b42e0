"""``bbrlab check DIR [--expect FILE] [--junit PATH]``: judge a campaign's runs against expectations, for CI.

The judging is :mod:`bbrlab.analysis.expectations`'; the reports :mod:`bbrlab.analysis.expectations_report`'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bbrlab.core.errors import BbrlabError

#: Exit statuses: every expectation passed; one failed; (2: a usage error, argparse's); none failed but one is
#: undecided; the expectations could not be judged (no runs, a bad file of expectations).
EXIT_PASS, EXIT_FAIL, EXIT_UNDECIDED, EXIT_CANNOT_JUDGE = 0, 1, 3, 4

DESCRIPTION = """\
Judges the runs of a campaign directory against expectations: what a CCA's runs should show, e.g. "bbr2b's
median link utilisation >= 0.8 at shares >= 40 % with 95 % confidence", "Jain's index >= 0.9", "bbr2b not
below stock bbr at any point". The expectations are the expect: block of DIR/spec.yaml, or of --expect FILE.

Each expectation is judged at every point it selects (its cca and where: one condition each, the full run
identity; runs of different conditions are never pooled), at the point's unit of replication (a block's
median when its runs span blocks, else a run):
  pass       the median's interval at the confidence asked lies wholly on the expected side of the value
             (not_below: the Mann-Whitney test, Holm-corrected over the points, does not find this CCA
             significantly below the other)
  fail       the interval lies wholly on the wrong side (not_below: significantly below, negative shift)
  undecided  the interval straddles the value, or the runs cannot reach the confidence asked: n = 2 gives
             [min, max] at 50 %; 95 % needs 6 runs (blocks); a test at 95 % needs 4 a side. The verdict
             says the level reached and how many runs would reach the level asked.
An expectation takes the worst verdict of its points. Every verdict prints its evidence: the median, its
interval and the level it reaches, n and the unit (or both medians, the shift and p).

Exit status: 0 every expectation passed; 1 one failed; 3 none failed, one is undecided; 4 nothing could
be judged (no runs in DIR, no expectations, a bad file); 2 a usage error.

An expectation (docs/expectations.md; every key but op/value or not_below is optional):
  - name: patched-recovers       # names it in reports
    cca: bbr2b                   # only this CCA's runs
    metric: link_utilisation     # or throughput_mbit, goodput_mbit, jain_index, mean_rtt_ms, retransmits
    stat: median
    op: ">="                     # >=, >, <=, <
    value: 0.8
    where: {timeslice_ms: 1, cpu_share_pct: ">= 25"}   # a value, [values], or a comparison
    confidence: 0.95             # 0.5 to below 1
  - {cca: bbr2b, not_below: bbr, confidence: 0.95}
"""

EPILOG = """\
examples:
  bbrlab check runs/mine                          the expect: block of runs/mine/spec.yaml
  bbrlab check data/threshold-search-local --expect specs/expect/paper-patched-thresholds.yaml
                                                  the paper's figure 10 on the local search: stock BBR fails (1)
  bbrlab check data/threshold-search-local --expect specs/threshold-search-local.yaml
                                                  the search's own findings, as its spec keeps them: pass (0)
  bbrlab check runs/mine --junit build/expectations.xml          for CI (JUnit XML)

A file of expectations holds expect: (and optionally description:); --expect also takes a campaign spec,
checked whole, and uses its expect: block. A spec's block is not part of the campaign's identity: adding or
changing it never changes the plan, and a campaign resumed with changed expectations keeps its directory
(its spec.yaml takes the new block).
"""


def register(sub) -> None:
    """Add ``bbrlab check`` to the subparsers ``sub``."""
    p = sub.add_parser("check", help="judge a campaign's runs against expectations: pass, fail or undecided (CI)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, metavar="DIR", help="a campaign directory (or a folder of campaigns)")
    p.add_argument("--expect", type=Path, metavar="FILE",
                   help="a YAML file of expectations (expect: [...], description: ...), or a campaign spec (its "
                        "expect: block), instead of DIR/spec.yaml's expect: block")
    p.add_argument("--junit", type=Path, metavar="PATH",
                   help="also write a JUnit XML report there: a test case per expectation and point, a failure "
                        "for fail, an error for undecided")
    p.add_argument("--no-cache", action="store_true", help="read every run afresh and write no tables/ cache into DIR")
    p.set_defaults(func=run)


def run(args) -> int:
    """``bbrlab check``: print every verdict with its evidence, write ``--junit``, return the exit status
    (:data:`EXIT_PASS`, :data:`EXIT_FAIL`, :data:`EXIT_UNDECIDED`, :data:`EXIT_CANNOT_JUDGE`)."""
    from bbrlab.analysis import expectations, expectations_report

    try:
        given = expectations.expectations_of_file(args.expect) if args.expect else None
        report = expectations.check(args.dir, given, source=str(args.expect) if args.expect else None,
                                    cache=not args.no_cache)
    except BbrlabError as e:
        if args.verbose:
            raise
        print(f"bbrlab: error: {e}", file=sys.stderr)
        return EXIT_CANNOT_JUDGE
    print(expectations_report.text(report))
    if args.junit:
        args.junit.parent.mkdir(parents=True, exist_ok=True)
        args.junit.write_text(expectations_report.junit_xml(report))
        print(f"JUnit report: {args.junit}")
    return {expectations.PASS: EXIT_PASS, expectations.FAIL: EXIT_FAIL,
            expectations.UNDECIDED: EXIT_UNDECIDED}[report.verdict]
