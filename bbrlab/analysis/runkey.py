"""One definition of "the same condition": the run-identity key.

Two runs are repetitions of one condition when they agree on every column of :data:`RUN_KEY`, the
``runs`` columns of every spec dimension that changes a run (docs/statistics.md, "The same condition"):

============ ==========================================================================================
CCA          ``variant`` (BBR version, patch and patch tag: :mod:`bbrlab.analysis.identity`), ``kernel``
             (the sender's kernel), ``cca`` (the module's name), ``cca_params`` (its module parameters set)
contention   ``contention_mode`` and its parameters ``timeslice_ms``, ``deadline_mode``, ``cpu_share_pct``,
             ``cfs_period_ms``, ``cfs_burst_ms``, ``credit_s``, ``load_pct``
link         ``rtt_ms``, ``rate_mbit``, ``queue_mode`` and ``buffer_bdp`` (the queue tree and the queue in
             force), ``loss_model``, ``loss_pct``, ``emulator_offloads``
sender       ``sender_qdisc`` (fq: paced), ``sampler`` (a socket sampler costs the sender CPU),
             ``sender_sysctls`` (the sysctls the run set), ``sender_vcpus`` (the sender VM's vCPUs)
flows        ``streams``, ``flows``, ``extra_flows`` (the other flows' CCA, origin, streams and start)
workload     ``workload`` (iperf3 bulk or an rsync copy), ``duration_s``, ``file_mb``
machine      ``source``, ``testbed_kind``, ``hypervisor``, ``accelerator``, and ``machine`` (the CPU model)
             where the records name it
============ ==========================================================================================

A column the table lacks is left out of the key (:func:`key_columns`); a missing value (NaN) is a value of
its own, equal only to another missing value. A run without a CPU policy (``contention_mode`` ``none``, 100 %
share) has no contention parameters: its recorded timeslice (a grid's) is not part of its identity
(:func:`identity`). Not in the key: what a run measured (throughput, read-backs such as
``sender_root_qdisc``), when and where it ran (``campaign``, ``testbed``, ``started_at``) and its
``repetition``; pooling over those is what repetitions are for.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import pandas as pd

from bbrlab.campaign.dimensions import identity_columns

#: The congestion control that ran, the kernel it ran on and the module parameters the run set.
CCA_KEY: Final[tuple[str, ...]] = ("variant", "kernel", "cca", "cca_params")
#: The CPU contention: its model and every parameter of it (the share included).
CONTENTION_KEY: Final[tuple[str, ...]] = ("contention_mode", "timeslice_ms", "deadline_mode", "cpu_share_pct",
                                          "cfs_period_ms", "cfs_burst_ms", "credit_s", "load_pct")
#: The emulated link and its bottleneck queue.
LINK_KEY: Final[tuple[str, ...]] = ("rtt_ms", "rate_mbit", "queue_mode", "buffer_bdp", "loss_model", "loss_pct",
                                    "emulator_offloads")
#: The sender's qdisc, its socket sampler, the sysctls the run set and its vCPUs.
SENDER_KEY: Final[tuple[str, ...]] = ("sender_qdisc", "sampler", "sender_sysctls", "sender_vcpus")
#: The flows of the run.
FLOWS_KEY: Final[tuple[str, ...]] = ("streams", "flows", "extra_flows")
#: What the flow carried and for how long.
WORKLOAD_KEY: Final[tuple[str, ...]] = ("workload", "duration_s", "file_mb")
#: Where it ran: the layout, the kind of testbed, the hypervisor and the machine (CPU model).
MACHINE_KEY: Final[tuple[str, ...]] = ("source", "testbed_kind", "hypervisor", "accelerator", "machine")

#: The columns of the spec's dimensions in the run identity (bbrlab.campaign.dimensions) that no group above
#: names: a new dimension's column is in the key from its table entry on (empty while every one is placed).
DIMENSIONS_KEY: Final[tuple[str, ...]] = tuple(
    c for c in identity_columns()
    if c not in (*CCA_KEY, *CONTENTION_KEY, *LINK_KEY, *SENDER_KEY, *FLOWS_KEY, *WORKLOAD_KEY, *MACHINE_KEY))

#: Every column of the run-identity key, in this order.
RUN_KEY: Final[tuple[str, ...]] = (*CCA_KEY, *CONTENTION_KEY, *LINK_KEY, *SENDER_KEY, *FLOWS_KEY, *WORKLOAD_KEY,
                                   *DIMENSIONS_KEY, *MACHINE_KEY)
#: The contention's parameters: not part of an uncontended run's identity.
CONTENTION_PARAMETERS: Final[tuple[str, ...]] = tuple(c for c in CONTENTION_KEY
                                                      if c not in ("contention_mode", "cpu_share_pct"))
#: The key without the CCA and the contention: the setting a contention curve of one CCA is measured in.
SETTING_KEY: Final[tuple[str, ...]] = tuple(c for c in RUN_KEY if c not in (*CCA_KEY, *CONTENTION_KEY))


def key_columns(runs: pd.DataFrame, key: tuple[str, ...] = RUN_KEY) -> list[str]:
    """The columns of ``key`` (default: :data:`RUN_KEY`) that ``runs`` has, in the key's order."""
    return [c for c in key if c in runs.columns]


def identity(runs: pd.DataFrame, key: tuple[str, ...] = RUN_KEY) -> pd.DataFrame:
    """Each run's identity: the :func:`key_columns` of ``runs``, with the contention parameters blanked (NaN) for
    runs without a CPU policy (``contention_mode`` ``none``). Same index as ``runs``."""
    frame = runs[key_columns(runs, key)].copy()
    if "contention_mode" in runs.columns:
        free = (runs["contention_mode"] == "none").fillna(False).to_numpy(dtype=bool)
        for col in (c for c in CONTENTION_PARAMETERS if c in frame.columns):
            frame.loc[free, col] = pd.NA if str(frame[col].dtype) in ("string", "Int64") else math.nan
    return frame


def with_identity(runs: pd.DataFrame, key: tuple[str, ...] = RUN_KEY) -> pd.DataFrame:
    """``runs`` with its key columns replaced by :func:`identity`'s (for grouping by the key)."""
    return runs.assign(**{c: v for c, v in identity(runs, key).items()})


def mixed(runs: pd.DataFrame, by: list[str], key: tuple[str, ...] = RUN_KEY) -> dict[str, int]:
    """The key columns (not in ``by``) on which runs of one group of ``by`` differ, each with the number of
    groups where they do; empty when every group is one condition (or ``runs`` is empty).

    Examples
    --------
    >>> mixed(runs, ["variant", "timeslice_ms", "cpu_share_pct"])  # doctest: +SKIP
    {'loss_pct': 12, 'sender_qdisc': 2}
    """
    ids = identity(runs, key)
    groups = _group_codes(runs, [c for c in by if c in runs.columns])
    out = {c: _groups_varying(groups, ids[c]) for c in ids.columns if c not in by}
    return {c: n for c, n in out.items() if n}


def _group_codes(frame: pd.DataFrame, cols: list[str]) -> np.ndarray:
    """Each row's group number over ``cols`` (a missing value is a value); all 0 without columns."""
    if not cols or frame.empty:
        return np.zeros(len(frame), dtype=np.int64)
    return frame.groupby([frame[c] for c in cols], dropna=False, sort=False).ngroup().to_numpy()


def _groups_varying(groups: np.ndarray, values: pd.Series) -> int:
    """How many groups hold more than one of ``values`` (a missing value is one value)."""
    if not len(values):
        return 0
    codes = pd.factorize(values.astype("object"), use_na_sentinel=False)[0]
    pairs = pd.DataFrame({"g": groups, "v": codes}).drop_duplicates()
    return int((pairs.groupby("g").size() > 1).sum())


def same(frame: pd.DataFrame, values: dict) -> pd.Series:
    """Rows of ``frame`` whose columns equal ``values`` (a missing value equals only a missing value)."""
    mask = pd.Series(True, index=frame.index)
    for col, value in values.items():
        missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
        mask &= frame[col].isna() if missing else (frame[col] == value).fillna(False).astype(bool)
    return mask


def settings(runs: pd.DataFrame, key: tuple[str, ...] = SETTING_KEY) -> list[dict]:
    """The distinct values of ``key``'s columns (default: :data:`SETTING_KEY`) among ``runs``, as dicts."""
    cols = key_columns(runs, key)
    if runs.empty:
        return []
    if not cols:
        return [{}]
    distinct = identity(runs, key)[cols].drop_duplicates()
    return [dict(zip(cols, row, strict=True)) for row in distinct.itertuples(index=False, name=None)]


#: How a label names a key column's value ("RTT 20 ms", "loss 1 %", "qdisc fq"); other columns: "<column> <value>".
FORMATS: Final[dict[str, str]] = {
    "rtt_ms": "RTT {:g} ms", "rate_mbit": "{:g} Mbit/s", "buffer_bdp": "{:.3g} BDP", "duration_s": "{:g} s",
    "streams": "{:g} streams", "flows": "{:g} flows", "kernel": "kernel {}", "queue_mode": "{} queue tree",
    "sender_qdisc": "qdisc {}", "sampler": "sampler {}", "sender_vcpus": "{:g} vCPU", "emulator_offloads": "emulator offloads {}",
    "machine": "machine {}", "loss_pct": "loss {:g} %", "loss_model": "loss model {}", "timeslice_ms": "{:g} ms",
    "cpu_share_pct": "{:g} % share", "contention_mode": "{}", "deadline_mode": "{} deadline", "cfs_period_ms": "period {:g} ms",
    "cfs_burst_ms": "burst {:g} ms", "credit_s": "credit {:g} s", "load_pct": "load {:g} %", "extra_flows": "with {}",
    "workload": "{}", "file_mb": "{:g} MB", "variant": "{}", "cca": "{}", "cca_params": "params {}",
    "sender_sysctls": "sysctls {}"}


#: How a label names a missing value that means "nothing set" rather than "not recorded".
UNSET: Final[dict[str, str]] = {"cca_params": "default params", "sender_sysctls": "default sysctls"}


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def label(values: dict) -> str:
    """Key values in words, e.g. ``{"rtt_ms": 20, "loss_pct": 1.0}`` -> ``"RTT 20 ms, loss 1 %"``; the queue as a
    figure names it (``"1 BDP"``, ``"authors' queue"``, whatever buffer that tree held)."""
    parts = []
    authors = values.get("queue_mode") == "authors"
    for col, value in values.items():
        if col == "queue_mode" or (col == "buffer_bdp" and authors):
            parts += ["authors' queue"] if col == "queue_mode" and authors else []
        elif _missing(value):
            parts.append(UNSET.get(col) or f"{FORMATS.get(col, '').split('{')[0].strip() or col} not recorded")
        else:
            parts.append(FORMATS.get(col, col + " {}").format(value))
    return ", ".join(parts)


def split(runs: pd.DataFrame, hue: str, by: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Keep a figure's points to one condition each: the key columns on which runs of one group of ``by`` (the
    figure's panels, hue and x) still differ, added one at a time in the key's order until no group mixes
    conditions (by :func:`identity`: uncontended runs never differ in contention parameters), and ``runs`` with
    ``hue`` followed by those columns' values in words (``"Cubic [loss 1 %]"``), per hue only those that differ
    among its runs. Unchanged (and no column) when every group is one condition already."""
    if runs.empty or hue not in runs.columns:
        return runs, []
    ids = identity(runs)
    added: list[str] = []
    groups = _group_codes(runs, [c for c in by if c in runs.columns])
    for col in ids.columns:
        if col not in by and _groups_varying(groups, ids[col]):
            added.append(col)
            groups = _group_codes(runs.assign(**{c: ids[c] for c in added}), [c for c in [*by, *added]
                                                                                if c in runs.columns])
    if not added:
        return runs, []
    out = runs  # labels and groups by the recorded values: an uncontended run stays on its grid timeslice's line
    # per hue only the added columns that differ among its own runs: "BBRv3" stays "BBRv3" beside "BBRv1 [kernel ...]"
    own = {h: [c for c in added if part[c].nunique(dropna=False) > 1]
           for h, part in out.groupby(hue, dropna=False, sort=False)}
    suffix = [label({c: value for c, value in zip(added, row, strict=True) if c in own.get(h, added)})
              for h, *row in out[[hue, *added]].itertuples(index=False, name=None)]
    hues = [f"{h} [{s}]" if s else str(h) for h, s in zip(out[hue], suffix, strict=True)]
    return out.assign(**{hue: hues}), added
