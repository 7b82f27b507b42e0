"""Measure the sender's CPU ceiling (``bbrlab calibrate``): what the contended sender can carry at all.

For each timeslice x CPU share x RTT of a campaign (or a grid given directly), the least CPU-limited
configuration is run a few times with the contention applied exactly as in a measurement: Cubic, one
stream and several, over an *unshaped* link (the point's RTT as netem delay, no token bucket, no
bottleneck queue: :meth:`bbrlab.scenario.scenario.Link.unshaped`), each run as long as the campaign's runs
(:meth:`CalibrationSpec.covering`). Each run is a normal run of :class:`bbrlab.run.runner.Runner`, planned and
recorded by the campaign engine, opened the one way a campaign is opened on one testbed
(:func:`bbrlab.campaign.single.run_on_testbed`), in ``DIR/calibration/<key>/``, so a calibration resumes after a
crash and every number in ``DIR/calibration.json`` can be traced to its runs. How
the runs become ceilings (the highest throughput of any run, an upper bound) and which limit each point
measured is :mod:`bbrlab.calibration.ceilings`.

Another contention model than deadline (cfs-quota, cfs-burst, credit, competing-load) is calibrated at its own
points (``model_contentions``, keyed by the model and its parameters: ``cfs100ms-sh25-rtt20ms``), applied as the
campaign applies it, so each model's runs are checked against the ceiling of their own contention.

At 100 % share there is no policy and the timeslice does not matter: that point is run once per RTT
(key ``sh100-rtt20ms``) and stands for every timeslice. A *bridge reference* is run there too: the same
transfer with no qdisc at all on the emulator (RTT 0), to tell what netem itself costs.

API::

    from bbrlab.calibration import calibrate
    from bbrlab.calibration.plan import CalibrationSpec
    spec = CalibrationSpec.for_campaign(load_spec("specs/demo.yaml"))
    cal = calibrate.calibrate(testbed, spec, "runs/demo")      # writes runs/demo/calibration.json
    cal.find(PointKey.of(10, 25, 20)).ceiling_mbit
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from bbrlab.campaign.options import CampaignOptions
from bbrlab.campaign.sameness import testbed_differences
from bbrlab.campaign.single import run_on_testbed
from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.run import record as rec
from bbrlab.run.ceiling import FILE_NAME, Calibration
from bbrlab.run.runner import Runner

from .ceilings import (
    REFERENCE_KEY,
    emulator_busy,
    host_busy,
    point_of,
    read_records,
    sender_usage,
    summarise,
    typed_record,
)
from .plan import CalibrationSpec

#: Folder of the calibration runs inside the campaign directory (one sub-folder per testbed and grid).
RUNS_FOLDER = "calibration"


def runs_key(testbed: dict, spec: CalibrationSpec) -> str:
    """The runs' folder name: testbed, accelerator, sender kernel and grid, so a calibration on another
    testbed or kernel never resumes (or mixes with) this one."""
    parts = [testbed.get("name"), testbed.get("accelerator"), testbed.get("sender_kernel"), spec.digest()]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(p) for p in parts))


def host_load() -> dict:
    """The load of the machine bbrlab runs on (for a local testbed, the machine that runs the VMs)."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1_5_15": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": os.cpu_count(),
            "at": rec.now_iso()}


def calibrate(testbed, spec: CalibrationSpec, out_dir: str | Path, *, runner=None, progress: bool = True,
              fresh: bool = False, say: Callable[[str], None] | None = None) -> Calibration:
    """Measure the ceilings of ``spec`` on ``testbed`` and write ``out_dir/calibration.json``.

    The runs go to ``out_dir/calibration/<testbed-accelerator-kernel-grid>/``; complete runs there are
    reused (a killed calibration resumes), and when all are complete and ``calibration.json`` already
    summarises them it is returned as it is (so runs that point to it stay valid). ``fresh`` moves that
    folder aside first and measures anew.
    ``runner`` (a :class:`~bbrlab.run.runner.Runner` without a calibration) may be shared with a campaign;
    the caller holds the testbed lock and closes the runner. ``say`` gets one line per finished run. A CPU
    partition a killed campaign left is removed first (one whose campaign still runs is refused,
    :func:`bbrlab.run.recovery.clear_partitions`).
    """

    out = Path(out_dir)
    described = testbed.describe()
    runs_dir = out / RUNS_FOLDER / runs_key(described, spec)
    if fresh and runs_dir.exists():
        os.replace(runs_dir, runs_dir.with_name(f"{runs_dir.name}.replaced-{rec.now_iso().replace(':', '')}"))
    differences = testbed_differences(runs_dir, [described])
    if differences:  # the folder's name holds testbed, accelerator and kernel, not e.g. the sender's vCPUs
        raise ValidationError("--testbed", described.get("name"), f"the testbed these calibration runs were made on: "
                              f"{'; '.join(differences)}. Bring that testbed back, or calibrate with --fresh to "
                              f"measure anew (the runs in {runs_dir} are moved aside)")
    existing = _complete_calibration(out, runs_dir)
    if existing is not None:
        return existing
    runner = runner or Runner(testbed)
    if getattr(runner, "calibration", None) is not None:
        raise BbrlabError("calibrate needs a Runner without a calibration (its runs define the ceilings)")
    load_before = host_load()

    def on_run(record: dict) -> None:  # the record's JSON as the campaign committed it
        if say is None:
            return
        run = typed_record(record)
        s, meta, point = run.scenario, run.metadata, point_of(run)
        key = REFERENCE_KEY if point == spec.reference_point() else point.text
        thr = meta.iperf.receiver_mbit if meta.iperf is not None else None
        measured = run.status == "ok"
        used, wanted = sender_usage(meta) if measured else (None, None)
        emu, host = (emulator_busy(meta), host_busy(meta)) if measured else (None, None)
        what = f"{thr:.1f} Mbit/s" if thr is not None else f"failed: {run.reason}"
        say(f"  {key} {s.flow.params.streams} stream(s) rep {s.repetition}: {what}"
            + (f" (sender vCPU used {_pct(used)}, wanted {_pct(wanted)}; emulator busiest CPU {_pct(emu)}; "
               f"host {_pct(host)})" if measured else ""))

    # the one way a campaign is opened on one testbed; it removes a CPU partition a killed campaign left first
    # (ceilings measured on a partition's few CPUs would be wrong)
    run_on_testbed(spec, runs_dir, testbed, options=CampaignOptions(progress=progress), runner=runner, on_run=on_run)
    testbed_now = dict(described)
    ok, _ = read_records(runs_dir)
    if ok:  # the sender's kernel as the runs' own probes read it
        testbed_now["sender_kernel"] = ok[-1].metadata.testbed.sender_kernel
    cal = summarise(spec, runs_dir, testbed_now, host_load={"before": load_before, "after": host_load()},
                    runs_dir_text=os.path.relpath(runs_dir, out))
    cal.save(out / FILE_NAME)
    return cal


def _complete_calibration(out: Path, runs_dir: Path) -> Calibration | None:
    """The calibration file in ``out`` when it summarises ``runs_dir`` and nothing is left to run there."""
    from bbrlab.campaign.directory import status
    from bbrlab.run.ceiling import load

    path = out / FILE_NAME
    if not path.is_file() or not (runs_dir / "plan.json").is_file():
        return None
    st = status(runs_dir)
    if st.remaining or st.running:
        return None
    cal = load(path)
    return cal if cal.runs_dir == os.path.relpath(runs_dir, out) else None


def grid_table(cal: Calibration) -> list[list[str]]:
    """The ceilings as rows ``[key, rtt, timeslice, share, ceiling, streams, limit, sender used/wanted,
    emulator, host]``."""
    rows = []
    for p in cal.points:
        ts = p.model_tag or ("any" if p.timeslice_ms is None else f"{p.timeslice_ms:g} ms")
        rows.append([p.key, f"{p.rtt_ms:g} ms", ts, f"{p.cpu_share_pct:g} %",
                     "-" if p.ceiling_mbit is None else f"{p.ceiling_mbit:.1f}", str(p.streams or "-"), p.limit,
                     _pct_pair(p.sender_cpu_pct, p.sender_demand_pct), _pct(p.emulator_busy_pct),
                     _pct(p.host_busy_pct)])
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} %"


def _pct_pair(a: float | None, b: float | None) -> str:
    return f"{_pct(a)} / {_pct(b)}"


def format_grid(cal: Calibration) -> str:
    """The ceiling grid as aligned text (what ``bbrlab calibrate`` prints)."""
    head = ["point", "RTT", "timeslice", "share", "ceiling Mbit/s", "streams", "limit", "sender CPU used / wanted",
            "emulator busiest CPU", "host CPUs"]
    rows = [head, *grid_table(cal)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if cal.reference:
        r = cal.reference
        bridge = "-" if r.get("bridge_only_mbit") is None else f"{r['bridge_only_mbit']:.1f} Mbit/s"
        lines.append(f"bridge reference (100 %, no qdisc on the emulator): {bridge}, {r.get('streams') or '-'} "
                     f"stream(s), sender wanted {_pct(r.get('sender_demand_pct'))}, emulator busiest CPU "
                     f"{_pct(r.get('emulator_busy_pct'))}, host {_pct(r.get('host_busy_pct'))}; {r.get('reading')}")
    t = cal.testbed
    load = (cal.host_load.get("before") or {}).get("loadavg_1_5_15")
    lines.append(f"testbed {t.get('name')} ({t.get('kind')}, {t.get('accelerator')}), sender kernel "
                 f"{t.get('sender_kernel')}, {t.get('sender_vcpus') or '?'} vCPU; measured {cal.created_at}"
                 + (f"; host load average before {load}" if load else ""))
    return "\n".join(lines)
