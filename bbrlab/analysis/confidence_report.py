"""The fidelity report's statistics (issue #30): each recovery threshold with its interval, and patched against
original BBR compared at every point by an effect size and a rank test.

:func:`threshold_rows` reads the thresholds off a grid of shares: per curve (variant, timeslice, RTT, rate,
queue ...) the median link utilisation at each tested share with its order-statistic interval (95 % asked; the
level each reaches is kept, ``point_level`` the lowest of a curve's), and from them
(:func:`bbrlab.analysis.stats.threshold_interval`) the share from which the median reaches 80 % of the rate,
bracketed by the shares whose intervals lie wholly below and wholly above it. A grid of shares 15-50 points
apart brackets coarsely; :func:`search_rows` reads the thresholds a threshold search campaign found
(:mod:`bbrlab.analysis.thresholds`), which bracket to the search's resolution.

:func:`comparison_rows` puts patched and original BBR side by side at every point both were run at (the same
contention, link, queue and flows): the medians, the Hodges-Lehmann shift, Cliff's delta and the two-sided
Mann-Whitney p, with Holm's correction over the points of one pair (many points are tested, and some would
look "different" by chance). A point is called different only when the corrected p is below 0.05; with
few repetitions a rank test cannot get there (two runs a side give p >= 1/3), and the row then says so, with no
test, no shift and no effect size (:func:`bbrlab.analysis.stats.too_few_to_compare`: below 4 runs a side).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bbrlab.analysis import runkey, stats
from bbrlab.analysis.data import replication_values, summarise
from bbrlab.analysis.paper_claims import PAPER_PATCHED_RECOVERY_PCT, PAPER_RECOVERY_PCT, RECOVERED_UTILISATION

#: Columns that make two runs of one variant the same experiment apart from the CPU share: the run-identity key
#: (:mod:`bbrlab.analysis.runkey`) without the variant and the share (those present in the table count).
CURVE_KEYS = tuple(k for k in runkey.RUN_KEY if k not in ("variant", "cpu_share_pct"))
#: The setting's columns: uncontended runs (share 100) join every contended curve that agrees on them (and on
#: the CCA: cca, kernel).
LINK_KEYS = tuple(k for k in CURVE_KEYS if k not in runkey.CONTENTION_KEY)
#: The family-wise error rate of the patched-vs-original calls (Holm over one pair's points).
ALPHA = 0.05
THRESHOLD_COLUMNS = ("variant", "timeslice_ms", "rtt_ms", "rate_mbit", "queue", "setting", "shares_tested", "runs",
                     "estimate_pct", "low_pct", "high_pct", "interval", "point_level", "paper_pct",
                     "paper_inside")
COMPARISON_COLUMNS = ("original", "patched", "contention_mode", "timeslice_ms", "cpu_share_pct", "rtt_ms",
                      "rate_mbit", "queue", "setting", "unit", "n_original", "n_patched", "median_original_mbit",
                      "median_patched_mbit", "shift_mbit", "shift_pct_of_rate", "cliffs_delta", "magnitude",
                      "p_value", "p_holm", "call")


#: Columns without which no threshold or comparison can be read (a table lacking one gives empty tables).
NEEDED = ("variant", "contention_mode", "cpu_share_pct", "link_utilisation", "throughput_mbit")


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    if any(c not in runs.columns for c in NEEDED):
        return runs.iloc[0:0]
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    return ok[ok["link_utilisation"].notna()]


def _keys(runs: pd.DataFrame, keys) -> list[str]:
    return [k for k in keys if k in runs.columns]


def _queue(row) -> str:
    mode, bdp = row.get("queue_mode"), row.get("buffer_bdp")
    if mode == "authors":
        return "authors' queue"
    return f"{bdp:.3g} BDP" if isinstance(bdp, float) and not math.isnan(bdp) else ""


def _setting(key: dict) -> str:
    """What else sets a curve or point apart, in words: the transfer's duration, the sender's qdisc, and loss,
    streams and flows where they are not the plain case (e.g. ``"8 s, fq_codel, loss 1 %, 2 flows"``)."""
    parts = []
    if pd.notna(key.get("duration_s")):
        parts.append(f"{key['duration_s']:g} s")
    if pd.notna(key.get("sender_qdisc")):
        parts.append(str(key["sender_qdisc"]))
    if pd.notna(key.get("loss_pct")) and key["loss_pct"] > 0:
        parts.append(f"loss {key['loss_pct']:g} %")
    for name in ("streams", "flows"):
        if pd.notna(key.get(name)) and key[name] > 1:
            parts.append(f"{key[name]:g} {name}")
    return ", ".join(parts)


def _paper_pct(variant: str, timeslice_ms: float) -> float | None:
    table = PAPER_PATCHED_RECOVERY_PCT if "patched" in variant else PAPER_RECOVERY_PCT
    return table.get(float(timeslice_ms)) if variant.startswith("BBR") else None


def threshold_rows(runs: pd.DataFrame, target: float = RECOVERED_UTILISATION) -> pd.DataFrame:
    """Each BBR curve's recovery threshold under SCHED_DEADLINE with its interval (see the module's text).

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table; ok runs with a link utilisation count, per curve of :data:`CURVE_KEYS`.
    target : float, default 0.8
        The utilisation that counts as recovered (the paper's 80 %).

    Returns
    -------
    pandas.DataFrame
        :data:`THRESHOLD_COLUMNS`: ``estimate_pct`` (lowest share from which every median reaches the target;
        None: no contended share does), ``low_pct``/``high_pct`` (the threshold lies in (low, high] with
        each point's interval at its level; None: open), ``interval`` as text, ``point_level`` the lowest level
        a point's interval of the curve reaches (the bracket errs with probability at most 1 - that), the paper's value and whether the interval holds it.
    """
    ok = _ok(runs)
    ok = ok[ok["variant"].astype(str).str.startswith("BBR")] if "variant" in ok else ok.iloc[0:0]
    contended = ok[(ok["contention_mode"] == "deadline") & (ok["cpu_share_pct"] < 100)] if len(ok) else ok
    full = ok[ok["cpu_share_pct"] >= 100] if len(ok) else ok
    keys, link = _keys(ok, CURVE_KEYS), _keys(ok, LINK_KEYS)
    rows = []
    for (variant, *values), curve in contended.groupby(["variant", *keys], dropna=False, sort=True):
        key = dict(zip(keys, values, strict=True))
        uncontended = full[(full["variant"] == variant) & runkey.same(full, {k: key[k] for k in link})].copy()
        uncontended["cpu_share_pct"] = 100.0
        points = summarise(pd.concat([curve, uncontended]), ["cpu_share_pct"], value="link_utilisation")
        found = stats.threshold_interval(points["cpu_share_pct"], points["median"], points["ci_low"], points["ci_high"],
                                         target)
        paper = _paper_pct(str(variant), key["timeslice_ms"])
        rows.append({"variant": variant, "timeslice_ms": key["timeslice_ms"], "rtt_ms": key.get("rtt_ms"),
                     "rate_mbit": key.get("rate_mbit"), "queue": _queue(key),
                     "setting": _setting(key), "shares_tested": ", ".join(f"{s:g}" for s in points["cpu_share_pct"]), "runs": int(points["n"].sum()),
                     "estimate_pct": found.estimate, "low_pct": found.low, "high_pct": found.high,
                     "interval": found.text(), "point_level": float(points["ci_level"].min()), "paper_pct": paper,
                     "paper_inside": None if paper is None else found.contains(paper)})
    return pd.DataFrame(rows, columns=list(THRESHOLD_COLUMNS))


def comparison_rows(runs: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """Patched against original at every point both were run at (see the module's text).

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table; ok runs count, their ``throughput_mbit``.
    pairs : list of (str, str)
        (original, patched) variants, e.g. :func:`bbrlab.analysis.fidelity.bbr_variants`'s second value.

    Returns
    -------
    pandas.DataFrame
        :data:`COMPARISON_COLUMNS`, one row per pair and point: ``shift_mbit`` is the Hodges-Lehmann shift of
        patched against original, ``cliffs_delta`` P(patched > original) - P(patched < original), ``p_holm``
        the Mann-Whitney p after Holm's correction over the pair's points, ``call`` the verdict in words.
    """
    ok = runkey.with_identity(_ok(runs))
    keys = _keys(ok, ("cpu_share_pct", *(k for k in CURVE_KEYS if k != "cca")))  # the pair's modules differ in name
    rows = []
    for original, patched in pairs:
        both = ok[ok["variant"].isin([original, patched])]
        first = len(rows)
        for values, point in both.groupby(keys, dropna=False, sort=True):
            a, b, unit = _samples(point[point["variant"] == original], point[point["variant"] == patched])
            if not len(a) or not len(b):
                continue
            key = dict(zip(keys, values, strict=True))
            c = stats.compare(a, b)
            rate = key.get("rate_mbit")
            rows.append({"original": original, "patched": patched, "contention_mode": key.get("contention_mode"),
                         "timeslice_ms": key.get("timeslice_ms"), "cpu_share_pct": key["cpu_share_pct"],
                         "rtt_ms": key.get("rtt_ms"), "rate_mbit": rate, "queue": _queue(key),
                         "setting": _setting(key), "unit": unit, "n_original": c.n_a, "n_patched": c.n_b, "median_original_mbit": c.median_a,
                         "median_patched_mbit": c.median_b, "shift_mbit": c.shift,
                         "shift_pct_of_rate": 100 * c.shift / rate if rate else math.nan,
                         "cliffs_delta": c.cliffs_delta, "magnitude": c.magnitude(), "p_value": c.p_value})
        holm = holm_adjust([r["p_value"] for r in rows[first:]])
        for row, p in zip(rows[first:], holm, strict=True):
            row["p_holm"] = p
            row["call"] = _call(row)
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))


def _samples(a: pd.DataFrame, b: pd.DataFrame) -> tuple:
    """The two sides' values to compare and their unit: each block's median when both sides span blocks (blocks,
    not runs, are the independent units; :func:`bbrlab.analysis.data.replication_values`), else the runs."""
    (va, unit_a), (vb, unit_b) = replication_values(a), replication_values(b)
    if unit_a == unit_b == "block":
        return va, vb, "block"
    return a["throughput_mbit"].to_numpy(dtype=float), b["throughput_mbit"].to_numpy(dtype=float), "run"


#: The columns of :func:`block_rows`.
BLOCK_COLUMNS = ("variant", "contention_mode", "timeslice_ms", "cpu_share_pct", "rtt_ms", "rate_mbit", "queue",
                 "setting", "runs", "blocks", "median_mbit", "interval", "within_block_sd_mbit",
                 "between_block_sd_mbit")


def block_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """Every point whose runs came in blocks (each on a boot of its own): its runs and blocks, the median and the
    interval over the blocks' medians with its level, and the throughput's spread within and between blocks."""
    ok = _ok(runs)
    if "block" not in ok.columns or ok["block"].isna().all():
        return pd.DataFrame(columns=list(BLOCK_COLUMNS))
    keys = _keys(ok, ("cpu_share_pct", *CURVE_KEYS))
    table = summarise(ok[ok["block"].notna()], ["variant", *keys])
    rows = []
    for r in table[table["unit"] == "block"].to_dict(orient="records"):
        ranks = stats.median_interval(range(int(r["blocks"]))).text().replace("n = ", "blocks = ")  # its ranks, level
        rows.append({"variant": r["variant"], "contention_mode": r.get("contention_mode"),
                     "timeslice_ms": r.get("timeslice_ms"), "cpu_share_pct": r["cpu_share_pct"],
                     "rtt_ms": r.get("rtt_ms"), "rate_mbit": r.get("rate_mbit"), "queue": _queue(r),
                     "setting": _setting(r), "runs": int(r["n"]), "blocks": int(r["blocks"]), "median_mbit": r["median"],
                     "interval": f"[{r['ci_low']:.1f}, {r['ci_high']:.1f}] ({ranks})",
                     "within_block_sd_mbit": r["within_block_sd"], "between_block_sd_mbit": r["between_block_sd"]})
    return pd.DataFrame(rows, columns=list(BLOCK_COLUMNS))


def block_lines(rows: pd.DataFrame) -> list[str]:
    """The report's section on points run in blocks (nothing when there are none)."""
    if rows.empty:
        return []
    lines = ["", "## Spread within and between blocks", "",
             "Points whose repetitions ran in blocks, each block on a fresh boot of the sender (`blocks:` in the "
             "spec). The block, not the run, is the unit of replication: the interval is the order-statistic "
             "interval over the blocks' medians, its level exact for that many blocks (docs/statistics.md). "
             "`within` is the runs' standard deviation inside their block (pooled), `between` that of the blocks' "
             "medians: a `between` well above `within` is variation that runs on one boot cannot show.", "",
             "| variant | contention | share | RTT | rate | queue | also | runs | blocks | median (Mbit/s) | interval "
             "| within | between |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        contention = r.contention_mode if pd.isna(r.timeslice_ms) else f"{r.contention_mode} {r.timeslice_ms:g} ms"
        lines.append(f"| {r.variant} | {contention} | {r.cpu_share_pct:g} % | {r.rtt_ms:g} ms | {r.rate_mbit:g} Mbit/s "
                     f"| {r.queue} | {r.setting} | {r.runs} | {r.blocks} | {r.median_mbit:.1f} | {r.interval} | "
                     f"{_signed(r.within_block_sd_mbit, '.2f')} | {_signed(r.between_block_sd_mbit, '.2f')} |")
    return lines


def holm_adjust(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (NaN stays NaN): reject at ``ALPHA`` where adjusted p < ALPHA."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    out, running = [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (len(indexed) - rank) * p))
        out[i] = running
    return out


def _call(row: dict) -> str:
    if stats.too_few_to_compare(row["n_original"], row["n_patched"], ALPHA):
        return f"too few {row.get('unit', 'run')}s for the test ({row['n_original']} vs {row['n_patched']})"
    if math.isnan(row["p_holm"]):
        return "no test"
    if row["p_holm"] < ALPHA:
        return "patched higher" if row["cliffs_delta"] > 0 else "patched lower"
    return "no difference shown"


def _signed(value: float, fmt: str, unit: str = "") -> str:
    return "-" if value is None or pd.isna(value) else f"{value:{fmt}}{unit}"


def _p_text(r) -> str:
    return "-" if pd.isna(r.p_value) else f"{r.p_value:.3g} ({_signed(r.p_holm, '.3g')})"


def _shift(r) -> str:
    if pd.isna(r.shift_mbit):
        return "-"
    return f"{r.shift_mbit:+.1f} Mbit/s ({_signed(r.shift_pct_of_rate, '+.0f')} % of rate)"


def search_rows(data_dir: str | Path) -> pd.DataFrame:
    """The thresholds of every threshold search under ``data_dir`` (a ``decisions.json`` with a ``search``
    rule), one row per curve with its campaign (:func:`bbrlab.analysis.thresholds.threshold_table`)."""
    from bbrlab.analysis import thresholds

    frames = []
    for path in sorted(Path(data_dir).rglob("decisions.json")):
        try:
            table = thresholds.threshold_table(path.parent)
        except ValueError:
            continue  # adaptive repetitions' decisions, not a search's
        frames.append(table.assign(campaign=path.parent.name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["campaign", *thresholds.COLUMNS])


def report_lines(thresholds: pd.DataFrame, comparisons: pd.DataFrame, searched: pd.DataFrame | None = None) -> list[str]:
    """The report's sections on thresholds and on patched against original (Markdown lines)."""
    lines = ["", "## Recovery thresholds with their intervals", "",
             "Per curve, the share from which the median link utilisation reaches 80 % of the rate, and the "
             "interval (low, high] that holds it: the highest share whose median's interval lies below 80 %, the "
             "lowest from which every interval lies above. Each point's interval is the order-statistic interval "
             "of its median, at 95 % where its runs allow and else [min, max] at the level its n reaches (50 % "
             "at 2 runs); `point level` is the lowest of the curve's, and the bracket holds with at least that "
             "probability. A coarse grid gives wide intervals; `?` is an open end."]
    if thresholds.empty:
        lines += ["", "No contended BBR curve in this data."]
    else:
        lines += ["", "| variant | timeslice | RTT | rate | queue | also | shares tested | runs | threshold | "
                  "point level | paper | paper inside |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in thresholds.itertuples():
            paper = "-" if r.paper_pct is None or pd.isna(r.paper_pct) else f"{r.paper_pct:g} %"
            inside = "-" if r.paper_inside is None else ("yes" if r.paper_inside else "no")
            lines.append(f"| {r.variant} | {r.timeslice_ms:g} ms | {r.rtt_ms:g} ms | {r.rate_mbit:g} Mbit/s | "
                         f"{r.queue} | {r.setting} | {r.shares_tested} | {r.runs} | {r.interval} | "
                         f"{stats.level_text(r.point_level)} | {paper} | {inside} |")
    if searched is not None and not searched.empty:
        lines += ["", "Found by threshold search campaigns (noisy bisection, docs/statistics.md; each interval at "
                  "the level its decided probes give together):", "",
                  "| campaign | CCA | timeslice | RTT | rate | threshold in | runs | done | paper |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in searched.itertuples():
            low = "?" if r.low_pct is None or pd.isna(r.low_pct) else f"{r.low_pct:g}"
            high = "never" if r.high_pct is None or pd.isna(r.high_pct) else f"{r.high_pct:g}"
            paper = "-" if r.paper_pct is None or pd.isna(r.paper_pct) else f"{r.paper_pct:g} %"
            lines.append(f"| {r.campaign} | {r.cca} | {r.timeslice_ms:g} ms | {r.rtt_ms:g} ms | "
                         f"{r.rate_mbit:g} Mbit/s | ({low}, {high}] % at {stats.level_text(r.level)} | {r.runs} | "
                         f"{'yes' if r.done else 'no'} | {paper} |")
    lines += ["", "## Patched against original at every point", "",
              "Both variants at the same contention, link, queue and flows: medians, the Hodges-Lehmann shift "
              "(patched minus original), Cliff's delta, and the two-sided Mann-Whitney p with Holm's correction "
              f"over each pair's points; a difference is called where the corrected p is below {ALPHA:g}. Below 4 runs "
              "a side the exact test cannot reach p < 0.05 and Cliff's delta takes a handful of values: such a "
              "point gets no shift, no effect size and no test (`n too small`)."]
    if comparisons.empty:
        return [*lines, "", "No point with both patched and original runs."]
    lines += ["", "| pair | contention | share | RTT | rate | queue | also | n | medians (Mbit/s) | shift | "
              "Cliff's delta | p (Holm) | call |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in comparisons.itertuples():
        contention = r.contention_mode if pd.isna(r.timeslice_ms) else f"{r.contention_mode} {r.timeslice_ms:g} ms"
        lines.append(f"| {r.original} vs {r.patched} | {contention} | {r.cpu_share_pct:g} % | {r.rtt_ms:g} ms | "
                     f"{r.rate_mbit:g} Mbit/s | {r.queue} | {r.setting} | {r.n_original} vs {r.n_patched}"
                     f"{' blocks' if r.unit == 'block' else ''} | "
                     f"{r.median_original_mbit:.1f} -> {r.median_patched_mbit:.1f} | {_shift(r)} | "
                     f"{_signed(r.cliffs_delta, '+.2f')} ({r.magnitude}) | "
                     f"{_p_text(r)} | {r.call} |")
    return lines
