"""``bbrlab claims check``: recompute every number the prose states about data/ and show what differs."""

from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """\
How a number is tied to the data:

  1. Register it in docs/claims.yaml: an id, the data folder, the selection (runs-table columns and
     values), the statistic and the value as printed, e.g.

       - id: fq-cubic-25-fq
         data: fq-local
         select: {sender_qdisc: fq, cpu_share_pct: 25}
         stat: median              # median mean min max sum range count fraction interval level
         column: throughput_mbit   # or record:metadata.sampling.interval.p99_ms (from record.json)
         format: .1f               # a Python format spec, or hh:mm for a time stamp
         value: "7.6"

     'table: flows|ss' counts flows or socket samples (each with its run's columns); 'within' and 'where'
     take ranges ({below: 1}, {at_least: 16}); 'by: [col, ...]' with 'across: range|min|max' takes the statistic per group first (the range of
     per-queue medians); 'interval' is the median's order-statistic interval (low-high) and 'level' the
     level it reaches (50 at n = 2: never write 95 % for it). 'stat: calibration' with 'against: FOLDER'
     and 'column: inside' (or matched, fraction, expected, agree, agree_fraction, half_width.all, ...) is a
     field of `bbrlab compare data/DATA data/FOLDER --json`: the second recording against the first.
  2. Write the marker right after the number in the prose: 7.6<!-- claim:fq-cubic-25-fq --> Mbit/s.
  3. Inside <!-- findings --> ... <!-- /findings --> every number needs a marker, unless it is a
     parameter phrase listed under 'parameters:' in the registry (a condition such as '10 ms / 25 %').

Exit status: 0 when every claim recomputes to its value, every marker's number matches and every number in
a findings section has a claim; 1 otherwise, with a table of what differs (claim, where, stated, recomputed;
"(no claim)" for an unmarked number). tests/unit/analysis/test_claims.py runs the same check.
"""


def register(sub) -> None:
    """Add ``bbrlab claims`` (verb check) to the subparsers ``sub``."""
    p = sub.add_parser("claims", help="recompute the numbers README.md, data/README.md and docs/ state about data/",
                       description="The prose's numbers about data/ are claims registered in docs/claims.yaml "
                                   "and marked in the text; 'check' recomputes each from the runs.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    c = verbs.add_parser("check", help="recompute every claim; exit 1 with a table of differences",
                         description="Recomputes every claim of the registry from its data folder's runs table "
                                     "(the parquet cache under each folder's tables/ is reused) and checks each "
                                     "marker in the prose against the registry.",
                         epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--root", type=Path, default=Path("."),
                   help="the repository whose README.md, data/README.md and docs/*.md are checked (default: .)")
    c.add_argument("--registry", type=Path, help="the claims registry (default: ROOT/docs/claims.yaml)")
    c.add_argument("--data", type=Path, help="the data folder the claims name (default: ROOT/data)")
    c.add_argument("--all", action="store_true", help="print every claim with its recomputed value, not only "
                                                      "the differences")
    c.set_defaults(func=run_check)


def run_check(args) -> int:
    """``bbrlab claims check``: 0 when nothing differs, 1 (and the table) otherwise."""
    from bbrlab.analysis import claims

    registry = claims.load_registry(args.registry or args.root / "docs" / "claims.yaml")
    data_dir = args.data or args.root / "data"
    if args.all:
        values = claims.recompute_all(registry, data_dir)
        print(claims.table([claims.Difference(c.id, f"data/{c.data}", c.value, values[c.id])
                            for c in registry.claims]))
    differences = claims.check(registry, data_dir, args.root)
    if differences:
        print(claims.table(differences))
        print(f"{len(differences)} difference(s) in {len(registry.claims)} claims")
        return 1
    print(f"all {len(registry.claims)} claims recompute to their values, and the prose states them")
    return 0
