"""Ingest and figure speed on 20,000 runs, against a naive json.load + DataFrame-append loop.

The 20,000 runs are copies of the real host-netns runs in tests/fixtures/campaign (iperf3 and ss
files hard-linked, record.json rewritten with a new run id; one copy in ten keeps its ss.log, as sampled runs are a
minority), made in a temporary directory for this
benchmark only and deleted afterwards. Nothing here goes near ``data/``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from bbrlab import data, plots

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "campaign"
N_RUNS = 20_000
N_NAIVE = 2_000  # the naive loop is quadratic; it is timed on the first 2,000 runs only
SS_EVERY = 10  # ss is sampled in separate runs (sampling costs CPU): one copy in 10 keeps its ss.log


def replicate(source: Path, target: Path, n_runs: int) -> None:
    """``n_runs`` run directories cycling over the real ones in ``source``."""
    originals = sorted((source / "runs").iterdir())
    records = [json.loads((r / "record.json").read_text()) for r in originals]
    (target / "runs").mkdir(parents=True)
    for i in range(n_runs):
        k = i % len(originals)
        run_id = f"{originals[k].name}-copy{i:05d}"
        run_dir = target / "runs" / run_id
        run_dir.mkdir()
        for name in ("iperf.json", "ss.log"):
            if name == "ss.log" and i % SS_EVERY:
                continue
            if (originals[k] / name).exists():
                os.link(originals[k] / name, run_dir / name)
        record = dict(records[k], run_id=run_id)
        record["scenario"] = dict(record["scenario"], repetition=i // len(originals))
        (run_dir / "record.json").write_text(json.dumps(record))


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


def figure_times(tables: data.Tables, out_dir: Path) -> dict[str, float]:
    runs = tables.runs
    calls = {
        "throughput_vs_share": lambda: plots.throughput_vs_share(runs),
        "std_vs_share": lambda: plots.std_vs_share(runs),
        "link_utilisation": lambda: plots.link_utilisation(runs),
        "timeseries (one line per run)": lambda: plots.timeseries(tables.intervals, runs),
        "socket_state (6 runs)": lambda: plots.socket_state(tables.ss, runs, panels=("rates", "inflight", "gains")),
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
        campaign = Path(tmp) / "campaign"
        _, t_build = timed(replicate, FIXTURE, campaign, N_RUNS)
        print(f"built {N_RUNS} runs from {len(list((FIXTURE / 'runs').iterdir()))} real ones in {t_build:.1f} s")

        cold, t_cold = timed(data.ingest, campaign)
        c = cold.tables.counts()
        print(f"data.ingest cold:   {t_cold:6.2f} s  {N_RUNS / t_cold:8.0f} runs/s  "
              f"({c['runs']} runs, {c['intervals']} intervals, {c['ss']} ss rows, {os.cpu_count()} workers)")
        serial, t_serial = timed(data.read_campaign, campaign, cache=False, workers=1)
        print(f"read_campaign 1 worker, no cache: {t_serial:6.2f} s  {N_RUNS / t_serial:8.0f} runs/s")
        warm, t_warm = timed(data.ingest, campaign)
        assert warm.cached
        print(f"data.ingest cached: {t_warm:6.2f} s  {N_RUNS / t_warm:8.0f} runs/s (parquet reused)")

        naive, t_naive = timed(naive_ingest, campaign, N_NAIVE)
        naive_rate = N_NAIVE / t_naive
        print(f"naive json.load + DataFrame append, first {N_NAIVE} runs: {t_naive:6.2f} s  {naive_rate:8.0f} runs/s")
        print(f"ratio cold ingest / naive: {N_RUNS / t_cold / naive_rate:.1f}x   "
              f"cached / naive: {N_RUNS / t_warm / naive_rate:.0f}x   "
              f"(the naive loop slows further as the frame grows: its rate at 20,000 would be lower)")
        same = naive.set_index("run_id")["throughput_mbit"]
        ours = cold.tables.runs.set_index("run_id").loc[same.index, "throughput_mbit"]
        assert (ours - same).abs().max() < 1e-9, "naive and fast ingest disagree"

        times = figure_times(cold.tables, Path(tmp) / "figures")
        for name, seconds in times.items():
            print(f"figure {name:32s} {seconds:6.2f} s (PDF + PNG, {N_RUNS} runs)")
        print(f"figures total: {sum(times.values()):.1f} s")


if __name__ == "__main__":
    main()
