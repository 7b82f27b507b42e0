"""``bbrlab worker``: one testbed offered to a Dask scheduler, for campaigns over a lab (docs/scaling.md)."""

from __future__ import annotations

import argparse

EPILOG = """\
A lab campaign, step by step:
  dask scheduler --port 8786                                       # once, on a machine all can reach
  bbrlab worker --testbed lab-a.yaml --scheduler tcp://HOST:8786   # one per testbed, where it can reach it
  bbrlab worker --testbed local --scheduler tcp://HOST:8786        # a machine's own local testbed
  bbrlab campaign run SPEC --out DIR --scheduler tcp://HOST:8786   # the driver: it alone writes DIR

The worker takes the testbed's lock and keeps it until it stops, runs one run at a time for any campaign
sent to the scheduler, and sends each run's files back to that campaign's driver. Ctrl-C or SIGTERM
stops it: a run in flight is stopped and goes to another testbed, the testbed is restored (deadline
policy off, iperf3 and samplers stopped, link cleared), the lock released.
"""


def register(sub) -> None:
    p = sub.add_parser("worker", help="offer one testbed to a Dask scheduler (campaigns over a lab's testbeds)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Start a Dask worker with one thread that owns one testbed for as long as it runs: "
                                   "campaigns started with bbrlab campaign run --scheduler share their runs out among "
                                   "such workers.")
    p.add_argument("--testbed", required=True, metavar="NAME|FILE",
                   help="the testbed this worker owns: a local testbed that is up (bbrlab testbed up --name NAME) or "
                        "a lab's testbed file (docs/testbed.md). Its name is what the records' testbed field says, so "
                        "give each testbed of a lab its own")
    p.add_argument("--scheduler", required=True, metavar="tcp://HOST:PORT",
                   help="the Dask scheduler's address (dask scheduler prints it; port 8786 by default)")
    p.add_argument("--name", metavar="NAME",
                   help="the worker's name on the scheduler (default: TESTBED@HOSTNAME); unique in the cluster")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..scaleout import serve_worker

    return serve_worker(args.testbed, args.scheduler, args.name)
