"""Ingest and figure speed on 20,000 runs in each layout, against a naive json.load + DataFrame-append loop.

bbrlab's layout: 20,000 copies of the real host-netns runs in tests/fixtures/campaign (iperf3 and ss files
hard-linked, record.json rewritten with a new run id; one copy in ten keeps its ss.log, as sampled runs are
a minority). The authors' layout: 5,000 measurement points of 4 repetitions whose ``iperf_<i>.json`` are
hard links to the same real iperf3 files (both readers parse the same JSON), each with a meta.json as their
run.sh writes it. Both are made in a temporary directory for this benchmark only and deleted afterwards.
Nothing here goes near ``data/``. The CPU is shared with whatever else runs: compare ratios, not seconds.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from bbrlab.analysis import data, plots
from tests import authors_layout

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "campaign"
N_RUNS = 20_000
N_NAIVE = 2_000  # the naive loop is quadratic; it is timed on the first 2,000 runs only
SS_EVERY = 10  # ss is sampled in separate runs (sampling costs CPU): one copy in 10 keeps its ss.log
AUTHORS_REPS = 4  # repetitions per measurement point in the authors' layout (run.sh's N)


def replicate(source: Path, target: Path, n_runs: int, ss_every: int = SS_EVERY) -> None:
    """``n_runs`` run directories cycling over the real ones in ``source`` (ss.log in one of ``ss_every``)."""
    originals = sorted((source / "runs").iterdir())
    records = [json.loads((r / "record.json").read_text()) for r in originals]
    (target / "runs").mkdir(parents=True)
    for i in range(n_runs):
        k = i % len(originals)
        run_id = f"{originals[k].name}-copy{i:05d}"
        run_dir = target / "runs" / run_id
        run_dir.mkdir()
        for name in ("iperf.json", "ss.log"):
            if name == "ss.log" and (not ss_every or i % ss_every):
                continue
            if (originals[k] / name).exists():
                os.link(originals[k] / name, run_dir / name)
        record = dict(records[k], run_id=run_id)
        record["scenario"] = dict(record["scenario"], repetition=i // len(originals))
        (run_dir / "record.json").write_text(json.dumps(record))


def replicate_authors(source: Path, target: Path, n_runs: int, reps: int = AUTHORS_REPS) -> None:
    """``n_runs`` repetitions in the authors' layout: points of ``reps`` hard-linked iperf3 files of one CCA."""
    by_cca: dict[str, list[Path]] = {}
    for run in sorted((source / "runs").iterdir()):
        cca = json.loads((run / "record.json").read_text())["scenario"]["flow"]["cca"]
        by_cca.setdefault(cca, []).append(run / "iperf.json")
    ccas = sorted(by_cca)
    for p in range(n_runs // reps):
        cca = ccas[p % len(ccas)]
        run_ns = (1, 10)[p // len(ccas) % 2] * 1_000_000
        meta = authors_layout.meta_json(cca=cca, kernel="kernel6-1", run_ns=run_ns, period_ns=run_ns * 4, n=reps)
        point = target / authors_layout.stamp_of(p)
        (point / "sender").mkdir(parents=True)
        (point / "meta.json").write_text(json.dumps(meta) + "\n")
        files = by_cca[cca]
        for i in range(reps):
            os.link(files[(p + i) % len(files)], point / "sender" / f"iperf_{i + 1}.json")


def naive_ingest(campaign: Path, limit: int) -> pd.DataFrame:
    """What a first notebook usually does: load each run's JSON and append a row to a DataFrame."""
    df = pd.DataFrame()
    for run_dir in sorted((campaign / "runs").iterdir())[:limit]:
        with open(run_dir / "record.json") as f:
            record = json.load(f)
        with open(run_dir / "iperf.json") as f:
            report = json.load(f)
        sc = record["scenario"]
        row = {"run_id": record["run_id"], "cca": sc["flow"]["cca"], "cpu_share_pct": sc["contention"]["cpu_share_pct"],
               "timeslice_ms": sc["contention"]["timeslice_ms"], "rtt_ms": sc["link"]["rtt_ms"],
               "rate_mbit": sc["link"]["rate_mbit"],
               "throughput_mbit": report["end"]["sum_received"]["bits_per_second"] / 1e6,
               "retransmits": report["end"]["sum_sent"]["retransmits"]}
        df = pd.concat([df, pd.DataFrame([row])], ignore_index=True)
    return df


def timed(fn, *args, **kw):
    t0 = time.perf_counter()
    result = fn(*args, **kw)
    return result, time.perf_counter() - t0


def read_speeds(directory: Path, n_runs: int, label: str) -> dict:
    """Runs/s of one layout: cold (process pool, cache written), one worker without cache, cached."""
    cold, t_cold = timed(data.load, directory)
    c = cold.counts()
    assert c["ok"] == n_runs, c
    print(f"{label:8s} cold:   {t_cold:6.2f} s {n_runs / t_cold:8.0f} runs/s  ({c['runs']} runs, "
          f"{c['intervals']} intervals, {c['ss']} ss rows, {os.cpu_count()} workers)")
    _, t_serial = timed(data.load, directory, cache=False, workers=1)
    print(f"{label:8s} 1 worker, no cache: {t_serial:6.2f} s {n_runs / t_serial:8.0f} runs/s")
    warm, t_warm = timed(data.load, directory)
    assert warm.sources[0]["read"] == 0
    print(f"{label:8s} cached: {t_warm:6.2f} s {n_runs / t_warm:8.0f} runs/s (parquet reused)")
    return {"cold": n_runs / t_cold, "serial": n_runs / t_serial, "cached": n_runs / t_warm, "tables": cold}


def figure_times(tables: data.Tables, out_dir: Path) -> dict[str, float]:
    calls = {
        "throughput_vs_share": lambda: plots.throughput_vs_share(tables),
        "std_vs_share": lambda: plots.std_vs_share(tables),
        "link_utilisation": lambda: plots.link_utilisation(tables),
        "timeseries (one line per run)": lambda: plots.timeseries(tables),
        "socket_state (6 runs)": lambda: plots.socket_state(tables, panels=("rates", "inflight", "gains")),
    }
    out = {}
    for name, call in calls.items():
        t0 = time.perf_counter()
        fig, _ = call()
        plots.save(fig, out_dir, name.split()[0])
        plt.close(fig)
        out[name] = time.perf_counter() - t0
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bbrlab-bench-ingest-") as tmp:
        campaign, plain, theirs = Path(tmp) / "campaign", Path(tmp) / "campaign-no-ss", Path(tmp) / "authors"
        _, t_build = timed(replicate, FIXTURE, campaign, N_RUNS)
        replicate(FIXTURE, plain, N_RUNS, ss_every=0)
        replicate_authors(FIXTURE, theirs, N_RUNS)
        print(f"built {N_RUNS} runs per layout from {len(list((FIXTURE / 'runs').iterdir()))} real ones "
              f"({t_build:.1f} s for bbrlab's)")

        ours = read_speeds(campaign, N_RUNS, "bbrlab")
        ours_plain = read_speeds(plain, N_RUNS, "bbrlab, no ss.log")
        authors = read_speeds(theirs, N_RUNS, "authors")
        for kind in ("cold", "serial", "cached"):
            print(f"authors / bbrlab ({kind}): {authors[kind] / ours_plain[kind]:.2f}x against runs without ss.log, "
                  f"{authors[kind] / ours[kind]:.2f}x against one in {SS_EVERY} with ss.log (goal: >= 0.5x)")

        naive, t_naive = timed(naive_ingest, campaign, N_NAIVE)
        naive_rate = N_NAIVE / t_naive
        print(f"naive json.load + DataFrame append, first {N_NAIVE} runs: {t_naive:6.2f} s  {naive_rate:8.0f} runs/s")
        print(f"ratio cold ingest / naive: {ours['cold'] / naive_rate:.1f}x   "
              f"cached / naive: {ours['cached'] / naive_rate:.0f}x   "
              f"(the naive loop slows further as the frame grows: its rate at 20,000 would be lower)")
        same = naive.set_index("run_id")["throughput_mbit"]
        mine = ours["tables"].runs.set_index("run_id").loc[same.index, "throughput_mbit"]
        assert (mine - same).abs().max() < 1e-9, "naive and fast ingest disagree"

        times = figure_times(ours["tables"], Path(tmp) / "figures")
        for name, seconds in times.items():
            print(f"figure {name:32s} {seconds:6.2f} s (PDF + PNG, {N_RUNS} runs)")
        print(f"figures total: {sum(times.values()):.1f} s")


if __name__ == "__main__":
    main()
