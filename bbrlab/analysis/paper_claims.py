"""The paper's claims, one function each, computed from median tables.

Each ``claim_*`` function takes :func:`medians` of a ``runs`` table (or the ``ss`` and ``runs`` tables)
and returns a :class:`Claim`: what the paper says, what the data shows with the numbers behind it, and a
verdict, one of ``reproduced``, ``partly``, ``not reproduced`` or ``no data`` (the data lacks the
dimension the claim needs). The thresholds below are the paper's words turned into numbers.
:mod:`bbrlab.analysis.fidelity` runs every claim on a dataset after setting CPU-bound points aside.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from . import runkey

#: "exceed 80 % of the bandwidth in the median" (paper, section 5.1)
RECOVERED_UTILISATION = 0.8



#: "no BBR version exceeds 11 Mbps in the median when the VM receives 10-25 % CPU shares" (100 Mbit/s link)
CAPPED_UTILISATION = 0.11

LOW_SHARES_PCT = (10, 25)



#: BBR's high gain (2.89 for v1); a sample at or above this pacing gain is "at high gain"
HIGH_GAIN = 2.85



# The paper's recovery thresholds (lowest CPU share with median > 80 % of the rate), BBRv1/v3, 100 Mbit/s.
PAPER_RECOVERY_PCT = {1.0: 45.0, 10.0: 65.0}

PAPER_PATCHED_RECOVERY_PCT = {1.0: 25.0, 10.0: 40.0}  # BBRv3 patched (figure 10)



#: The rate of the paper's figure 4 (and 10): its BBR claims are judged there when the data has it.
PAPER_RATE_MBIT = 100.0



#: Figure 7: medians at different bandwidths count as "the same throughput" within this ratio.
SAME_THROUGHPUT_RATIO = 1.5



@dataclass
class Claim:
    """One of the paper's claims checked on a dataset.

    Attributes
    ----------
    key : str
        Short name of the claim, e.g. ``recovery_thresholds``.
    paper : str
        What the paper says.
    measured : str
        What this dataset shows, with the numbers behind it.
    verdict : str
        ``reproduced``, ``partly``, ``not reproduced`` or ``no data``.
    subject : str
        The variant(s) it was checked on, e.g. ``"BBRv3"`` or ``"BBRv1 vs BBRv1 patched"``.
    evidence : dict
        The numbers behind the verdict.
    set_aside : list of str
        The points of the claim's variants left out because their link rate is at or above the sender's
        CPU ceiling, each with its ceiling and median throughput.
    """

    key: str
    paper: str
    measured: str
    verdict: str
    subject: str = ""
    evidence: dict = field(default_factory=dict)
    set_aside: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The claim as plain JSON-ready values (one row of :func:`bbrlab.analysis.fidelity.claims`)."""
        return asdict(self)



def medians(runs: pd.DataFrame) -> pd.DataFrame:
    """Median link utilisation and throughput per condition: one row per run identity (every column of
    :data:`bbrlab.analysis.runkey.RUN_KEY` the table has), so no row pools runs of different loss, qdisc, flows,
    contention model, queue, duration, kernel or machine.

    Parameters
    ----------
    runs : pandas.DataFrame
        A ``runs`` table (see :mod:`bbrlab.analysis.tables`); only runs with status ``ok`` count.

    Returns
    -------
    pandas.DataFrame
        The key columns (``variant``, ``timeslice_ms``, ``cpu_share_pct``, ``rtt_ms``, ``rate_mbit`` ...; an
        uncontended run's contention parameters blanked, :func:`bbrlab.analysis.runkey.identity`),
        ``utilisation``, ``throughput_mbit``, ``n``.
    """
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    keys = runkey.key_columns(ok)
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "utilisation", "throughput_mbit", "n"])
    g = runkey.with_identity(ok).groupby(keys, dropna=False, sort=True)
    return g.agg(utilisation=("link_utilisation", "median"), throughput_mbit=("throughput_mbit", "median"),
                 n=("run_id", "count")).reset_index()



def _by_timeslice(med: pd.DataFrame, variant: str) -> dict[float, pd.DataFrame]:
    """Per timeslice: share -> median utilisation (runs without a policy join every timeslice)."""
    part = med[med["variant"] == variant]
    full = part[part["cpu_share_pct"] >= 100].groupby("cpu_share_pct")["utilisation"].median()
    out = {}
    for ts, sub in part[part["cpu_share_pct"] < 100].groupby("timeslice_ms"):
        curve = sub.groupby("cpu_share_pct")["utilisation"].median()
        out[float(ts)] = pd.concat([curve, full]).groupby(level=0).median().sort_index()
    return out



def recovery_share(curve: pd.Series) -> float | None:
    """The lowest share from which every tested share reaches the recovered utilisation (80 %).

    Parameters
    ----------
    curve : pandas.Series
        Median utilisation indexed by CPU share.

    Returns
    -------
    float or None
        None when no share below 100 % recovers.
    """
    ok = curve >= RECOVERED_UTILISATION
    for share in curve.index:
        if ok.loc[share:].all():
            return float(share) if share < 100 else None
    return None



def _fmt(x: float | None, unit: str = "%") -> str:
    return "never below 100 %" if x is None else f"{x:g} {unit}"



def claim_cubic_robust(med: pd.DataFrame) -> Claim:
    """Cubic reaches >= 80 % of the link at nearly every contended point (figure 4).

    Parameters
    ----------
    med : pandas.DataFrame
        :func:`medians` of the runs.

    Returns
    -------
    Claim
        ``reproduced`` from 90 % of the contended Cubic points, ``partly`` from 50 %.
    """
    paper = "Cubic reaches the link rate in nearly all contention settings (figure 4)."
    cub = med[(med["variant"] == "Cubic") & (med["cpu_share_pct"] < 100)]
    if cub.empty:
        return Claim("cubic_robust", paper, "no contended Cubic runs", "no data", "Cubic")
    frac = float((cub["utilisation"] >= RECOVERED_UTILISATION).mean())
    worst = cub.loc[cub["utilisation"].idxmin()]
    measured = (f"{frac:.0%} of contended Cubic points at >= {RECOVERED_UTILISATION:.0%} utilisation; lowest "
                f"{worst['utilisation']:.0%} at {worst['cpu_share_pct']:g} % share, {worst['timeslice_ms']:g} ms"
                + (f", {worst['rate_mbit']:g} Mbit/s" if cub["rate_mbit"].nunique() > 1 else ""))
    verdict = "reproduced" if frac >= 0.9 else "partly" if frac >= 0.5 else "not reproduced"
    return Claim("cubic_robust", paper, measured, verdict, "Cubic", {"fraction_recovered": frac})



def claim_bbr_capped(med: pd.DataFrame, variant: str = "BBRv1") -> Claim:
    """BBR stays at or below 11 % of a 100 Mbit/s link at 10-25 % CPU share (figure 4).

    Parameters
    ----------
    med : pandas.DataFrame
        :func:`medians` of the runs.
    variant : str, default "BBRv1"
        The stock BBR variant checked.

    Returns
    -------
    Claim
    """
    paper = (f"BBR does not exceed {CAPPED_UTILISATION:.0%} of a 100 Mbit/s link in the median at "
             f"{LOW_SHARES_PCT[0]}-{LOW_SHARES_PCT[1]} % CPU share, while Cubic does (figure 4).")
    low = med[(med["variant"] == variant) & med["cpu_share_pct"].between(*LOW_SHARES_PCT)]
    if low.empty:
        return Claim("bbr_capped_low_share", paper, f"no {variant} runs at 10-25 % share", "no data", variant)
    top = float(low["utilisation"].max())
    cub = med[(med["variant"] == "Cubic") & med["cpu_share_pct"].between(*LOW_SHARES_PCT)]
    cub_txt = f"; Cubic at the same points: median {cub['utilisation'].median():.0%}" if not cub.empty else ""
    measured = f"highest {variant} median at 10-25 % share: {top:.0%} of the rate{cub_txt}"
    below_cubic = cub.empty or top < float(cub["utilisation"].min())
    verdict = ("reproduced" if top <= CAPPED_UTILISATION else
               "partly" if top < 0.5 and below_cubic else "not reproduced")
    return Claim("bbr_capped_low_share", paper, measured, verdict, variant, {"max_low_share_utilisation": top})



def claim_recovery_thresholds(med: pd.DataFrame, variant: str = "BBRv1") -> Claim:
    """The share from which BBR reaches 80 % of the rate: about 45 % at 1 ms, 65 % and more at 10 ms.

    Parameters
    ----------
    med : pandas.DataFrame
        :func:`medians` of the runs.
    variant : str, default "BBRv1"

    Returns
    -------
    Claim
        ``evidence["recovery_share_pct"]`` per timeslice; the verdict allows for the grid's spacing
        (:func:`bracket`).
    """
    paper = ("BBRv1/v3 reach > 80 % of the rate from about 45 % share at 1 ms timeslices and need at least 65 % "
             "at longer timeslices: longer timeslices hurt more at the same share (figures 4, 5).")
    curves = _by_timeslice(med, variant)
    if len(curves) < 1:
        return Claim("recovery_thresholds", paper, f"no contended {variant} runs", "no data", variant)
    found = {ts: recovery_share(c) for ts, c in curves.items()}
    measured = "; ".join(f"{ts:g} ms: {_fmt(s)} (shares tested: {', '.join(f'{x:g}' for x in c.index)})"
                         for (ts, s), c in zip(found.items(), curves.values(), strict=True))
    agree = []
    for ts, share in found.items():
        want = PAPER_RECOVERY_PCT.get(ts)
        if want is not None:
            low, high = bracket(curves[ts], share)
            agree.append(low < want <= high)
    ordered = _longer_timeslice_not_better(found)
    if not agree:
        verdict = "no data"
    elif all(agree):
        verdict = "reproduced"
    elif ordered:
        verdict = "partly"
    else:
        verdict = "not reproduced"
    return Claim("recovery_thresholds", paper, measured + ("" if ordered else "; longer timeslice not worse here"),
                 verdict, variant, {"recovery_share_pct": {str(k): v for k, v in found.items()}})



def bracket(curve: pd.Series, share: float | None) -> tuple[float, float]:
    """What a coarse grid can say about the true recovery share: above the highest tested share that
    fails, at most the measured recovery share (100 % when none below it recovers)."""
    high = 100.0 if share is None else share
    failing = [x for x in curve.index if x < high and curve[x] < RECOVERED_UTILISATION]
    return (max(failing, default=0.0), high)



def _longer_timeslice_not_better(found: dict[float, float | None]) -> bool:
    as_num = {ts: (101.0 if s is None else s) for ts, s in found.items()}
    ts_sorted = sorted(as_num)
    return all(as_num[a] <= as_num[b] for a, b in zip(ts_sorted, ts_sorted[1:], strict=False))



def claim_patch_lowers_threshold(med: pd.DataFrame, original: str = "BBRv1", patched: str = "BBRv1 patched") -> Claim:
    """The inflight-deficit patch lowers the share BBR needs (figures 10, 15).

    Parameters
    ----------
    med : pandas.DataFrame
        :func:`medians` of the runs.
    original, patched : str
        The stock and patched variants of one BBR version.

    Returns
    -------
    Claim
    """
    paper = ("The inflight-deficit patch lowers the share BBR needs: patched BBRv3 recovers from 25 % (1 ms) and "
             "40 % (10 ms) instead of 45 % and 70 % (figures 10, 15).")
    subject = f"{original} vs {patched}"
    orig, pat = _by_timeslice(med, original), _by_timeslice(med, patched)
    common = sorted(set(orig) & set(pat))
    if not common:
        return Claim("patch_lowers_threshold", paper, f"no contended runs of both {original} and {patched}",
                     "no data", subject)
    parts, shifted = [], []
    gains: dict[str, float] = {}
    for ts in common:
        a, b = recovery_share(orig[ts]), recovery_share(pat[ts])
        shares = sorted(set(orig[ts].index) & set(pat[ts].index) - {100.0})
        diff = {s: float(pat[ts][s] - orig[ts][s]) for s in shares}
        best = max(diff, key=diff.get) if diff else None
        gains[str(ts)] = diff[best] if best is not None else float("nan")
        text = f"{ts:g} ms: recovery {original} {_fmt(a)}, {patched} {_fmt(b)}"
        if best is not None:
            text += (f"; largest gain at {best:g} % share: {orig[ts][best]:.0%} -> {pat[ts][best]:.0%} "
                     "of the rate")
        parts.append(text)
        lower = (101 if b is None else b) < (101 if a is None else a)
        # The paper's shift in substance: where stock BBR is capped, the patch gets most of the rate back.
        rescued = best is not None and orig[ts][best] <= 0.2 and pat[ts][best] >= 0.7
        shifted.append(lower or rescued)
    if all(shifted):
        verdict = "reproduced"
    elif any(shifted) or any(g > 0.1 for g in gains.values()):
        verdict = "partly"
    else:
        verdict = "not reproduced"
    parts.append("(shift = lower recovery share at 80 %, or >= 70 % of the rate where stock BBR gets <= 20 %)")
    return Claim("patch_lowers_threshold", paper, "; ".join(parts), verdict, subject,
                 {"largest_utilisation_gain": gains})



def claim_bandwidth_independent(med: pd.DataFrame, variant: str = "BBRv1") -> Claim:
    """At low CPU shares every bandwidth gives BBR the same throughput (figure 7).

    Parameters
    ----------
    med : pandas.DataFrame
        :func:`medians` of the runs, at two or more rates.
    variant : str, default "BBRv1"

    Returns
    -------
    Claim
        ``reproduced`` when at every timeslice and 10-25 % share measured at several rates the medians
        lie within a factor :data:`SAME_THROUGHPUT_RATIO`, ``partly`` when at some.
    """
    paper = ("At low CPU shares all bandwidths give BBR the same throughput: it is limited by the CPU, not by the "
             "link (figure 7).")
    low = med[(med["variant"] == variant) & med["cpu_share_pct"].between(*LOW_SHARES_PCT)]
    pairs = [(k, g.sort_values("rate_mbit")) for k, g in low.groupby(["timeslice_ms", "cpu_share_pct"])
             if g["rate_mbit"].nunique() > 1]
    if not pairs:
        return Claim("bandwidth_independent", paper, f"needs {variant} at 10-25 % share at two or more rates",
                     "no data", variant)
    parts, same = [], []
    ratios: dict[str, float] = {}
    for (ts, share), g in pairs:
        low_mbit = g["throughput_mbit"].min()
        ratio = float(g["throughput_mbit"].max() / low_mbit) if low_mbit > 0 else float("inf")
        ratios[f"{ts:g}ms/{share:g}%"] = ratio
        same.append(ratio <= SAME_THROUGHPUT_RATIO)
        parts.append(f"{ts:g} ms / {share:g} %: " + ", ".join(
            f"{t:.1f} Mbit/s at {r:g} Mbit/s" for r, t in zip(g["rate_mbit"], g["throughput_mbit"], strict=True)))
    verdict = "reproduced" if all(same) else "partly" if any(same) else "not reproduced"
    measured = "; ".join(parts) + f" (same = within a factor {SAME_THROUGHPUT_RATIO:g})"
    return Claim("bandwidth_independent", paper, measured, verdict, variant, {"max_over_min": ratios})



def _ss_with_runs(ss: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    cols = ["run_id", "variant", "cpu_share_pct", "timeslice_ms"]
    return ss.merge(runs[cols], on="run_id", how="inner", suffixes=("_ss", ""))



def claim_inflight_deficit(ss: pd.DataFrame, runs: pd.DataFrame, variant: str = "BBRv1") -> Claim:
    """Under contention BBR keeps less than 1 BDP (its own estimate) in flight (figure 9).

    Parameters
    ----------
    ss, runs : pandas.DataFrame
        The ``ss`` and ``runs`` tables.
    variant : str, default "BBRv1"

    Returns
    -------
    Claim
    """
    paper = ("Without contention BBR keeps 1-2 BDP in flight; at 25 % share inflight drops below 1 BDP "
             "(as BBR estimates it), which is the patch's detector (figure 9).")
    need = {"inflight_bdp", "run_id"}
    if ss.empty or not need <= set(ss.columns):
        return Claim("inflight_deficit", paper, "no ss samples", "no data", variant)
    s = _ss_with_runs(ss, runs)
    s = s[(s["variant"] == variant) & s["inflight_bdp"].notna()]
    if "app_limited" in s:
        s = s[~s["app_limited"].fillna(False).astype(bool)]
    cont, free = s[s["cpu_share_pct"] < 100], s[s["cpu_share_pct"] >= 100]
    if cont.empty or free.empty:
        return Claim("inflight_deficit", paper, f"{variant} ss samples lack a contended or an uncontended run",
                     "no data", variant)
    fc, ff = float((cont["inflight_bdp"] < 1).mean()), float((free["inflight_bdp"] < 1).mean())
    measured = (f"{variant} samples below 1 BDP: {fc:.0%} under contention ({len(cont)} samples), "
                f"{ff:.0%} without ({len(free)} samples)")
    verdict = "reproduced" if fc >= 0.5 and ff <= 0.2 else "partly" if fc > ff else "not reproduced"
    return Claim("inflight_deficit", paper, measured, verdict, variant,
                 {"below_1bdp_contended": fc, "below_1bdp_free": ff})



def claim_patched_gain(ss: pd.DataFrame, runs: pd.DataFrame, original: str = "BBRv1",
                       patched: str = "BBRv1 patched") -> Claim:
    """Patched BBR answers an inflight deficit with the high pacing gain; stock BBR does not (figure 11).

    Parameters
    ----------
    ss, runs : pandas.DataFrame
        The ``ss`` and ``runs`` tables.
    original, patched : str
        The stock and patched variants of one BBR version.

    Returns
    -------
    Claim
    """
    paper = ("Patched BBR answers an inflight deficit with the high pacing gain and returns to the ProbeBW gain "
             "once inflight is back at 1 BDP (figure 11).")
    subject = f"{original} vs {patched}"
    need = {"inflight_bdp", "pacing_gain", "run_id"}
    if ss.empty or not need <= set(ss.columns):
        return Claim("patched_gain", paper, "no ss samples with gains", "no data", subject)
    s = _ss_with_runs(ss, runs)
    s = s[(s["cpu_share_pct"] < 100) & s["inflight_bdp"].notna() & s["pacing_gain"].notna()]
    deficit = s[s["inflight_bdp"] < 1]
    frac = {c: float((deficit[deficit["variant"] == c]["pacing_gain"] >= HIGH_GAIN).mean())
            for c in (original, patched) if (deficit["variant"] == c).any()}
    if len(frac) < 2:
        return Claim("patched_gain", paper, "needs contended, sampled runs of both variants with a deficit",
                     "no data", subject)
    measured = (f"samples at high gain while inflight < 1 BDP: {patched} {frac[patched]:.0%}, "
                f"{original} {frac[original]:.0%}")
    verdict = ("reproduced" if frac[patched] >= 0.5 and frac[original] <= 0.1 else
               "partly" if frac[patched] > frac[original] else "not reproduced")
    return Claim("patched_gain", paper, measured, verdict, subject, {"high_gain_fraction": frac})



#: How far (relative) one testbed's median uncontended utilisation may be from the other testbeds' before
#: the check says they disagree.
TESTBED_TOLERANCE = 0.10



def claim_testbeds_agree(runs: pd.DataFrame, tolerance: float = TESTBED_TOLERANCE) -> Claim | None:
    """A consistency check, not a claim of the paper: runs spread over several testbeds measure the same
    uncontended point (100 % share) alike. Each testbed's median link utilisation per point (variant, RTT,
    rate, streams) is compared with the median over all testbeds' medians (robust to one odd testbed among
    three or more; with two, both are named when they are too far apart); a testbed off by more than
    ``tolerance`` (relative) at any point is named. None when the data has fewer than two testbeds.

    Returns
    -------
    Claim or None
        ``verdict`` is ``consistent`` or ``inconsistent``; ``evidence`` holds each testbed's deviations.
    """
    if "testbed" not in runs or runs["testbed"].dropna().nunique() < 2:
        return None
    ok = runs[(runs["status"] == "ok") & (runs["cpu_share_pct"] >= 100)]
    point = ["variant", "rtt_ms", "rate_mbit", "streams"]
    per_tb = ok.groupby([*point, "testbed"], dropna=False)["link_utilisation"].median().reset_index()
    off: dict[str, list[str]] = {}
    for key, group in per_tb.groupby(point, dropna=False):
        if group["testbed"].nunique() < 2:
            continue
        for _, row in group.iterrows():
            others = group["link_utilisation"].median()
            if others > 0 and abs(row["link_utilisation"] - others) / others > tolerance:
                off.setdefault(str(row["testbed"]), []).append(
                    f"{key[0]} {key[1]:g} ms {key[2]:g} Mbit/s x{key[3]:g}: {row['link_utilisation']:.2f} vs {others:.2f}")
    names = sorted(ok["testbed"].dropna().unique())
    measured = (f"{len(names)} testbeds ({', '.join(names)}) within {100 * tolerance:.0f} % of each other at every "
                "uncontended point" if not off else
                "; ".join(f"{tb} differs at {len(v)} point(s), e.g. {v[0]}" for tb, v in sorted(off.items())))
    return Claim("testbeds_agree", "(consistency check) several testbeds measure the same uncontended point alike",
                 measured, "inconsistent" if off else "consistent", ", ".join(names), {"deviations": off})
