"""``bbrlab tls``: a lab's certificate authority and one certificate per host, for the Dask engine's mutual
TLS (docs/scaling.md, "Security")."""

from __future__ import annotations

import argparse
from pathlib import Path

from bbrlab.campaign.tls import LAB_CA_VALID_DAYS, LAB_VALID_DAYS

EPILOG = """\
Why: a Dask scheduler and its workers run what a connected peer sends them, and bbrlab's workers run as
root. Over mutual TLS only a holder of a certificate signed by the lab's own CA can connect.

Once, on a machine you trust (keep DIR/ca-key.pem there, never copy it to the lab's hosts):
  bbrlab tls ca --out labca
For every host that takes part, name it as the lab knows it and give its role: server for the scheduler's
host and each worker's (a Dask scheduler or worker listens and also connects out), client for a campaign
driver's (it only connects). Each --out is a new directory outside the CA's:
  bbrlab tls cert --ca labca --role server --name sched --host sched.lab --host 10.0.0.5 --out tls-sched
  bbrlab tls cert --ca labca --role server --name hosta --out tls-hosta
  bbrlab tls cert --ca labca --role client --name me --out tls-me
Copy each OUT directory (ca.pem, NAME.pem, NAME-key.pem) to its host, then (the scheduler's dashboard on
loopback only: reach it with ssh -L 8787:127.0.0.1:8787 10.0.0.5):
  dask scheduler --host 10.0.0.5 --port 8786 --dashboard-address 127.0.0.1:8787 \\
      --tls-ca-file tls-sched/ca.pem --tls-cert tls-sched/sched.pem --tls-key tls-sched/sched-key.pem
  bbrlab worker --testbed lab-a.yaml --scheduler tls://10.0.0.5:8786 --tls-ca-file tls-hosta/ca.pem \\
      --tls-cert tls-hosta/hosta.pem --tls-key tls-hosta/hosta-key.pem
  bbrlab campaign run SPEC --out DIR --scheduler tls://10.0.0.5:8786 --tls-ca-file tls-me/ca.pem \\
      --tls-cert tls-me/me.pem --tls-key tls-me/me-key.pem

Dask checks every peer's certificate against the CA, not its host name: the CA is what is trusted, so it
must be the lab's own (never a public one). Keys are written readable by their owner only (0600).
Certificates last 90 days by default (--days), the CA a year: Dask checks no revocation list, so a lost
host key is good until it expires. To revoke one sooner, make a new CA and new certificates for every host
that stays, replace them on each host and restart the scheduler and workers (docs/scaling.md, Security).
"""


def register(sub) -> None:
    """Add ``bbrlab tls`` (verbs ca, cert) to the subparsers ``sub``."""
    p = sub.add_parser("tls", help="make a lab's CA and per-host certificates (mutual TLS for bbrlab worker and "
                                   "campaign run --scheduler)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Certificates for a lab's Dask scheduler, bbrlab workers and campaign drivers.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    ca = verbs.add_parser("ca", help="make a new certificate authority in --out DIR (ca.pem, ca-key.pem)",
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    ca.add_argument("--out", required=True, type=Path, metavar="DIR",
                    help="a new directory (made 0700), or an empty one that is yours and 0700 already")
    ca.add_argument("--common-name", default="bbrlab lab CA", help="the CA's name (default: %(default)s)")
    ca.add_argument("--days", type=int, default=LAB_CA_VALID_DAYS, metavar="N",
                    help="days the CA is valid, 1 to 3650 (default: %(default)s); its certificates end with "
                         "it")
    ca.set_defaults(func=run_ca)
    cert = verbs.add_parser("cert", help="make one host's certificate, signed by the CA in --ca DIR",
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    cert.add_argument("--ca", required=True, type=Path, metavar="DIR", help="the directory bbrlab tls ca made")
    cert.add_argument("--name", required=True, help="the host's short name: the files are NAME.pem and NAME-key.pem")
    cert.add_argument("--host", action="append", metavar="DNS|IP",
                      help="a name or address the certificate names (repeatable; default: --name). Informative: "
                           "Dask trusts the CA, not host names")
    cert.add_argument("--role", required=True, metavar="server|client",
                      help="server: the scheduler's host or a worker's (TLS server and client use); client: "
                           "a campaign driver's (TLS client use only)")
    cert.add_argument("--days", type=int, default=LAB_VALID_DAYS, metavar="N",
                      help="days the certificate is valid, 1 to 365 and not past the CA's end (default: "
                           "%(default)s: Dask checks no revocation list, so a lost key lasts until then)")
    cert.add_argument("--out", required=True, type=Path, metavar="DIR",
                      help="a new directory outside --ca (or an empty one that is yours and 0700) for "
                           "NAME.pem, NAME-key.pem (0600) and a copy of ca.pem: what to copy to the host")
    cert.set_defaults(func=run_cert)


def run_ca(args) -> int:
    """``bbrlab tls ca``: make a new lab CA in ``--out`` (:func:`bbrlab.campaign.tls.write_ca`) and print
    where its files are; returns 0."""
    from bbrlab.campaign.tls import write_ca

    files = write_ca(args.out, args.common_name, args.days)
    print(f"CA certificate: {files.ca_file}\nCA key (keep it here, 0600): {files.key}\n"
          f"next, one per host: bbrlab tls cert --ca {args.out} --role server|client --name HOST --out DIR")
    return 0


def run_cert(args) -> int:
    """``bbrlab tls cert``: make host ``--name``'s certificate, signed by the CA in ``--ca``, into ``--out``
    and print the ``--tls-*`` options naming its files; returns 0."""
    from bbrlab.campaign.tls import write_host_cert

    files = write_host_cert(args.ca, args.name, args.out, args.host, role=args.role, valid_days=args.days)
    print(f"--tls-ca-file {files.ca_file} --tls-cert {files.cert} --tls-key {files.key}")
    return 0
