"""``bbrlab doctor``: an honest report of what this machine can do for the toolkit."""

from __future__ import annotations

import json

SYMBOL = {"ok": "ok  ", "missing": "MISS", "warn": "warn", "info": "info"}


def register(sub) -> None:
    """Add ``bbrlab doctor`` to the subparsers ``sub``."""
    p = sub.add_parser("doctor", help="report what this machine can do (root, SCHED_DEADLINE, qdiscs, KVM, tools, timing)",
                       description="Checks this machine for everything bbrlab uses and says how to get what is missing. "
                                   "Exit status 1 when something required is missing.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--probe-kvm", action="store_true",
                   help="boot the guest kernel under KVM once to see whether KVM really works (needs the guest image)")
    p.add_argument("--testbed", metavar="NAME", default=None,
                   help="also read the timing environment of this running testbed (a local testbed's name or a lab's "
                        "file): the sender guest's clocksource, HZ and tick, and QEMU's timer options")
    p.set_defaults(func=run)


def run(args) -> int:
    """``bbrlab doctor``: run the machine's checks (:func:`bbrlab.testbed.doctor.run_checks`, the timing environment
    among them, with ``--testbed`` a running testbed's too; then how busy the host is now: :func:`bbrlab.campaign.hostguard.host_load_check`) and print each
    with its fix (a JSON list with ``--json``); returns 1 when something required is missing, else 0."""
    from bbrlab.campaign.hostguard import host_load_check
    from bbrlab.testbed.doctor import run_checks

    checks = [*run_checks(probe_kvm=args.probe_kvm, testbed=getattr(args, "testbed", None)), host_load_check()]
    if args.json:
        print(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            line = f"[{SYMBOL[c.status]}] {c.name:<{width}}  {c.detail}"
            if c.fix:
                line += f"\n       {'':<{width}}  fix: {c.fix}"
            print(line)
    return 1 if any(c.status == "missing" for c in checks) else 0
