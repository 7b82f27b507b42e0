"""``bbrlab ingest DIR``: read run directories into parquet tables next to them (reused when unchanged)."""

from __future__ import annotations

from pathlib import Path

from bbrlab.core.errors import BbrlabError


def register(sub) -> None:
    """Add ``bbrlab ingest`` to the subparsers ``sub``."""
    p = sub.add_parser("ingest", help="read a campaign's runs into tidy tables (DIR/tables/*.parquet)",
                       description="Reads every run of a campaign directory (or of each campaign in a folder, or "
                                   "the paper authors' logs/ layout) into the runs, intervals and ss tables and "
                                   "writes them as parquet under DIR/tables/. Unchanged runs are reused.")
    p.add_argument("dir", type=Path, help="a campaign directory, a folder of campaigns, or an authors' dataset")
    p.add_argument("--force", action="store_true", help="re-read every run even when the cache is current")
    p.set_defaults(func=run)


def run(args) -> int:
    """``bbrlab ingest DIR``: read each campaign (or authors' dataset) found in DIR into its parquet tables
    and print its counts and notes; returns 0. Raises :class:`~bbrlab.core.errors.BbrlabError` when DIR
    holds none."""
    from bbrlab.analysis import data

    sources = data.find_sources(args.dir)
    if not sources:
        raise BbrlabError(f"{args.dir}: no campaign (runs/, failed/ or plan.json) and no authors' layout "
                          "(logs/<timestamp>/meta.json) here or in its subfolders")
    for kind, path in sources:
        tables = data.load(path, force=args.force)
        src = tables.sources[0]
        how = "all reused from tables/" if src["read"] == 0 else f"{src['read']} read, {src['reused']} reused"
        if kind == "authors":
            how += " (authors' layout)"
        statuses = tables.runs["status"].value_counts().to_dict()
        detail = ", ".join(f"{statuses[s]} {s}" for s in sorted(statuses, key=lambda s: (s != "ok", s)))
        c = tables.counts()
        print(f"{path}: {c['runs']} runs ({detail or 'none'}), {c['intervals']} intervals, {c['ss']} ss samples, "
              f"{c['vcpu']} vCPU intervals; "
              f"{how}")
        for note in tables.notes:
            print(f"  note: {note}")
    return 0
