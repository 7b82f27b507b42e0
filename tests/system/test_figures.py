"""`bbrlab figures` on a small REAL campaign: iperf3 between two network namespaces on this host.

The campaign is recorded by the fixture (tests/netns_campaign.py): cubic and bbr, the iperf3 client at
25 % CPU share (SCHED_DEADLINE 1 ms / 4 ms) and unrestricted, 2 repetitions of 2 s each, tbf 100 Mbit/s,
ss sampled every 200 ms. Then every notebook is executed by papermill through the CLI, and the
plotted medians are compared with medians computed here straight from the iperf3 JSON files.
"""

import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.netns_campaign import small_grid

pytestmark = pytest.mark.system

ROOT = Path(__file__).parents[2]
LOCK_WAIT_S = int(os.environ.get("BBRLAB_LOCK_WAIT_S", "900"))  # a busy shared machine may need longer


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """Record the runs in a child process, holding the lock of this host-namespace "testbed"."""
    from bbrlab.testbed import testbed_lock

    directory = tmp_path_factory.mktemp("netns") / "campaign"
    with testbed_lock("host-netns", timeout_s=LOCK_WAIT_S):
        proc = subprocess.run([sys.executable, "-m", "tests.netns_campaign", str(directory)],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, f"recording failed (or the host-netns lock stayed busy): {proc.stdout}{proc.stderr}"
    assert len(list((directory / "runs").iterdir())) == len(small_grid())
    return directory


class _Render:
    """``bbrlab figures --data DATA --out OUT ARGS`` started in the background (its output into files: no pipe
    fills while another render is waited for)."""

    def __init__(self, data: Path, out: Path, *args: str, timeout_s: float):
        self.out, self.timeout_s = out, timeout_s
        self._log = out.with_name(out.name + ".log")
        self._files = [open(self._log.with_suffix(f".{n}"), "w+") for n in ("stdout", "stderr")]  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "bbrlab.cli.main", "figures", "--data", str(data),
                                      "--out", str(out), *args], stdout=self._files[0], stderr=self._files[1],
                                     text=True, cwd=ROOT)
        self._result: subprocess.CompletedProcess | None = None

    def result(self) -> subprocess.CompletedProcess:
        """The render's return code and output, once it has ended (killed past its timeout)."""
        if self._result is None:
            try:
                self.proc.wait(timeout=self.timeout_s)
            finally:
                self.end()
            texts = []
            for f in self._files:
                f.seek(0)
                texts.append(f.read())
                f.close()
            self._result = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, *texts)
        return self._result

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def renders(tmp_path_factory):
    """The renders of the authors' layout and of data/ (each a copy: load writes its cache), started on first
    use. Each takes tens of seconds of one core running every notebook, so they go on beside each other and
    beside the campaign's render (on this 2-core machine the module took 140 s with one render after another)."""
    import shutil

    started: dict[str, _Render] = {}

    def start(name: str) -> _Render:
        if name not in started:
            root = tmp_path_factory.mktemp(name)
            source, copy = (ROOT / "tests" / "fixtures" / "authors", "dataset") if name == "authors" else \
                (ROOT / "data", "data")
            shutil.copytree(source, root / copy)
            started[name] = _Render(root / copy, root / "figures", timeout_s=1200)
        return started[name]

    yield start
    for render in started.values():
        render.end()


@pytest.fixture(scope="module")
def rendered(campaign, renders, tmp_path_factory):
    renders("authors")  # started once the campaign is recorded (its runs are timed), to run beside this one
    renders("data")
    out = tmp_path_factory.mktemp("figures")
    # every run of this campaign is ss-sampled (throughput figures leave sampled runs out unless asked) and
    # lossless (the poster's figure selects 0.1 % loss by default)
    proc = _Render(campaign, out, "-p", "include_sampled=true", "-p", "loss_pct=0", timeout_s=600).result()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


#: The host's mainline kernel registers BBRv1 as bbr.
LABELS = {"bbr": "BBRv1", "cubic": "Cubic"}


def medians_from_raw_files(campaign: Path, value) -> dict:
    """(label, cpu_share_pct) -> median of value(report, record) over repetitions, without bbrlab.analysis.data."""
    groups = defaultdict(list)
    for run in (campaign / "runs").iterdir():
        record = json.loads((run / "record.json").read_text())
        report = json.loads((run / "iperf.json").read_text())
        sc = record["scenario"]
        groups[(LABELS[sc["flow"]["cca"]], sc["contention"]["cpu_share_pct"])].append(value(report, sc))
    return {k: statistics.median(v) for k, v in groups.items()}


def test_every_notebook_renders(rendered):
    out, stdout = rendered
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb") if not p.name.startswith("_"))
    assert notebooks and all(f"{name} ... ok" in stdout for name in notebooks), stdout
    for name in notebooks:
        executed = json.loads((out / "notebooks" / f"{name}.ipynb").read_text())
        errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors
    for figure in ("fig04_throughput_vs_share", "fig05_timeseries", "fig09_inflight", "poster_fig2_link_utilisation"):
        assert (out / f"{figure}.pdf").stat().st_size > 0 and (out / f"{figure}.png").stat().st_size > 0


def test_plotted_throughput_medians_equal_the_runs_medians(rendered, campaign):
    out, _ = rendered
    expected = medians_from_raw_files(campaign, lambda r, sc: r["end"]["sum_received"]["bits_per_second"] / 1e6)
    (panel,) = json.loads((out / "fig04_throughput_vs_share.points.json").read_text())
    plotted = {(line["label"], x): y for line in panel["lines"] for x, y in zip(line["x"], line["y"], strict=True)}
    assert set(plotted) == set(expected)
    for key, median in expected.items():
        assert plotted[key] == pytest.approx(median, rel=1e-9)


def test_plotted_link_utilisation_is_median_throughput_over_rate(rendered, campaign):
    """One line per CCA and condition: the uncontended and the contended runs at one rate are two conditions
    (runkey), so each CCA has a line ``[none]`` and a line ``[deadline]``, each the median of its own runs."""
    out, _ = rendered
    panels = json.loads((out / "poster_fig2_link_utilisation.points.json").read_text())
    expected = defaultdict(list)
    for run in (campaign / "runs").iterdir():
        record, report = (json.loads((run / n).read_text()) for n in ("record.json", "iperf.json"))
        mode = "none" if record["scenario"]["contention"]["cpu_share_pct"] >= 100 else "deadline"
        expected[f"{LABELS[record['scenario']['flow']['cca']]} [{mode}]"].append(
            report["end"]["sum_received"]["bits_per_second"] / 1e6 / record["scenario"]["link"]["rate_mbit"])
    lines = {line["label"].split(" / ")[-1]: line["y"] for line in panels[0]["lines"]}
    assert lines.keys() == expected.keys()
    for name, values in expected.items():
        assert lines[name] == [pytest.approx(statistics.median(values), rel=1e-9)]


def test_socket_state_figure_draws_the_sampled_bbr_estimate(rendered, campaign):
    """Each drawn bw line is, value for value, the bw_mbit series of one sampled bbr run's ss.log."""
    from bbrlab.sampling.ss import parse_ss_log

    out, _ = rendered
    panels = json.loads((out / "fig06_rates.points.json").read_text())
    drawn = [line["y"] for p in panels for line in p["lines"] if line["label"] == "BBR bw estimate"]
    assert drawn, "bbr runs were sampled, so a bandwidth estimate must be drawn"
    series = []
    for run in (campaign / "runs").iterdir():
        ports = [c["local_port"] for c in json.loads((run / "iperf.json").read_text())["start"]["connected"]]
        rows = sorted(parse_ss_log((run / "ss.log").read_text(), ports=ports), key=lambda r: r["t_s"])
        if rows and rows[0]["cca"] == "bbr":
            series.append([r["bw_mbit"] for r in rows])
    for y in drawn:
        assert any(len(y) == len(s) and y == pytest.approx(s) for s in series)


@pytest.fixture(scope="module")
def rendered_authors(renders):
    """Every notebook, through the CLI, on the authors'-layout fixture."""
    render = renders("authors")
    proc = render.result()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return render.out


def labels_of(out: Path, figure: str) -> set[str]:
    panels = json.loads((out / f"{figure}.points.json").read_text())
    return {line["label"] for p in panels for line in p["lines"]}


def test_notebooks_on_the_authors_layout_keep_versions_and_the_patch_apart(rendered_authors):
    out = rendered_authors
    # a line is one condition (bbrlab.analysis.runkey): the fixture's BBRv1 ran on two kernels and one Cubic run had
    # fq, so those lines name what sets them apart ("BBRv1 [kernel BBRv3]")
    assert {"BBRv1", "BBRv3", "BBRv3 patched", "Cubic"} <= bare(labels_of(out, "fig04_throughput_vs_share"))
    assert {"BBRv3", "BBRv3 patched"} <= bare(labels_of(out, "fig10_15_patched_vs_original"))
    titles = [p["title"] for p in json.loads((out / "fig11_gains.points.json").read_text())]
    assert any(t.startswith("BBRv3 patched") for t in titles) and any(t.startswith("BBRv1 |") for t in titles)
    claims = json.loads((out / "fidelity.json").read_text())["claims"]
    assert {"BBRv1 vs BBRv1 patched", "BBRv3 vs BBRv3 patched"} <= bare(c["subject"] for c in claims)


def bare(labels) -> set[str]:
    """Labels without what sets a condition or a setting apart (``"Cubic [qdisc fq]"`` -> ``"Cubic"``)."""
    return {label.split(" [")[0] for label in labels}


# -- no figure hides data it was given (issue 31): every notebook on data/ and on the authors' layout ---------

@pytest.fixture(scope="module")
def rendered_data(renders):
    """Every notebook, through the CLI, on the committed data/. The return code is checked by the test, after
    the hidden points (their list says more)."""
    render = renders("data")
    return render.out, render.result()


def hidden_points(out: Path) -> dict[str, list[dict]]:
    """Per figure of ``out``, the drawn points outside their panel's axes; every panel must say its limits
    (else the check would pass by seeing nothing)."""
    from bbrlab.analysis import offaxis

    found = {}
    files = sorted(out.glob("*.points.json"))
    assert files, f"no figures in {out}"
    for path in files:
        panels = json.loads(path.read_text())
        assert all("xlim" in p and "ylim" in p for p in panels), f"{path.name}: panels without axis limits"
        hidden = offaxis.points_outside_axes(panels)
        if hidden:
            found[path.name] = offaxis.hidden_points_summary(path.name.removesuffix(".points.json"), hidden)
    return found


def test_no_figure_hides_data_on_the_committed_data(rendered_data):
    out, proc = rendered_data
    assert (out / "fig05_timeseries.points.json").exists(), proc.stdout + proc.stderr
    fig5 = json.loads((out / "fig05_timeseries.points.json").read_text())
    assert sum(len(p["lines"]) for p in fig5) > 0  # figure 5 draws runs from data/
    assert hidden_points(out) == {}
    assert proc.returncode == 0 and "hidden data" not in proc.stdout, proc.stdout + proc.stderr


def test_no_figure_hides_data_on_the_authors_layout(rendered_authors):
    assert hidden_points(rendered_authors) == {}
