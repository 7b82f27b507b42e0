"""``bbrlab cache show|prune``: what bbrlab keeps in ~/.cache/bbrlab, and pruning the kernel caches to a cap."""

from __future__ import annotations

import argparse
import json
import time

EPILOG = """\
What is kept (${XDG_CACHE_HOME:-~/.cache}/bbrlab):
  images/    the guest image (about 0.9 GB); an outdated one goes when the next is built
  boot/      per sender kernel: its initramfs and modules disk            (pruned)
  debian/    Debian kernel packages (pool/) and their unpacked trees      (pruned)
             and the pinned package sets (kernels/), kept
  modules/   bbr2b builds; sources/, sockdiag/, accel/: small
The pruned entries go least recently used first until they fit the cap, never one a testbed
that is up uses (or a running QEMU names or holds open). What is pruned is rebuilt or
downloaded again when needed. The cap is 5 GB unless $BBRLAB_CACHE_MAX_GB says otherwise;
building a sender kernel's boot files prunes to it on its own.

Examples:
  bbrlab cache show
  bbrlab cache prune --dry-run          what would go at the default cap
  bbrlab cache prune --max-gb 2         prune to 2 GB now
"""


def register(sub) -> None:
    """Add ``bbrlab cache`` (verbs show, prune) to the subparsers ``sub``."""
    p = sub.add_parser("cache", help="show bbrlab's caches; prune the kernel caches (least recently used first)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="The guest image, the sender kernels' boot files and the Debian kernel packages "
                                   "are cached under ~/.cache/bbrlab. 'show' lists them with their size; 'prune' "
                                   "removes work folders of killed builds and the least recently used kernel entries "
                                   "until the kernel caches fit the cap.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    show = verbs.add_parser("show", help="each cache folder's size; the prunable entries, least recently used first")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=run_show)
    prune = verbs.add_parser("prune", help="remove killed builds' leftovers and the least recently used kernel "
                                           "entries until they fit the cap")
    prune.add_argument("--max-gb", metavar="N", default=None,
                       help="the cap in GB (10^9 bytes), 0 or more (default: $BBRLAB_CACHE_MAX_GB, else 5)")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    prune.add_argument("--json", action="store_true", help="machine-readable output")
    prune.set_defaults(func=run_prune)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _age(t: float) -> str:
    days = (time.time() - t) / 86400
    return f"{days:.1f} d ago" if days >= 1 else f"{days * 24:.1f} h ago"


def run_show(args) -> int:
    """``bbrlab cache show``: print each cache folder's size and the kernel cache entries, least recently used
    first (the summary as JSON with ``--json``); returns 0."""
    from bbrlab.testbed.local import caches

    info = caches.summary()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['root']}  (kernel caches capped at {_gb(info['max_bytes'])})")
    for name, f in info["folders"].items():
        print(f"  {name + '/':<10} {_gb(f['bytes']):>10}  {f['items']} item(s)")
    entries = info["entries"]
    total = sum(e["size_bytes"] for e in entries)
    print(f"kernel cache entries: {len(entries)}, {_gb(total)} (least recently used first)")
    for e in entries:
        mark = "  in use" if e["in_use"] else ""
        print(f"  {_gb(e['size_bytes']):>10}  {_age(e['last_used']):>11}  {e['kind']:<15} {e['path']}{mark}")
    return 0


def run_prune(args) -> int:
    """``bbrlab cache prune``: remove killed builds' leftovers and the least recently used kernel cache
    entries until they fit ``--max-gb`` (with ``--dry-run``, only say what would go) and print each;
    returns 0. A bad ``--max-gb`` raises :class:`~bbrlab.core.errors.ValidationError`."""
    from bbrlab.testbed.local import caches

    cap = None if args.max_gb is None else int(caches.check_max_gb(args.max_gb, "--max-gb") * caches.GB)
    report = caches.prune(cap, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for path in report.swept:
        print(f"removed {path} (left by a killed build)")
    for e in report.removed:
        print(f"{verb} {e.path} ({_gb(e.size_bytes)}, last used {_age(e.last_used)})")
    for e in report.kept_in_use:
        print(f"kept {e.path} ({_gb(e.size_bytes)}): in use")
    print(f"kernel caches: {_gb(report.before_bytes)} -> {_gb(report.after_bytes)} (cap {_gb(report.max_bytes)})"
          + (" -- dry run, nothing removed" if args.dry_run else ""))
    return 0
