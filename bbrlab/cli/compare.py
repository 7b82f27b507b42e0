"""``bbrlab compare A B``: how well the intervals of recording A hold a second recording B of the same conditions.

The statistics are :mod:`bbrlab.analysis.compare`'s; this module reads the two folders and prints them as a table
(or ``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bbrlab.core.confidence import LEVEL, level_text
from bbrlab.core.errors import BbrlabError

DESCRIPTION = """\
Calibrates bbrlab's own uncertainty. Every point of A (one condition: variant, CPU share, contention model
and its parameters, RTT, rate, queue, loss, sender qdisc, streams, flows, workload, duration, sampler) has
an interval for its median with the level its runs reach: 95 % or more from 6 runs, 93.7 % at 5, 50 % at 2
(the order-statistic interval, docs/statistics.md). compare matches B's points to A's by identical
condition (the machine is not part of it) and counts, per level A states, how many of B's point medians
fall inside A's intervals.

How to read it: the last column is the fraction expected when nothing but the runs' chance differs (B's
runs drawn again from A's own distribution, simulated for each point's n). A second median is noisy
itself, so even then it falls inside less often than the level states: about 39 % at 2 runs a side
(stated 50 %), 86 % at 20 (stated 95.8 %). A fraction well below that column says A's intervals miss a
variation that lies between the recordings (another sender boot, day or machine): the "A intervals cover"
line says what A's runs did span, the "machines" line whether A and B ran on different machines (records
name their machine from 2026-11-28 on).

Beside it: B's medians within +-10 % of A's; the points whose medians stay below 0.8 x both recordings'
CPU ceilings (where the machine's ceiling bounds neither); the median half-width of A's intervals as a
fraction of the link rate (issue 36 asks at most 10 % at 95 %).
"""

EPILOG = """\
examples:
  bbrlab compare data/demo runs/demo-second            the demo recorded twice
  bbrlab compare data/demo data/fq-local --points      the points the two share, one line each
  bbrlab compare runs/a runs/b --json > calibration.json
"""


def register(sub) -> None:
    """Add ``bbrlab compare`` to the subparsers ``sub``."""
    p = sub.add_parser("compare", help="does a second recording fall inside the first's intervals? (calibration)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path, metavar="A", help="the first recording: a campaign directory or a folder of them; "
                   "its intervals are tested")
    p.add_argument("b", type=Path, metavar="B", help="the second recording of (some of) the same conditions")
    p.add_argument("--value", default="throughput_mbit", choices=("throughput_mbit", "goodput_mbit", "link_utilisation"),
                   help="the runs' value compared (default: throughput_mbit)")
    p.add_argument("--level", type=float, default=LEVEL,
                   help="the level asked of A's intervals, between 0 and 1 (default: 0.95); each states what its "
                        "n reaches")
    p.add_argument("--points", action="store_true", help="also list every matched point")
    p.add_argument("--json", action="store_true", help="print the result as JSON (every point included)")
    p.add_argument("--no-cache", action="store_true",
                   help="read every run afresh and write no tables/ cache into A or B")
    p.set_defaults(func=run)


def _runs(path: Path, name: str, cache: bool):
    from bbrlab.analysis import data

    if not path.is_dir():
        raise BbrlabError(f"{name}: {path} is not a directory")
    if not data.find_sources(path):
        raise BbrlabError(f"{name}: {path} holds no runs: no campaign (runs/, failed/ or plan.json) here or in its "
                          "subfolders")
    return data.load(path, cache=cache).runs


def run(args) -> int:
    """``bbrlab compare A B``: print the calibration (:func:`bbrlab.analysis.compare.calibration`); returns 0.
    Raises :class:`~bbrlab.core.errors.BbrlabError` for a folder without runs or without a point in common."""
    from bbrlab.analysis import compare

    a, b = _runs(args.a, "A", not args.no_cache), _runs(args.b, "B", not args.no_cache)
    result = compare.calibration(a, b, value=args.value, level=args.level, names=(str(args.a), str(args.b)))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(lines(result, points=args.points)))
    return 0


def _pct(part: int, whole: int) -> str:
    return f"{part} of {whole} ({100 * part / whole:.1f} %)" if whole else "no points"


def _width(value: float | None) -> str:
    """A fraction as a percentage: one decimal, two below 1 % (a tenth of a percent of the rate matters)."""
    if value is None or math.isnan(value):
        return "-"
    return f"{100 * value:.2f} %" if abs(value) < 0.01 else f"{100 * value:.1f} %"


def covers_text(covers: dict) -> list[str]:
    """What A's intervals span per point, and the variation they therefore leave out."""
    said = [f"{covers['runs']:g} runs"]
    left_out = []
    for what, one, many in (("boots", "sender boot", "sender boots"), ("blocks", "block", "blocks"),
                            ("machines", "machine", "machines"), ("days", "day", "days")):
        n = covers.get(what)
        if n is None:
            said.append(f"{many}: not recorded")
        else:
            said.append(f"{n:g} {one if n == 1 else many}")
        if n is None or n <= 1:
            left_out.append(many)
    text = [f"per point (median over points): {', '.join(said)}"]
    if left_out:
        text.append(f"they do not cover the variation between {', '.join(left_out)}")
    return text


def lines(cal, *, points: bool = False) -> list[str]:
    """The readable report of a :class:`~bbrlab.analysis.compare.Calibration`."""
    out = [f"A = {cal.a}: {cal.runs_a} ok runs, {cal.points_a} points",
           f"B = {cal.b}: {cal.runs_b} ok runs, {cal.points_b} points",
           f"matched {cal.matched} points by identical {', '.join(cal.keys)}; A only: {cal.points_a - cal.matched}, "
           f"B only: {cal.points_b - cal.matched}; value {cal.value}", "",
           f"B's point medians inside A's interval of the median ({level_text(cal.level)} asked):",
           f"  {'A states':<24}{'points':>7}{'inside':>8}{'fraction':>10}{'if only chance differed':>25}"]
    for r in cal.levels:
        out.append(f"  {r.stated:<24}{r.points:>7}{r.inside:>8}{_width(r.fraction):>10}{_width(r.expected):>25}")
    with_interval = cal.matched - cal.no_interval
    fraction = cal.inside / with_interval if with_interval else math.nan
    out.append(f"  {'all':<24}{with_interval:>7}{cal.inside:>8}{_width(fraction):>10}{_width(cal.expected):>25}")
    if cal.no_interval:
        out.append(f"  ({cal.no_interval} matched points have a single run in A: no interval)")
    out += ["", f"{'within +-10 % of A:':<28}{_pct(cal.agree, cal.matched)}"]
    c = cal.below_ceilings
    out.append(f"{'below 0.8 x both ceilings:':<28}" + (
        "one recording has no calibrated ceilings" if c is None else
        f"{c['points']} points; inside {_pct(c['inside'], c['points'])}, within +-10 % {_pct(c['agree'], c['points'])}"))
    h = cal.half_width
    reaching = (f"{_width(h['reaching'])} over the {h['reaching_n']} at {level_text(cal.level)} or more"
                if h["reaching_n"] else f"none reaches {level_text(cal.level)}")
    out.append(f"{'half-width / link rate:':<28}median {_width(h['all'])} over {h['all_n']} intervals; {reaching}")
    cover = covers_text(cal.covers)
    out.append(f"{'A intervals cover:':<28}{cover[0]}")
    out += [f"{'':<28}{t}" for t in cover[1:]]
    out.append(f"{'machines:':<28}{cal.machines['sentence']}")
    if points:
        out += ["", *point_lines(cal.points)]
    return out


def _condition(row: dict) -> str:
    parts = [str(row["variant"]), f"{row['cpu_share_pct']:g} %"]
    if row.get("timeslice_ms") is not None and row.get("contention_mode") != "none":
        parts.append(f"{row.get('contention_mode')} {row['timeslice_ms']:g} ms")
    for key, unit in (("rtt_ms", "ms"), ("rate_mbit", "Mbit/s"), ("buffer_bdp", "BDP"), ("duration_s", "s")):
        if row.get(key) is not None:
            parts.append(f"{row[key]:g} {unit}")
    if row.get("loss_pct"):
        parts.append(f"loss {row['loss_pct']:g} %")
    for key in ("queue_mode", "sender_qdisc", "sampler"):
        if row.get(key) not in (None, "bbrlab"):
            parts.append(str(row[key]))
    return ", ".join(parts)


def point_lines(frame) -> list[str]:
    """One line per matched point: the condition, A's interval and level, B's median, inside, B - A."""
    rows = frame.to_dict("records")
    wide = max([len("condition"), *(len(_condition(r)) for r in rows)]) + 2
    out = [f"  {'condition':<{wide}}{'A interval':>16}{'level':>8}{'B median':>10}{'inside':>8}{'B - A':>9}"]
    for row in rows:
        interval = "-" if row["inside"] is None else f"[{row['low_a']:.1f}, {row['high_a']:.1f}]"
        inside = "-" if row["inside"] is None else ("yes" if row["inside"] else "no")
        diff = (row["median_b"] - row["median_a"]) / row["median_a"] if row["median_a"] else math.nan
        out.append(f"  {_condition(row):<{wide}}{interval:>16}{level_text(row['level_a']):>8}"
                   f"{row['median_b']:>10.1f}{inside:>8}{_width(diff):>9}")
    return out
