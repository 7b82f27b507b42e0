"""The paper's main claims, side by side with what a dataset shows.

Each claim is computed from the tidy tables (:mod:`bbrlab.analysis.data`); nothing is typed in by hand. The
claims themselves, one function each, are in :mod:`bbrlab.analysis.paper_claims`; this module judges a
dataset with them (:func:`claims`) and writes the report (:func:`write_report`). The verdict is one of
``reproduced``, ``partly``, ``not reproduced`` or ``no data`` (the dataset lacks the dimension the claim
needs), and ``measured`` says the numbers behind it.

The paper's numbers come from KVM guests on 24-core servers; the local testbed runs under QEMU TCG on a
small machine, where the guest needs far more host CPU per packet. A claim that does not reproduce there is
a finding about that testbed, not a failure of the toolkit.

CPU-bound points are set aside: a point whose link rate is at or above the sender's CPU ceiling at its
timeslice, share and RTT (``ceiling_mbit``, measured by ``bbrlab calibrate``, docs/calibration.md)
measures the sender's CPU, not its congestion control, so no claim is judged on it
(:func:`split_by_ceiling`). Each claim lists the points it set aside and why (``set_aside``); points
without a ceiling (no calibration) are judged as they are, and :func:`testbed_note` says how many. Points
whose runs carried MORE than their ceiling (the ceiling does not bound them) are counted there too and
listed in the report (:mod:`bbrlab.calibration.check`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bbrlab.calibration.check import ceiling_exceeded, report_lines
from bbrlab.scenario.workloads import IperfParams

from . import confidence_report, evidence, paper_setup, runkey
from .data import select
from .paper_claims import (
    LOW_SHARES_PCT,
    claim_bandwidth_independent,
    claim_bbr_capped,
    claim_cubic_robust,
    claim_inflight_deficit,
    claim_patch_lowers_threshold,
    claim_patched_gain,
    claim_recovery_thresholds,
    claim_testbeds_agree,
    medians,
)


@dataclass
class CeilingSplit:
    """Runs split by the sender's CPU ceiling.

    Attributes
    ----------
    judged : pandas.DataFrame
        The runs of points below their ceiling, or without one.
    set_aside : pandas.DataFrame
        One row per point set aside: the run-identity key (:data:`bbrlab.analysis.runkey.RUN_KEY`), ``ceiling_mbit``, ``throughput_mbit`` (medians),
        ``n`` and ``reason``.
    points, unchecked : int
        Points in all, and points without a ceiling.
    """

    judged: pd.DataFrame
    set_aside: pd.DataFrame
    points: int
    unchecked: int

    def reasons(self, variants: tuple[str, ...], shares: tuple[float, float] | None = None,
                contended_only: bool = False) -> list[str]:
        """The set-aside points of ``variants`` (within ``shares``, or below 100 % share), as text."""
        a = self.set_aside
        if a.empty:
            return []
        a = a[a["variant"].isin(variants)]
        if shares is not None:
            a = a[a["cpu_share_pct"].between(*shares)]
        if contended_only:
            a = a[a["cpu_share_pct"] < 100]
        return a["reason"].tolist()



def split_by_ceiling(runs: pd.DataFrame) -> CeilingSplit:
    """Keep the runs of points whose link rate is below their ceiling (or that have none); set the rest aside.

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table with ``ceiling_mbit`` (see :mod:`bbrlab.analysis.tables`).

    Returns
    -------
    CeilingSplit
    """
    keys = runkey.key_columns(runs)
    if runs.empty or "ceiling_mbit" not in runs.columns:
        n = 0 if runs.empty else len(runkey.identity(runs).drop_duplicates())
        return CeilingSplit(runs, pd.DataFrame(columns=[*keys, "reason"]), n, n)
    g = runkey.with_identity(runs).groupby(keys, dropna=False, sort=True)
    per_point = g.agg(ceiling_mbit=("ceiling_mbit", "median"), throughput_mbit=("throughput_mbit", "median"),
                      n=("run_id", "count")).reset_index()
    aside = (per_point["ceiling_mbit"].notna() & (per_point["rate_mbit"] >= per_point["ceiling_mbit"])).to_numpy()
    judged = runs[~aside[g.ngroup().to_numpy()]]
    set_aside = per_point[aside]
    set_aside = set_aside.assign(reason=[_aside_reason(r) for r in set_aside.itertuples()])
    return CeilingSplit(judged, set_aside.reset_index(drop=True), len(per_point),
                        int(per_point["ceiling_mbit"].isna().sum()))



def _aside_reason(r) -> str:
    share = "100 %" if r.cpu_share_pct >= 100 else f"{r.timeslice_ms:g} ms / {r.cpu_share_pct:g} %"
    return (f"{r.variant} at {share}, RTT {r.rtt_ms:g} ms: link {r.rate_mbit:g} Mbit/s >= CPU ceiling "
            f"{r.ceiling_mbit:.1f} Mbit/s (median throughput {r.throughput_mbit:.1f})")



def testbed_note(runs: pd.DataFrame) -> str:
    """Where the data ran, from the records themselves.

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table.

    Returns
    -------
    str
        e.g. ``"54 runs; testbed local; accelerator tcg; sender kernel 6.1.0-56-amd64; CPU ceiling known for
        ..."`` (see :func:`ceiling_note`).
    """
    if runs.empty:
        return "no runs"
    acc = ", ".join(sorted(str(a) for a in runs["accelerator"].dropna().unique())) or "unknown"
    kern = ", ".join(sorted(str(k) for k in runs.get("kernel", pd.Series()).dropna().unique())) or "unknown"
    kind = ", ".join(sorted(str(k) for k in runs.get("testbed_kind", pd.Series()).dropna().unique())) or "unknown"
    return f"{len(runs)} runs; testbed {kind}; accelerator {acc}; sender kernel {kern}; {ceiling_note(runs)}"



def ceiling_note(runs: pd.DataFrame) -> str:
    """How many points have a CPU ceiling and how many of them are set aside (link rate at or above it)."""
    split = split_by_ceiling(runs[runs["status"] == "ok"] if "status" in runs else runs)
    if split.points == 0:
        return "no points"
    if split.unchecked == split.points:
        return "no CPU ceiling calibrated: every point judged (CPU-bound points may be among them)"
    text = (f"CPU ceiling known for {split.points - split.unchecked} of {split.points} points, "
            f"{len(split.set_aside)} set aside (link rate at or above it)")
    text += f"; {split.unchecked} points without a ceiling judged as they are" if split.unchecked else ""
    above = len(ceiling_exceeded(runs))
    return text + (f"; {above} point(s) with runs above their ceiling (it does not bound them)" if above else "")



def bbr_variants(runs: pd.DataFrame) -> tuple[list[str], list[tuple[str, str]]]:
    """The stock BBR variants in the data, and the (stock, patched) pairs of one version both present.

    Without any, BBRv1 (and BBRv1 vs BBRv1 patched) so that the claims say ``no data``.
    """
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    present = ok.dropna(subset=["bbr_version"]).drop_duplicates("variant") if "bbr_version" in ok else ok.iloc[0:0]
    stock = sorted(present.loc[~present["patched"].astype(bool), "variant"])
    pairs = [(v, p) for v in stock for p in sorted(present.loc[present["patched"].astype(bool), "variant"])
             if p.startswith(v + " patched")]
    return stock or ["BBRv1"], pairs or [("BBRv1", "BBRv1 patched")]



#: What the claims are judged apart in: the run-identity key without the CCA and the contention (which the claims
#: compare) and without the sampler (the throughput claims take unsampled runs, the socket claims the sampled runs'
#: samples; neither pools the two).
CLAIM_SETTING = tuple(c for c in runkey.SETTING_KEY if c != "sampler")


def _sort_key(setting: dict) -> list:
    return [(1, "") if paper_setup.runkey_text(v) == "<missing>" else (0, v) if isinstance(v, int | float) else (0, str(v))
            for v in setting.values()]


def claims(tables) -> pd.DataFrame:
    """Every claim as a row, on the runs whose identity matches the paper's setup (:mod:`bbrlab.analysis.paper_setup`:
    one bulk iperf3 flow, SCHED_DEADLINE, no loss, no fq), judged apart in every setting they hold
    (:data:`CLAIM_SETTING`: queue, RTT, rate, duration, kernel, machine ...; the subject then names what sets the
    setting apart, e.g. ``Cubic [RTT 20 ms, 100 Mbit/s, 1 BDP, 8 s]``). A claim with no data in a setting gets no row
    there when another setting has data for it. Figure 7's claim compares rates, so it is judged in every setting
    but the rate. Columns ``setting``, ``runs`` and ``points`` say where each claim was judged and on how many
    runs and conditions (run identities). See :func:`claims_of_one_setting`."""
    paper = paper_setup.restrict(tables).tables
    frames = [_judged_apart(paper, paper.runs, CLAIM_SETTING, claims_of_one_setting)]
    by_rate = tuple(c for c in CLAIM_SETTING if c != "rate_mbit")
    frames.append(_judged_apart(paper, paper.runs, by_rate, bandwidth_claims))
    table = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else frames[0]
    return _without_empty_repeats(table)


def _judged_apart(tables, runs: pd.DataFrame, key: tuple[str, ...], judge) -> pd.DataFrame:
    """``judge`` (tables -> claims table) on the runs of each setting of ``key`` in ``runs``."""
    groups = sorted(runkey.settings(runs, key), key=_sort_key) or [{}]
    varying = paper_setup.varying_columns(groups)
    ids = runkey.identity(runs, key)
    frames = []
    for setting in groups:
        part = runs[runkey.same(ids, setting)] if setting else runs
        table = judge(tables.with_runs(part, []))
        label = paper_setup.setting_label(setting, varying)
        table["subject"] = table["subject"] + (f" [{label}]" if label else "")
        plain = part[~part["ss_sampled"].fillna(False).astype(bool)] if "ss_sampled" in part else part
        table = table.assign(setting=label, runs=len(part), points=len(runkey.identity(plain).drop_duplicates()))
        frames.append(table)
    return pd.concat(frames, ignore_index=True)


def _without_empty_repeats(table: pd.DataFrame) -> pd.DataFrame:
    """Drop a claim's ``no data`` rows where the same claim (key and subject's variant) has data elsewhere."""
    if table.empty:
        return table
    base = table["subject"].str.replace(r" \[.*\]$", "", regex=True)
    has_data = (table["verdict"] != "no data").groupby([table["key"], base]).transform("any")
    drop = (table["verdict"] == "no data") & has_data
    keep = table[~drop]
    first_empty = keep[keep["verdict"] == "no data"].assign(_b=base).drop_duplicates(["key", "_b"]).index
    return keep[(keep["verdict"] != "no data") | keep.index.isin(first_empty)].reset_index(drop=True)


def bandwidth_claims(tables) -> pd.DataFrame:
    """Figure 7's claim (BBR's throughput at low shares does not depend on the rate) on every stock BBR variant,
    judged below the sender's CPU ceiling on unsampled iperf3 runs."""
    plain = split_by_ceiling(select(tables, ss_sampled=False, workload=IperfParams.name).runs)
    med = medians(plain.judged)
    stock, _ = bbr_variants(tables.runs)
    rows = [(claim_bandwidth_independent(med, v), plain.reasons((v,), shares=LOW_SHARES_PCT)) for v in stock]
    return _rows_table(rows)


def _rows_table(rows) -> pd.DataFrame:
    for claim, aside in rows:
        claim.set_aside = aside
        if aside:
            claim.measured += f" [judged below the sender's CPU ceiling; {len(aside)} point(s) set aside]"
    return pd.DataFrame([c.to_dict() for c, _ in rows])


def claims_of_one_setting(tables) -> pd.DataFrame:
    """Every claim but figure 7's as a row: key, subject, verdict, paper, measured (and evidence), on runs of one
    setting (:func:`claims`).

    BBR's claims are checked on every stock BBR version in the data, the patch's on every version
    with both stock and patched runs. Each claim is judged only on points whose link rate is below the
    sender's CPU ceiling (:func:`split_by_ceiling`); ``set_aside`` lists the points of the claim's
    variants left out. Every point is one run identity (:func:`bbrlab.analysis.paper_claims.medians`).

    Parameters
    ----------
    tables : bbrlab.analysis.data.Tables
        Throughput claims use its runs without ss sampling, socket claims its ``ss`` samples (not those of runs
        whose samples are known to be partial: :mod:`bbrlab.analysis.evidence`).

    Returns
    -------
    pandas.DataFrame
        One row per claim and subject.
    """
    runs = tables.runs
    plain = split_by_ceiling(select(tables, ss_sampled=False, workload=IperfParams.name).runs)  # throughput: sampling costs the sender CPU
    every = split_by_ceiling(runs[runs["status"] == "ok"] if "status" in runs else runs)  # the ss claims
    med = medians(plain.judged)
    stock, pairs = bbr_variants(runs)
    rows = [(claim_cubic_robust(med), plain.reasons(("Cubic",), contended_only=True))]
    rows += [(claim_bbr_capped(med, v), plain.reasons((v, "Cubic"), shares=LOW_SHARES_PCT)) for v in stock]
    rows += [(claim_recovery_thresholds(med, v), plain.reasons((v,))) for v in stock]
    rows += [(claim_patch_lowers_threshold(med, o, p), plain.reasons((o, p))) for o, p in pairs]
    whole_ss = evidence.without(tables.ss, evidence.partial_samples(runs))  # not a run's partial samples
    rows += [(claim_inflight_deficit(whole_ss, every.judged, v), every.reasons((v,))) for v in stock]
    rows += [(claim_patched_gain(whole_ss, every.judged, o, p), every.reasons((o, p))) for o, p in pairs]
    agree = claim_testbeds_agree(plain.judged)
    if agree is not None:
        rows.append((agree, []))
    return _rows_table(rows)



def write_report(table: pd.DataFrame, note: str, out_dir, runs: pd.DataFrame | None = None,
                 data_dir=None) -> Path:
    """Write the claims as ``fidelity.md`` (for people) and ``fidelity.json`` (for tools).

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`claims`.
    note : str
        Where the data ran (:func:`testbed_note`).
    out_dir : str or pathlib.Path
    runs : pandas.DataFrame, optional
        The ``runs`` judged: the report then also lists the points whose runs exceed their CPU ceiling
        (:func:`bbrlab.calibration.check.ceiling_exceeded`), each recovery threshold with its interval and
        patched against original at every point (:mod:`bbrlab.analysis.confidence_report`), on the runs the
        throughput claims judge (:func:`confidence_tables`).
    data_dir : str or pathlib.Path, optional
        The data's folder: the thresholds of the threshold searches in it are reported too.

    Returns
    -------
    pathlib.Path
        The Markdown file.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Fidelity: the paper's claims vs this dataset", "", f"Data: {note}.", "", *_scope_lines(runs),
             "| claim | on | verdict | paper | this data | runs | conditions |", "|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        cells = [str(x).replace("|", "/") for x in (row.key, row.subject, row.verdict, row.paper, row.measured,
                                                    getattr(row, "runs", ""), getattr(row, "points", ""))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _set_aside_lines(table)
    extra = {}
    if runs is not None:
        lines += report_lines(runs)
        extra["above_ceiling"] = ceiling_exceeded(runs)["reason"].tolist()
        thresholds, comparisons = confidence_tables(runs)
        searched = confidence_report.search_rows(data_dir) if data_dir is not None else None
        lines += confidence_report.report_lines(thresholds, comparisons, searched)
        blocks = confidence_report.block_rows(runs)
        lines += confidence_report.block_lines(blocks)
        extra["blocks"] = blocks.to_dict(orient="records")
        extra["thresholds"] = thresholds.to_dict(orient="records")
        extra["patched_vs_original"] = comparisons.to_dict(orient="records")
        if searched is not None:
            extra["searched_thresholds"] = searched.to_dict(orient="records")
    path = out / "fidelity.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "fidelity.json").write_text(json.dumps({"data": note, "claims": table.to_dict(orient="records"), **extra},
                                                  indent=2, default=str))
    return path



def confidence_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The thresholds with their intervals and the patched-vs-original comparisons, on the runs the throughput
    claims judge: iperf3 runs of the paper's setup (:func:`bbrlab.analysis.paper_setup.restrict_runs`) without ss
    sampling, below the sender's CPU ceiling (:func:`split_by_ceiling`)."""
    plain = paper_setup.restrict_runs(runs)[0]
    if "ss_sampled" in plain:
        plain = plain[plain["ss_sampled"].fillna(False).astype(bool) == False]  # noqa: E712 - a column mask
    if "workload" in plain:
        plain = plain[plain["workload"] == IperfParams.name]
    judged = split_by_ceiling(plain).judged
    pairs = bbr_variants(runs)[1] if {"bbr_version", "patched"} <= set(runs.columns) else []
    return confidence_report.threshold_rows(judged), confidence_report.comparison_rows(judged, pairs)


def _scope_lines(runs: pd.DataFrame | None) -> list[str]:
    """What the claims were judged on: the runs of the paper's setup, and the runs left out and why."""
    if runs is None:
        return []
    kept, notes = paper_setup.restrict_runs(runs)
    ok = int((runs["status"] == "ok").sum()) if "status" in runs else len(runs)
    return [f"Judged against the paper: {len(kept)} of {ok} ok runs, those of the paper's setup (one bulk iperf3 "
            "flow, SCHED_DEADLINE or no policy, no loss, no fq), each claim apart in every setting (queue, RTT, rate, "
            "duration ...) they hold; `runs` counts a claim's runs, `conditions` its run identities (unsampled).",
            *[f"- {n}" for n in notes], ""]


def _set_aside_lines(table: pd.DataFrame) -> list[str]:
    """The report's section on the points each claim left out (none: it says so)."""
    lines = ["", "## Points set aside", "",
             "A point whose link rate is at or above the sender's CPU ceiling (bbrlab calibrate: Cubic over an "
             "unshaped link at the same timeslice, share and RTT) measures the sender's CPU, not its congestion "
             "control; no claim is judged on it."]
    aside = table["set_aside"] if "set_aside" in table.columns else pd.Series(dtype=object)
    if not any(isinstance(a, list) and a for a in aside):
        return [*lines, "", "None."]
    subjects = table["subject"] if "subject" in table.columns else [""] * len(table)
    for key, subject, points in zip(table["key"], subjects, aside, strict=True):
        if isinstance(points, list) and points:
            lines += ["", f"{key} ({subject}):" if subject else f"{key}:", *[f"- {p}" for p in points]]
    return lines
