"""Time outside the transfer, from the committed run records only (no testbed): ``python -m benchmarks run_gap``.

For each campaign directory ``data/*/`` whose ``runs/*/record.json`` carry ``metadata.timing`` (iperf3 runs:
the flow's ``duration_s``), printed:

- its era: the bbrlab commits that made its records (``metadata.versions.bbrlab_git``) and whether its records
  time every phase (``full``: each step of :meth:`bbrlab.run.runner.Runner._run` has its key, so the phases add
  up to the run's wall time) or only the five of the first version (``probe setup client stop verify``, where the
  client's phase also held the contention's setup and release);
- how many runs set the link (a changed link costs more), and the median seconds beyond the duration of those
  and of the others;
- the median ratio of the run's wall time (``run_wall_s``) to the flow's duration, and the median seconds beyond
  the duration, overall and at the worst contention point (timeslice, share) -- the goal is < 1 s beyond at
  every point;
- per phase the median seconds, and the median seconds no phase accounts for (``unaccounted``);
- where recorded, the campaign's seconds between two attempts (``between_s``: the previous commit and the loop).

Records of any era are read as they are: nothing is re-measured here. ``BBRLAB_DATA`` names another data dir.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

from bbrlab.analysis.records_reader import asked_duration_s
from bbrlab.run.runrecord import metadata_of, scenario_of

#: The phases of the first records' timing, before every phase had its key.
FIRST_PHASES = ("probe_s", "setup_s", "client_s", "stop_s", "verify_s")
#: Keys of ``metadata.timing`` that are not a phase of the run's wall time.
NOT_PHASES = ("run_wall_s", "attempt_wall_s", "between_s", "link_set")
GOAL_BEYOND_S = 1.0


def _runs(campaign: Path) -> list[dict]:
    out = []
    for path in sorted(campaign.glob("runs/*/record.json")):
        record = json.loads(path.read_text())
        scenario, meta = scenario_of(record), metadata_of(record, drop_unreadable=True)
        timing, duration = meta.timing, asked_duration_s(scenario.flow)
        if "run_wall_s" in timing and duration:
            contention = scenario.contention
            out.append({"timing": timing, "duration_s": float(duration),
                        "point": (contention.timeslice_ms, contention.cpu_share_pct),
                        "git": (meta.versions.bbrlab_git if meta.versions else None) or "unrecorded"})
    return out


def _phases(timing: dict) -> dict[str, float]:
    return {k: float(v) for k, v in timing.items() if k.endswith("_s") and k not in NOT_PHASES
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict]) -> dict:
    """The numbers printed for one campaign's ``runs`` (as :func:`_runs` reads them)."""
    beyond = [r["timing"]["run_wall_s"] - r["duration_s"] for r in runs]
    by_point: dict = defaultdict(list)
    for r, b in zip(runs, beyond, strict=True):
        by_point[r["point"]].append(b)
    worst = max(by_point, key=lambda p: _median(by_point[p]))
    phases: dict = defaultdict(list)
    for r in runs:
        for k, v in _phases(r["timing"]).items():
            phases[k].append(v)
    full = all(set(_phases(r["timing"])) - set(FIRST_PHASES) for r in runs)
    return {
        "runs": len(runs), "era": "full" if full else "first (5 phases)",
        "commits": sorted({r["git"] for r in runs}),
        "ratio": _median(r["timing"]["run_wall_s"] / r["duration_s"] for r in runs),
        "beyond_s": _median(beyond), "worst_point": worst, "worst_beyond_s": _median(by_point[worst]),
        "link_set": sum(bool(r["timing"].get("link_set")) for r in runs),
        "beyond_set_s": _median(b for r, b in zip(runs, beyond, strict=True) if r["timing"].get("link_set")),
        "beyond_kept_s": _median(b for r, b in zip(runs, beyond, strict=True) if not r["timing"].get("link_set")),
        "phases": {k: _median(v) for k, v in phases.items()},
        "unaccounted_s": _median(r["timing"]["run_wall_s"] - sum(_phases(r["timing"]).values()) for r in runs),
        "between_s": _median(r["timing"]["between_s"] for r in runs if "between_s" in r["timing"]),
    }


def main() -> None:
    data = Path(os.environ.get("BBRLAB_DATA", Path(__file__).resolve().parent.parent / "data"))
    print(f"seconds outside the transfer, from the records under {data} (medians; goal < {GOAL_BEYOND_S:.0f} s "
          "beyond the duration at every contention point)")
    for campaign in sorted(p for p in data.iterdir() if p.is_dir()):
        runs = _runs(campaign)
        if not runs:
            continue
        s = summarize(runs)
        ts, share = s["worst_point"]
        print(f"\n{campaign.name}: {s['runs']} runs, era {s['era']}, bbrlab {', '.join(s['commits'])}; "
              f"link set in {s['link_set']}: beyond the duration {s['beyond_set_s']:.2f} s then, "
              f"{s['beyond_kept_s']:.2f} s when kept")
        print(f"  wall/duration {s['ratio']:.3f}   beyond the duration {s['beyond_s']:.2f} s   worst point "
              f"({ts} ms, {share} %) {s['worst_beyond_s']:.2f} s "
              f"{'< goal' if s['worst_beyond_s'] < GOAL_BEYOND_S else '>= goal'}")
        phases = "  ".join(f"{k[:-2]} {v:.2f}" for k, v in s["phases"].items())
        between = "" if s["between_s"] != s["between_s"] else f"   between attempts {s['between_s']:.2f}"
        print(f"  phases (s): {phases}   unaccounted {s['unaccounted_s']:.2f}{between}")


if __name__ == "__main__":
    main()
