"""``bbrlab hostload DIR...``: how busy the host was while each data folder's runs transferred."""

from __future__ import annotations

from pathlib import Path

from bbrlab.core.errors import BbrlabError


def register(sub) -> None:
    """Add ``bbrlab hostload`` to the subparsers ``sub``."""
    p = sub.add_parser("hostload", help="the host's measured CPU load during a data folder's runs",
                       description="For a campaign folder (or each campaign folder in a folder of them): the "
                                   "median and range over its ok runs of the host's CPU used outside the "
                                   "testbed (metadata.host_other), or for older records of the host's CPU "
                                   "with the testbed (metadata.cpu_load.sender_hypervisor).")
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="a campaign folder or a folder of them")
    p.set_defaults(func=run)


def run(args) -> int:
    """Print one line per folder (:meth:`bbrlab.analysis.hostload.HostLoad.line`); returns 0. Raises
    :class:`~bbrlab.core.errors.BbrlabError` for a DIR without runs."""
    from bbrlab.analysis.hostload import summarise_folders

    for d in args.dirs:
        loads = summarise_folders(d) if d.is_dir() else []
        if not loads:
            raise BbrlabError(f"{d}: no runs/*/record.json here or in its folders")
        for load in loads:
            print(load.line())
    return 0
