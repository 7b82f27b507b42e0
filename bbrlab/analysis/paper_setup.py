"""The paper's setup as a run identity: which runs the fidelity report may hold against the paper's claims.

The paper measured one bulk iperf3 flow per run, under SCHED_DEADLINE (or no policy), over a lossless link,
with the sender's default qdisc (no fq pacing). :data:`PAPER_SETUP` states that per key column
(:mod:`bbrlab.analysis.runkey`); :func:`restrict` keeps the runs that match it and says, per condition, how many
runs it left out and with which values. The claims are then judged apart in every setting the kept runs hold
(:func:`bbrlab.analysis.runkey.settings`: the same queue, RTT, rate, duration, kernel, machine ...), so a claim
never pools a setting with another; :func:`setting_label` names a setting by what sets it apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from bbrlab.scenario.workloads import IperfParams

from . import runkey


@dataclass(frozen=True)
class Condition:
    """One column of the paper's setup: the runs ``keep`` accepts, and the paper's value in words."""

    column: str
    keep: Callable[[pd.Series], pd.Series]
    paper: str


def _one_or_missing(col: pd.Series) -> pd.Series:
    return col.isna() | (col.astype("float64") == 1)


#: The paper's setup, column by column (a column the table lacks is not checked).
PAPER_SETUP: tuple[Condition, ...] = (
    Condition("workload", lambda c: c == IperfParams.name, "a bulk iperf3 transfer"),
    Condition("contention_mode", lambda c: c.isin(["deadline", "none"]), "SCHED_DEADLINE or no CPU policy"),
    Condition("loss_pct", lambda c: c.fillna(0) == 0, "no loss"),
    Condition("loss_model", lambda c: c.fillna("none") == "none", "no loss model"),
    Condition("streams", _one_or_missing, "one stream"),
    Condition("flows", _one_or_missing, "one flow"),
    Condition("extra_flows", lambda c: c.isna(), "no competing flow"),
    Condition("sender_qdisc", lambda c: c.fillna("") != "fq", "the default qdisc, no fq pacing"),
    Condition("cca_params", lambda c: c.isna(), "the module's own parameters"),
    Condition("sender_sysctls", lambda c: c.isna(), "the sender's own sysctls"),
)


@dataclass
class Restricted:
    """Runs restricted to the paper's setup: ``tables`` kept, ``notes`` per condition that left runs out,
    ``kept`` and ``left_out`` run counts (runs with status ok)."""

    tables: object
    notes: list[str]
    kept: int
    left_out: int


def _shown(values) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def restrict_runs(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The ok runs of ``runs`` whose identity matches :data:`PAPER_SETUP`, and one note per condition that left
    runs out: ``"left out 72 runs with loss_pct 0.1, 1, 10, 30 (the paper: no loss)"``."""
    ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    keep = pd.Series(True, index=ok.index)
    notes = []
    for cond in PAPER_SETUP:
        if cond.column not in ok.columns:
            continue
        match = cond.keep(ok[cond.column]).fillna(False).astype(bool) & keep
        out = ok.loc[keep & ~match, cond.column]
        if len(out):
            values = sorted({str(v) if isinstance(v, str) else v for v in out.dropna()}, key=str)
            missing = " and missing" if out.isna().any() else ""
            notes.append(f"left out {len(out)} runs with {cond.column} {_shown(values)}{missing} "
                         f"(the paper: {cond.paper})")
        keep = match
    return ok[keep], notes


def restrict(tables) -> Restricted:
    """:func:`restrict_runs` on ``tables`` (:class:`bbrlab.analysis.tables.Tables`): the kept tables (``ss`` and
    the other tables follow the kept runs), the notes, and how many ok runs were kept and left out."""
    runs = tables.runs
    ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    kept, notes = restrict_runs(runs)
    return Restricted(tables.with_runs(kept, notes), notes, len(kept), len(ok) - len(kept))


def setting_label(setting: dict, varying: list[str]) -> str:
    """A setting named by the columns that set it apart from the others (``varying``), e.g.
    ``"RTT 20 ms, 100 Mbit/s, 1 BDP, 8 s"`` (:func:`bbrlab.analysis.runkey.label`); a column the setting has no
    value in is left out (``"not recorded"`` when none has one); ``""`` when nothing sets it apart."""
    present = {c: setting.get(c) for c in varying if runkey_text(setting.get(c)) != "<missing>"}
    return runkey.label(present) if present else ("not recorded" if varying else "")


def varying_columns(settings: list[dict]) -> list[str]:
    """The columns whose value differs between ``settings`` (in the key's order): those with two values or more
    where that names every setting apart, else also those that some settings lack (a missing value)."""
    cols = list(settings[0]) if settings else []
    values = {c: {runkey_text(s.get(c)) for s in settings} for c in cols}
    known = [c for c in cols if len(values[c] - {"<missing>"}) > 1]
    labels = [setting_label(s, known) for s in settings]
    if len(set(labels)) == len(labels):
        return known
    return [c for c in cols if len(values[c]) > 1]


def runkey_text(value) -> str:
    """A value as a hashable text in which every missing value is the same."""
    missing = value is None or value is pd.NA or (isinstance(value, float) and value != value)
    return "<missing>" if missing else repr(value)


