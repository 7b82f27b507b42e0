"""Running a campaign from a notebook cell (JupyterLab, Jupyter, VS Code), with the command line's safety.

::

    from bbrlab.campaign import notebook
    status = notebook.run("specs/tiny.yaml", "runs/tiny")   # a progress bar in the cell; the counts at the end

It is ``bbrlab campaign run SPEC --out DIR`` on one testbed (:func:`bbrlab.campaign.single.run_campaign_on`):
the testbed's lock first (a notebook and a terminal never drive one testbed at once), the pre-flight, the one
campaign loop, resume from ``DIR``. The progress bar is tqdm's notebook widget where the kernel has a front end
that shows widgets, and text elsewhere.

The kernel's stop button sends SIGINT, as Ctrl-C does in a terminal: the run in flight stops through its own
restoring code (the deadline policy comes off the vCPU threads, the qdiscs off the emulator), it is not
counted, and :func:`run` returns the counts after saying so in the cell, instead of a traceback. Running the
cell again resumes the campaign where it stopped.
"""

from __future__ import annotations

from pathlib import Path

from bbrlab.core.resources import spec_path
from bbrlab.core.signals import BETWEEN_RUNS, Interrupted

from .directory import PLAN_FILE, CampaignStatus, check_out_dir, status
from .options import DEFAULT_OPTIONS, CampaignOptions
from .single import run_campaign_on
from .spec import CampaignSpec, load_spec


def run(spec: str | Path | CampaignSpec, out: str | Path, *, testbed: str | None = None,
        calibration: str | Path | None = None, options: CampaignOptions = DEFAULT_OPTIONS) -> CampaignStatus | None:
    """Run (or resume) campaign ``spec`` (a spec file, a name under ``specs/``, or a :class:`CampaignSpec`) into
    ``out`` on ``testbed`` (default: the spec's, else the local testbed that is up), as ``bbrlab campaign run``
    does, with ``options`` (:class:`~bbrlab.campaign.options.CampaignOptions`: ``--retry-failed``,
    ``--allow-mixed``, ``--keep-link``; the progress bar is tqdm's widget in the cell unless
    ``options.progress`` is False); returns the campaign's counts (:class:`~bbrlab.campaign.directory.CampaignStatus`).

    Everything is checked before the testbed changes (the spec's values, ``out``, the testbed's kernels and
    limits). Stopped by the kernel's interrupt, it says in the cell how many runs are complete and returns the
    counts, or None when it stopped before the campaign's directory was made; the testbed is restored and
    calling it again resumes."""
    spec = spec if isinstance(spec, CampaignSpec) else load_spec(spec_path(spec))
    check_out_dir(spec, out)
    try:
        return run_campaign_on(spec, out, testbed, options=options, activity="campaign run (notebook)",
                               calibration_path=Path(calibration) if calibration else None)
    except (Interrupted, KeyboardInterrupt) as stop:
        if not (Path(out) / PLAN_FILE).is_file():
            print(f"campaign {spec.name} stopped before its first run; nothing was changed")
            return None
        st = status(out)
        lost = (BETWEEN_RUNS if getattr(stop, "between_runs", False)
                else "the run in flight was not recorded and the testbed is restored")
        print(f"campaign {spec.name} stopped: {st.done}/{st.planned} runs complete in {out}; {lost}. "
              "Run the cell again to resume.")
        return st
