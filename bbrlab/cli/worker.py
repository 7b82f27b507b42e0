"""``bbrlab worker``: one testbed offered to a Dask scheduler, for campaigns over a lab (docs/scaling.md)."""

from __future__ import annotations

import argparse

EPILOG = """\
A lab campaign, step by step (every host holds ca.pem and its own certificate: bbrlab tls --help; the
scheduler's and workers' are --role server, the driver's --role client):
  dask scheduler --host SCHED --port 8786 --dashboard-address 127.0.0.1:8787 --tls-ca-file tls/ca.pem \\
      --tls-cert tls/sched.pem --tls-key tls/sched-key.pem                   # once, on a machine all reach
  bbrlab worker --testbed lab-a.yaml --scheduler tls://SCHED:8786 \\
      --tls-ca-file tls/ca.pem --tls-cert tls/hosta.pem --tls-key tls/hosta-key.pem   # one per testbed
  bbrlab campaign run SPEC --out DIR --scheduler tls://SCHED:8786 \\
      --tls-ca-file tls/ca.pem --tls-cert tls/me.pem --tls-key tls/me-key.pem        # the driver: it alone writes DIR

Dask's config keys (distributed.comm.tls.ca-file, .worker.cert, .worker.key) serve instead of the options.
A tcp:// scheduler is refused: anyone who reaches it could run code as root here. --insecure accepts it
anyway (a lab behind its own firewall); every record of such a campaign says so.

The worker takes the testbed's lock and keeps it until it stops, runs one run at a time for any campaign
sent to the scheduler, and sends each run's files back to that campaign's driver. Ctrl-C or SIGTERM
stops it: a run in flight is stopped and goes to another testbed, the testbed is restored (deadline
policy off, iperf3 and samplers stopped, link cleared), the lock released.
"""


def add_tls_options(p, what: str) -> None:
    """Dask's TLS options (the names ``dask scheduler`` and ``dask worker`` use) and ``--insecure``."""
    p.add_argument("--tls-ca-file", metavar="PEM", help="the lab CA's certificate (bbrlab tls ca makes one; "
                   "default: Dask's config key distributed.comm.tls.ca-file)")
    p.add_argument("--tls-cert", metavar="PEM", help=f"{what}'s certificate, signed by that CA (bbrlab tls cert)")
    p.add_argument("--tls-key", metavar="PEM", help=f"{what}'s private key (keep it 0600)")
    p.add_argument("--insecure", action="store_true",
                   help="accept a tcp:// scheduler: no encryption, no authentication, anyone who reaches the "
                        "scheduler or a worker can run code as root on the workers. The records say so")


def register(sub) -> None:
    """Add ``bbrlab worker`` to the subparsers ``sub``."""
    p = sub.add_parser("worker", help="offer one testbed to a Dask scheduler (campaigns over a lab's testbeds)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Start a Dask worker with one thread that owns one testbed for as long as it runs: "
                                   "campaigns started with bbrlab campaign run --scheduler share their runs out among "
                                   "such workers. It speaks mutual TLS with the lab's CA.")
    p.add_argument("--testbed", required=True, metavar="NAME|FILE",
                   help="the testbed this worker owns: a local testbed that is up (bbrlab testbed up --name NAME) or "
                        "a lab's testbed file (docs/testbed.md). Its name is what the records' testbed field says, so "
                        "give each testbed of a lab its own")
    p.add_argument("--scheduler", required=True, metavar="tls://HOST:PORT",
                   help="the Dask scheduler's address (dask scheduler prints it; port 8786 by default)")
    p.add_argument("--name", metavar="NAME",
                   help="the worker's name on the scheduler (default: TESTBED@HOSTNAME); unique in the cluster")
    p.add_argument("--host", metavar="IP",
                   help="the address this worker listens on (default: this machine's address towards the scheduler)")
    add_tls_options(p, "this host")
    p.set_defaults(func=run)


def lab_tls(args):
    """The TLS options of ``args`` as :class:`bbrlab.campaign.tls.LabTls`."""
    from bbrlab.campaign.tls import LabTls

    return LabTls(args.tls_ca_file, args.tls_cert, args.tls_key, bool(args.insecure))


def run(args) -> int:
    """``bbrlab worker``: serve ``--testbed`` to the Dask scheduler until stopped
    (:func:`bbrlab.campaign.scaleout.serve_worker`); returns 0 once the testbed is restored and released."""
    from bbrlab.campaign.scaleout import serve_worker

    return serve_worker(args.testbed, args.scheduler, args.name, tls=lab_tls(args), host=args.host)
