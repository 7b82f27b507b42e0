"""The thresholds a search campaign found (issue #30): a table and a figure beside the paper's values.

A threshold search (:mod:`bbrlab.campaign.search`) leaves in its directory ``decisions.json``: per curve
(CCA x timeslice x RTT x rate ...) the probes, their sign-test verdicts and the interval ``(low, high]`` of
shares in which the median throughput first reaches the target fraction of the rate, at the search's stated
confidence. :func:`threshold_table` turns it into one row per curve; :func:`threshold_figure` draws each
interval beside the paper's thresholds (2BRobust: BBR recovers at 45 % share with 1 ms timeslices and 70 %
with 10 ms; the inflight-deficit patch moves them to 25 % and 40 %, figure 10).

An open end means the search found no share of the range on that side: ``low`` None is "at or below the
range's lowest share", ``high`` None is "never within the range".

Each row carries the level its interval holds at (Bonferroni over the curve's decided probes, each probe's
error exact: :mod:`bbrlab.campaign.search_coverage`) and :func:`coverage_lines` the joint level of all curves
and each probe's verdict. A search recorded before the interleaved order (schema ``bbrlab.search/1``, each
probe's runs back to back) is read too: its levels are computed from its rule and verdicts, and it is marked
``back to back``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from bbrlab.core.confidence import level_text

#: The paper's thresholds (percent share with the median above 80 % of the rate), by variant and timeslice (ms),
#: as the patch's comparison states them (figures 10 and 15; figure 4 reads 65 % at 10 ms).
PAPER_THRESHOLD_PCT = {("bbr", 1.0): 45.0, ("bbr", 10.0): 70.0, ("bbr2b", 1.0): 25.0, ("bbr2b", 10.0): 40.0}
COLUMNS = ("cca", "timeslice_ms", "rtt_ms", "rate_mbit", "target_pct", "low_pct", "high_pct", "estimate_pct",
           "confidence", "level", "runs", "probes", "done", "paper_pct", "order")


def read_search(campaign_dir: str | Path) -> dict:
    """A search's ``decisions.json``, either schema; a back-to-back one (``bbrlab.search/1``) gains the levels
    the interleaved one states (``coverage``, each curve's ``decided`` and ``level``) and ``order``."""
    from bbrlab.campaign import search_coverage
    from bbrlab.campaign.search import SearchRule

    path = Path(campaign_dir) / "decisions.json"
    try:
        decisions = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: no decisions of a threshold search ({e})") from None
    if not isinstance(decisions, dict) or "search" not in decisions:
        raise ValueError(f"{path} is not a threshold search's (no 'search' rule; adaptive repetitions?)")
    if "coverage" in decisions:
        return decisions
    plan = SearchRule.from_value(decisions["search"]).plan(1.0)
    error = search_coverage.plan_error(plan)
    curves = []
    for c in decisions["decisions"]:
        decided = sum(p["verdict"] != "undecided" for p in c["probes"])
        probes = [{**p, "level": None if p["verdict"] == "undecided" else 1 - error} for p in c["probes"]]
        curves.append({**c, "probes": probes, "decided": decided,
                       "level": search_coverage.curve_level(decided, error)})
    return {**decisions, "order": "back to back", "decisions": curves,
            "coverage": search_coverage.statement(plan, [c["decided"] for c in curves])}


def threshold_table(campaign_dir: str | Path) -> pd.DataFrame:
    """One row per searched curve of the campaign in ``campaign_dir`` (its ``decisions.json``).

    Columns: ``cca``, ``timeslice_ms``, ``rtt_ms``, ``rate_mbit``, ``target_pct`` (of the rate), ``low_pct`` and
    ``high_pct`` (the threshold lies in (low, high]; None: open), ``estimate_pct`` (the interval's middle, None
    when an end is open), ``confidence`` (asked), ``level`` (the level the curve's interval holds at), ``runs``
    and ``probes`` taken, ``done`` (False: still searching), ``paper_pct`` (the paper's value for that CCA and
    timeslice, None where it states none), ``order`` (``interleaved`` or ``back to back``).
    """
    decisions = read_search(campaign_dir)
    rule = decisions["search"]
    rows = []
    for c in decisions["decisions"]:
        curve = c["curve"]
        cca, ts = curve["flow"]["cca"], float(curve["contention"]["timeslice_ms"])
        low, high = c["threshold_low_pct"], c["threshold_high_pct"]
        rows.append({"cca": cca, "timeslice_ms": ts, "rtt_ms": curve["link"]["rtt_ms"],
                     "rate_mbit": c["rate_mbit"], "target_pct": 100 * rule["target"], "low_pct": low,
                     "high_pct": high, "estimate_pct": (low + high) / 2 if low is not None and high is not None
                     else None, "confidence": rule["confidence"], "level": c["level"], "runs": c["runs"],
                     "probes": len(c["probes"]), "done": c["done"],
                     "paper_pct": PAPER_THRESHOLD_PCT.get((cca, ts)),
                     "order": decisions["order"]})
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    return table.sort_values(["cca", "timeslice_ms", "rtt_ms", "rate_mbit"], ignore_index=True)


def format_table(table: pd.DataFrame) -> str:
    """The table as text: each threshold as ``(low, high]`` with the paper's value beside it."""

    def pct(v) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"

    lines = [f"{'cca':6} {'ts ms':>5} {'rtt ms':>6} {'Mbit/s':>7}  {'threshold % share':22} {'paper':>5} "
             f"{'runs':>5} {'probes':>6} {'level':>6}"]
    for r in table.itertuples():
        low = "below range" if r.low_pct is None or pd.isna(r.low_pct) else f"({pct(r.low_pct)}"
        high = "never" if r.high_pct is None or pd.isna(r.high_pct) else f"{pct(r.high_pct)}]"
        interval = f"{low}, {high}" + ("" if r.done else " searching")
        lines.append(f"{r.cca:6} {r.timeslice_ms:>5g} {r.rtt_ms:>6g} {r.rate_mbit:>7g}  {interval:22} "
                     f"{pct(r.paper_pct):>5} {r.runs:>5} {r.probes:>6} {level_text(r.level):>6}")
    return "\n".join(lines)


def coverage_lines(campaign_dir: str | Path) -> list[str]:
    """The search's coverage as text: the method, the joint level of every curve's interval, and per curve
    each probe's share, verdict, runs and level (its runs' first and last position in the order when
    interleaved)."""
    d = read_search(campaign_dir)
    cov = d["coverage"]
    lines = [f"order: {d['order']}" + (f" (seed {d['seed']})" if "seed" in d else ""),
             f"coverage: every curve's interval at once {level_text(cov['joint_level'])} "
             f"({cov['decisions']} decided probes, each wrong with at most {cov['probe_error']:.2g}; "
             f"asked {level_text(cov['asked'])}; {cov['method']})"]
    for c in d["decisions"]:
        curve = c["curve"]
        probes = ", ".join(_probe_text(p) for p in c["probes"])
        lines.append(f"{curve['flow']['cca']} {float(curve['contention']['timeslice_ms']):g} ms, "
                     f"{curve['link']['rtt_ms']:g} ms RTT, {c['rate_mbit']:g} Mbit/s: "
                     f"{level_text(c['level'])} over {c['decided']} decided probe(s): {probes}")
    return lines


def _probe_text(p: dict) -> str:
    """One probe: ``"35 % below n=10 99.7 % runs 12-57"`` (its runs' first and last position when recorded)."""
    text = f"{p['share']:g} % {p['verdict']} n={p['n']}"
    if p.get("level") is not None:
        text += f" {level_text(p['level'])}"
    first, last = (p.get("positions") or [None, None])
    return text + (f" runs {first}-{last}" if first is not None else "")


def threshold_figure(table: pd.DataFrame):
    """Each threshold's interval as a bar from ``low`` to ``high`` per CCA and timeslice, the paper's value as a
    cross beside it; an open end reaches the axis (0 or 100 %). Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    slices = sorted(table["timeslice_ms"].unique())
    ccas = sorted(table["cca"].unique())
    width = 0.8 / max(1, len(ccas))
    for j, cca in enumerate(ccas):
        part = table[table["cca"] == cca]
        for r in part.itertuples():
            x = slices.index(r.timeslice_ms) + (j - (len(ccas) - 1) / 2) * width
            low = 0.0 if r.low_pct is None or pd.isna(r.low_pct) else r.low_pct
            high = 100.0 if r.high_pct is None or pd.isna(r.high_pct) else r.high_pct
            ax.bar(x, high - low, bottom=low, width=width * 0.6, color=f"C{j}", alpha=0.6,
                   label=f"{cca} (measured interval)" if r.Index == part.index[0] else None)
            if r.paper_pct is not None and not pd.isna(r.paper_pct):
                ax.plot(x + width * 0.35, r.paper_pct, "x", color=f"C{j}", markersize=9,
                        label=f"{cca} (paper)" if r.Index == part.index[0] else None)
    ax.set_xticks(range(len(slices)), [f"{s:g} ms" for s in slices])
    ax.set_xlabel("timeslice")
    ax.set_ylabel("CPU share where the median reaches the target (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
