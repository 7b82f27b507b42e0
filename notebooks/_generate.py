"""Write the analysis notebooks (without outputs) from the cell sources below.

Run ``.venv/bin/python notebooks/_generate.py`` after editing a notebook's cells here, so the
committed notebooks stay thin, reviewed code and ``nbstripout --verify`` passes. Each notebook has
a cell tagged ``parameters`` (papermill injects ``data_dir`` and ``out_dir`` after it).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

COMMON_PARAMETERS = '''data_dir = "../data"          # a campaign, a folder of campaigns, or the authors' dataset
out_dir = "../build/figures"  # figures (PDF + PNG + points.json) go here
filters = {}                  # keep only matching runs, e.g. {"variant": ["BBRv3", "Cubic"], "rtt_ms": [10, 20]}
include_sampled = False       # ss-sampled runs cost the sender CPU: the paper keeps them out of throughput figures'''

LOAD = '''from bbrlab import data, plots

tables = data.apply_filters(data.load(data_dir), filters)
runs, sample_notes = (tables.runs, []) if include_sampled else data.unsampled(tables.runs)
print(f"{len(runs)} successful runs, {len(tables.intervals)} intervals, {len(tables.ss)} ss samples from {data_dir}")
for note in tables.notes + sample_notes:
    print("note:", note)
if runs.empty:
    print("No runs to plot: every figure below says so instead of showing data.")'''


def figure_cell(select: str, call: str, name: str, needs: str = "{}") -> str:
    """A cell: pick the runs a figure is about (saying what is missing), plot, save, show, table."""
    return f'''sel, notes = data.select(runs, {select})
for note in notes + data.missing_dimensions(sel, {needs}):
    print("missing:", note)
fig, table = {call}
plots.save(fig, out_dir, "{name}")
plots.show(fig)
table'''


NOTEBOOKS = {
    "throughput_vs_share": (
        "# Throughput vs CPU share (figures 1, 4, 7, 8, 12, 13, 14)\n\n"
        "Median throughput of each point over its repetitions (line) with the interquartile range (band), "
        "against the sender's CPU share under SCHED_DEADLINE. Runs without a policy (100 %) appear in "
        "every timeslice panel. Figure 1 compares BBR with Cubic at 30/50/70 % share; figure 4 facets "
        "timeslice x RTT at 100 Mbit/s; figures 7/13 sweep the bandwidth at 10 ms RTT (log y) and 8/14 the "
        "RTT at 100 Mbit/s (the paper shows BBRv3 and, in the appendix, BBRv1: one row per CCA here); "
        "figure 12 is the standard deviation of per-run throughput.",
        COMMON_PARAMETERS + '''
fig1_shares = [30, 50, 70]    # figure 1: CPU shares compared
rate_mbit = 100               # figures 4, 8, 12, 14: the fixed bandwidth
sweep_rtt_ms = 10             # figures 7, 13: the fixed RTT of the bandwidth sweep''',
        [
            ("## Figure 1: BBR vs Cubic at a few CPU shares",
             figure_cell("cpu_share_pct=fig1_shares", 'plots.throughput_vs_share(sel, row=None, col="timeslice_ms", '
                         'title="Figure 1: throughput at decreasing CPU shares")', "fig01_motivation",
                         '{"cpu_share_pct": 2, "cca": 2}')),
            ("## Figure 4: median throughput, timeslice x RTT",
             figure_cell("rate_mbit=rate_mbit", 'plots.throughput_vs_share(sel, title="Figure 4: median throughput '
                         'vs CPU share")', "fig04_throughput_vs_share",
                         '{"cpu_share_pct": 2, "timeslice_ms": 2, "rtt_ms": 2, "cca": 2}')),
            ("## Figures 7 and 13: bandwidth sweep (log y)",
             figure_cell("rtt_ms=sweep_rtt_ms", 'plots.sweep(sel, over="rate_mbit", logy=True, '
                         'title="Figures 7/13: bandwidth sweep")', "fig07_13_bandwidth_sweep",
                         '{"rate_mbit": 2, "cpu_share_pct": 2}')),
            ("## Figures 8 and 14: RTT sweep",
             figure_cell("rate_mbit=rate_mbit", 'plots.sweep(sel, over="rtt_ms", logy=False, '
                         'title="Figures 8/14: RTT sweep")', "fig08_14_rtt_sweep", '{"rtt_ms": 2, "cpu_share_pct": 2}')),
            ("## Figure 12: standard deviation over repetitions",
             figure_cell("rate_mbit=rate_mbit", 'plots.std_vs_share(sel, title="Figure 12: standard deviation")',
                         "fig12_std", '{"cpu_share_pct": 2, "repetition": 2}')),
        ],
    ),
    "timeseries": (
        "# Throughput over time (figure 5)\n\n"
        "One line per run (iperf3's per-interval receiver throughput summed over streams), one panel per "
        "CCA x timeslice, at one CPU share, bandwidth and RTT (the paper: 25 %, 100 Mbit/s, 10 ms, "
        "timeslice 1 vs 10 ms).",
        COMMON_PARAMETERS + '''
cpu_share_pct = 25
rate_mbit = 100
rtt_ms = 10
timeslices_ms = [1, 10]''',
        [
            ("## Figure 5",
             figure_cell("cpu_share_pct=cpu_share_pct, rate_mbit=rate_mbit, rtt_ms=rtt_ms, timeslice_ms=timeslices_ms",
                         'plots.timeseries(tables.intervals, sel, title="Figure 5: throughput over time")',
                         "fig05_timeseries", '{"timeslice_ms": 2, "cca": 2}')),
        ],
    ),
    "socket_state": (
        "# Socket state of single flows (figures 6, 9, 11)\n\n"
        "From the `ss` samples: pacing rate, delivery rate and BBR's bandwidth estimate (6), plus bytes in "
        "flight in BBR's own BDP (bw estimate x min RTT) with the 1 BDP line (9), plus pacing and cwnd gains "
        "(11). By default one representative run per CCA x timeslice x share: the run whose throughput is "
        "closest to its group's median. Runs without ss samples cannot appear.",
        COMMON_PARAMETERS + '''
include_sampled = True   # these figures are made of the sampled runs
run_ids = None   # or a list of run ids to show
max_runs = 6''',
        [
            ("## Figure 6: pacing rate, delivery rate, bandwidth estimate",
             figure_cell("", 'plots.socket_state(tables.ss, sel, run_ids=run_ids, max_runs=max_runs, '
                         'panels=("rates",))', "fig06_rates")),
            ("## Figure 9: rates and inflight in BDP",
             figure_cell("", 'plots.socket_state(tables.ss, sel, run_ids=run_ids, max_runs=max_runs, '
                         'panels=("rates", "inflight"))', "fig09_inflight")),
            ("## Figure 11: rates, inflight and gains",
             figure_cell("", 'plots.socket_state(tables.ss, sel, run_ids=run_ids, max_runs=max_runs, '
                         'panels=("rates", "inflight", "gains"))', "fig11_gains")),
        ],
    ),
    "patched_vs_original": (
        "# Patched vs original BBR (figures 10, 15)\n\n"
        "Median throughput (IQR band) of the inflight-deficit patch against the original algorithm at one "
        "bandwidth, per timeslice x RTT, for every BBR version that has patched runs (the `variant` column: "
        "bbrlab's `bbr2b` module, the authors' `_fixed` kernels). The paper's figure 10 is BBRv3, figure 15 "
        "BBRv1: lines read e.g. \"BBRv3\" and \"BBRv3 patched\".",
        COMMON_PARAMETERS + '''
rate_mbit = 100''',
        [
            ("## Figures 10 and 15",
             figure_cell("rate_mbit=rate_mbit", 'plots.patched_vs_original(sel, title="Figures 10/15: '
                         'patched vs original")', "fig10_15_patched_vs_original",
                         '{"patched": 2, "cpu_share_pct": 2}')),
        ],
    ),
    "link_utilisation": (
        "# Link utilisation per hypervisor, kernel and CCA (poster figure 2)\n\n"
        "Throughput / configured rate for every run (dots) and its median (line, IQR band) over the "
        "bandwidth, one line per sender kernel and CCA, panels 1 vs 4 flows x hypervisor, at the poster's "
        "0.1 % loss.",
        COMMON_PARAMETERS + '''
loss_pct = 0.1''',
        [
            ("## Poster figure 2",
             figure_cell("loss_pct=loss_pct", 'plots.link_utilisation(sel, title="Poster figure 2: link utilisation")',
                         "poster_fig2_link_utilisation", '{"streams": 2, "hypervisor": 2, "rate_mbit": 2}')),
        ],
    ),
    "fidelity": (
        "# Fidelity report: the paper's main claims vs this dataset\n\n"
        "Each claim of the 2BRobust paper is computed from the data by `bbrlab.fidelity` (nothing here is "
        "typed in): Cubic robust under contention, BBR capped at low shares, the recovery share per "
        "timeslice, the patch shifting it lower, the inflight deficit and the patched gain. A verdict is "
        "`reproduced`, `partly`, `not reproduced` or `no data`.\n\n"
        "The paper ran KVM guests on 24-core servers. The local testbed runs QEMU TCG on whatever machine it "
        "is given (the records say which): a TCG guest spends far more host CPU per packet, so at a low CPU "
        "share even Cubic can become CPU-limited, and the shares at which BBR recovers move. Where a claim "
        "does not reproduce here, that is a finding about the testbed, stated as such.",
        COMMON_PARAMETERS + "\ninclude_sampled = True   # claims on throughput leave sampled runs out themselves",
        [
            ("## Where this data ran", "from bbrlab import fidelity\n\nnote = fidelity.testbed_note(runs)\nprint(note)"),
            ("## Claims", "claims = fidelity.claims(tables)\nprint(\"written:\", fidelity.write_report(claims, "
             "note, out_dir))\nclaims[[\"key\", \"subject\", \"verdict\", \"paper\", \"measured\"]].style.set_properties("
             "**{\"text-align\": \"left\", \"white-space\": \"pre-wrap\"})"),
            ("## The medians behind the claims",
             "fidelity.medians(data.unsampled(runs)[0]).pivot_table(index=[\"variant\", \"timeslice_ms\"], columns=\"cpu_share_pct\", "
             "values=\"utilisation\").round(2)"),
        ],
    ),
}


def build(name: str, intro: str, parameters: str, figures: list[tuple[str, str]]) -> nbformat.NotebookNode:
    cells = [new_markdown_cell(intro), new_code_cell(parameters, metadata={"tags": ["parameters"]}),
             new_code_cell(LOAD)]
    for title, code in figures:
        cells += [new_markdown_cell(title), new_code_cell(code)]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main() -> None:
    for name, spec in NOTEBOOKS.items():
        nb = build(name, *spec)
        for i, cell in enumerate(nb.cells):
            cell["id"] = str(i)  # the ids nbstripout normalises to
        nbformat.validate(nb)
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print(f"wrote {name}.ipynb")


if __name__ == "__main__":
    main()
