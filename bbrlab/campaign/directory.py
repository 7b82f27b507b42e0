"""The campaign directory (``--out``): what may be used as one, writing a spec's plan into it (:func:`prepare`),
repairing one on resume, and counting its runs (:func:`status`).

``--out`` is accepted when it is missing, empty (or holds only what ``bbrlab calibrate --out`` made
there for it), or holds an earlier run of the same spec (its ``plan.json`` lists the same runs).
Anything else is refused with the reason, before anything is written: a campaign never writes ``spec.yaml``, ``plan.json``, ``runs/`` or ``.tmp/`` over files it
did not make (``--out .`` in a folder holding the user's own ``spec.yaml`` used to overwrite it).

On resume, :func:`repair` looks at what earlier processes left:

* a run directory without a readable ``record.json`` of that run (a half-copied ``runs/<id>/``, or
  ``failed/<id>.a<N>/``) is moved to ``set-aside/`` and named in a note: nothing is deleted, and the
  run is measured again;
* failed attempts numbered with a gap (``failed/<id>.a2`` without ``a1``) cannot be continued
  without renumbering recorded data, so the campaign stops before its first run and says which file to
  rename or move.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from bbrlab.core.errors import BbrlabError
from bbrlab.run import record as rec
from bbrlab.scenario.scenario import Scenario

from .repetitions import rule_of
from .search import make_gate, search_of

PLAN_SCHEMA = "bbrlab.plan/1"
SPEC_FILE = "spec.yaml"
PLAN_FILE = "plan.json"
LOCK_FILE = ".lock"
SET_ASIDE = "set-aside"
#: What ``bbrlab calibrate --out DIR`` leaves for the campaign that follows it (bbrlab.run.ceiling, bbrlab.calibration.calibrate).
CALIBRATION_FILE = "calibration.json"
CALIBRATION_DIR = "calibration"
#: What a campaign leaves in its directory before ``plan.json`` exists (a crash between the two writes).
_OWN_TEMPORARY = re.compile(r"\.spec\.yaml(\.\d+)?\.tmp|\.plan\.json\.\d+\.tmp")


class OutDirError(BbrlabError):
    """The directory cannot be used (or resumed) as this campaign's directory; the message says why."""


def read_json(path: Path) -> object:
    """The JSON at ``path``, parsed; raises :class:`OutDirError` (the campaign directory is damaged) when it
    cannot be read or is not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise OutDirError(f"{path} cannot be read as JSON ({e}): this campaign directory is damaged; move the "
                          "file away to start the campaign afresh in it, or use another --out") from None


def _read_yaml(path: Path) -> object:
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise OutDirError(f"{path} cannot be read ({e}): this campaign directory is damaged") from None


#: The spec's keys that do not make it another campaign: where it runs, and what its runs are judged against
#: (``expect``, :mod:`bbrlab.campaign.expect`).
NOT_IDENTITY = ("testbed", "expect")


def _identity(spec_dict: object) -> object:
    """What makes two specs the same campaign: everything but :data:`NOT_IDENTITY`."""
    return {k: v for k, v in spec_dict.items() if k not in NOT_IDENTITY} if isinstance(spec_dict, dict) else spec_dict


def _is_calibration(out: Path, entry: str) -> bool:
    """``bbrlab calibrate --out DIR`` before the campaign: ``calibration.json`` (schema
    ``bbrlab.calibration/...``) and ``calibration/``, whose folders are campaign directories of their own."""
    path = out / entry
    if path.is_symlink():
        return False
    if entry == CALIBRATION_FILE and path.is_file():
        data = read_json(path) if path.stat().st_size < 10_000_000 else None
        return isinstance(data, dict) and str(data.get("schema", "")).startswith("bbrlab.calibration/")
    if entry == CALIBRATION_DIR and path.is_dir():
        return all(d.is_dir() and not d.is_symlink() and (d / PLAN_FILE).is_file() for d in path.iterdir())
    return False


def _is_own_before_plan(out: Path, entry: str, spec_text: str) -> bool:
    path = out / entry
    if entry == LOCK_FILE or _OWN_TEMPORARY.fullmatch(entry):
        return path.is_file() and not path.is_symlink()
    if entry in (CALIBRATION_FILE, CALIBRATION_DIR):
        return _is_calibration(out, entry)
    if entry == SPEC_FILE and path.is_file() and not path.is_symlink():
        try:
            return path.read_text() == spec_text
        except (OSError, UnicodeDecodeError):
            return False
    return False


def _check_contents(out_dir: str | Path, spec_dict: dict, spec_text: str, plan: dict) -> bool:
    """Whether ``out_dir`` may hold this campaign: True to resume it, False to start it there.

    Reads only. Raises :class:`OutDirError` naming the reason otherwise.
    """
    out = Path(out_dir)
    if not out.exists():
        if out.is_symlink():
            raise OutDirError(f"--out {out} is a dangling symbolic link: use a directory")
        return False
    if not out.is_dir():
        raise OutDirError(f"--out {out} exists and is not a directory")
    plan_path = out / PLAN_FILE
    if plan_path.exists():
        existing = read_json(plan_path)
        if not isinstance(existing, dict) or existing.get("runs") != plan["runs"]:
            raise OutDirError(f"{out} holds a different campaign (its plan.json lists other runs than this spec "
                              "gives); use another --out directory")
        spec_path = out / SPEC_FILE
        if spec_path.exists() and _identity(_read_yaml(spec_path)) != _identity(spec_dict):
            raise OutDirError(f"{out} holds a different campaign (spec.yaml differs from this spec); "
                              "use another --out directory")
        return True
    foreign = [e for e in sorted(os.listdir(out)) if not _is_own_before_plan(out, e, spec_text)]
    if foreign:
        shown = ", ".join(foreign[:6]) + (f" and {len(foreign) - 6} more" if len(foreign) > 6 else "")
        raise OutDirError(f"--out {out} is not empty and holds no campaign (no {PLAN_FILE}; found {shown}): a "
                          "campaign writes spec.yaml, plan.json, runs/ and .tmp/ there and would overwrite what is "
                          "yours. Use a new or empty directory, or the --out of an earlier run of this spec")
    return False


def _record_of(run_dir: Path) -> dict | None:
    """The record.json of a run directory, or None when it is missing or unreadable."""
    try:
        data = json.loads((run_dir / rec.RECORD_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _set_aside(out: Path, path: Path, why: str, say: Callable[[str], None]) -> None:
    target = out / SET_ASIDE / path.parent.name / f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, target)
    say(f"{path.relative_to(out)} {why}: moved to {target.relative_to(out)}; the run will be measured again")


def _warn(text: str) -> None:
    print(f"bbrlab: {text}", file=sys.stderr, flush=True)


def repair(out_dir: str | Path, run_ids: list[str], say: Callable[[str], None] = _warn) -> None:
    """Make an existing campaign directory safe to resume (see the module docstring).

    Raises :class:`OutDirError` for what cannot be repaired without changing recorded data.
    """
    out = Path(out_dir)
    planned = set(run_ids)
    runs = out / rec.RUNS
    for d in sorted(runs.iterdir()) if runs.is_dir() else []:
        if d.name not in planned or not d.is_dir():
            continue
        r = _record_of(d)
        if r is None or r.get("run_id") != d.name or r.get("status") != "ok":
            _set_aside(out, d, "has no complete record.json of this run (a half-copied run?)", say)
    failed = out / rec.FAILED
    for d in sorted(failed.iterdir()) if failed.is_dir() else []:
        run_id, _, n = d.name.rpartition(".a")
        if run_id not in planned or not n.isdigit() or not d.is_dir():
            continue
        r = _record_of(d)
        if r is None or r.get("run_id") != run_id or r.get("attempt") != int(n):
            _set_aside(out, d, "has no complete record.json of that attempt", say)
    for run_id in run_ids:
        numbers = rec.failed_attempts(out, run_id)
        if numbers != list(range(1, len(numbers) + 1)) and not rec.is_complete(out, run_id):
            gap = next(i for i in range(1, len(numbers) + 2) if i not in numbers)
            first = next(n for n in numbers if n > gap)
            raise OutDirError(
                f"{out / rec.FAILED / f'{run_id}.a{first}'}: the failed attempts of {run_id} are numbered "
                f"{numbers}, without a{gap} (was it removed?), so the number of its next attempt is taken. Move "
                f"the attempts numbered above {gap - 1} out of the campaign directory (e.g. into {SET_ASIDE}/), "
                "then run the campaign again")


# ---------------------------------------------------------------------------------------------
# A spec's plan in its directory: writing it, reading it, counting its runs
# ---------------------------------------------------------------------------------------------

class Planned(Protocol):
    """What the campaign directory and the run loop need of a spec: a :class:`~bbrlab.campaign.spec.CampaignSpec`, or another
    plan of scenarios such as :class:`bbrlab.calibration.plan.CalibrationSpec` (whose points are not a full grid).
    ``to_dict()`` is written as ``spec.yaml`` and must hold ``max_attempts``."""

    name: str
    seed: int
    max_attempts: int

    def plan(self) -> list[Scenario]:
        """The scenarios to run, in the campaign's order."""

    def to_dict(self) -> dict:
        """The spec as written to ``spec.yaml`` (with ``max_attempts``)."""


@dataclass(frozen=True)
class PlannedRun:
    """One run of a plan: its id and its scenario."""

    run_id: str
    scenario: Scenario


@dataclass(frozen=True)
class Plan:
    """A campaign's ``plan.json``: its schema, campaign name, seed and every run in the order it is run."""

    campaign: str
    seed: int | None
    runs: tuple[PlannedRun, ...]
    schema: str = PLAN_SCHEMA

    @property
    def run_ids(self) -> list[str]:
        """The runs' ids in plan order."""
        return [r.run_id for r in self.runs]

    def to_dict(self) -> dict:
        """``plan.json``'s content (each run as ``run_id`` and its scenario's dict)."""
        return {"schema": self.schema, "campaign": self.campaign, "seed": self.seed,
                "runs": [{"run_id": r.run_id, "scenario": r.scenario.to_dict()} for r in self.runs]}

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        """A plan read from ``plan.json``'s content; raises :class:`~bbrlab.core.errors.BbrlabError` when it
        holds no list of runs."""
        runs = data.get("runs") if isinstance(data, dict) else None
        if not isinstance(runs, list):
            raise BbrlabError("not a campaign plan (no list of runs)")
        return cls(campaign=data.get("campaign"), seed=data.get("seed"), schema=data.get("schema", PLAN_SCHEMA),
                   runs=tuple(PlannedRun(r["run_id"], Scenario.from_dict(r["scenario"])) for r in runs))

    @classmethod
    def of(cls, spec: Planned) -> Plan:
        """``spec``'s plan."""
        return cls(campaign=spec.name, seed=spec.seed, runs=tuple(PlannedRun(s.run_id, s) for s in spec.plan()))


def plan_dict(spec: Planned) -> dict:
    """``spec``'s ``plan.json``: its schema, campaign name, seed and every run (``run_id`` and scenario dict)
    in plan order."""
    return Plan.of(spec).to_dict()


def spec_yaml(spec: Planned) -> str:
    """The ``spec.yaml`` a campaign directory keeps (the validated spec, every key explicit)."""
    import yaml

    return yaml.safe_dump(spec.to_dict(), sort_keys=False)


def check_out_dir(spec: Planned, out_dir: str | Path) -> bool:
    """Whether ``out_dir`` may hold ``spec``'s campaign: True to resume it, False for a new one.

    Reads only; raises :class:`~bbrlab.campaign.directory.OutDirError` saying why not (see
    :mod:`bbrlab.campaign.directory`)."""
    return _check_contents(out_dir, spec.to_dict(), spec_yaml(spec), plan_dict(spec))


def prepare(spec: Planned, out_dir: str | Path) -> Plan:
    """Create (or re-open and repair) the campaign directory; return the plan.

    A directory holding anything but this campaign is refused before anything is written (no silent
    mixing, nothing of the user's overwritten); on resume, inconsistent leftovers are repaired or
    explained (:func:`bbrlab.campaign.directory.repair`).
    """
    out = Path(out_dir)
    plan = Plan.of(spec)
    wanted = plan.to_dict()
    text = spec_yaml(spec)
    resuming = _check_contents(out, spec.to_dict(), text, wanted)
    out.mkdir(parents=True, exist_ok=True)
    if not resuming:
        rec.write_atomic(out / SPEC_FILE, text)
        rec.write_json_atomic(out / PLAN_FILE, wanted)
        return plan
    if not (out / SPEC_FILE).exists():
        rec.write_atomic(out / SPEC_FILE, text)
    else:
        _update_expectations(out / SPEC_FILE, spec.to_dict())
    repair(out, plan.run_ids)
    return plan


def _update_expectations(path: Path, spec_dict: dict) -> None:
    """On resume, ``spec.yaml`` takes the spec's ``expect:`` block when only that changed (the campaign is the
    same, :data:`NOT_IDENTITY`), so ``bbrlab check DIR`` judges the runs against the expectations last given."""
    import yaml

    kept = _read_yaml(path)
    if not isinstance(kept, dict) or kept.get("expect") == spec_dict.get("expect"):
        return
    kept = {k: v for k, v in kept.items() if k != "expect"}
    if spec_dict.get("expect"):
        kept["expect"] = spec_dict["expect"]
    rec.write_atomic(path, yaml.safe_dump(kept, sort_keys=False))


def load_plan(out_dir: str | Path) -> Plan:
    """The ``plan.json`` of campaign directory ``out_dir``; raises :class:`~bbrlab.core.errors.BbrlabError`
    when there is none or it holds no list of runs."""
    path = Path(out_dir) / PLAN_FILE
    if not path.is_file():
        raise BbrlabError(f"{out_dir} is not a campaign directory (no plan.json)")
    try:
        return Plan.from_dict(read_json(path))
    except (BbrlabError, KeyError, TypeError, ValueError) as e:
        raise BbrlabError(f"{path} is not a campaign plan ({e})") from None


def _spec_dict(out_dir: Path) -> dict:
    import yaml

    spec_path = out_dir / "spec.yaml"
    data = yaml.safe_load(spec_path.read_text()) if spec_path.exists() else {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class CampaignStatus:
    """How far a campaign directory is: ``planned`` runs, ``done`` (in ``runs/``), ``failed`` (attempts used up),
    ``failed_attempts`` (all of them, retried ones too), ``running`` (being written by a live process) and
    ``remaining`` (still to run). With adaptive repetitions, ``skipped`` counts the planned runs the stopping
    rule dropped (not remaining) and ``points`` the grid points by ``state: reason``
    (:mod:`bbrlab.campaign.repetitions`). ``bbrlab campaign status --json`` prints :meth:`to_dict`."""

    campaign: str
    planned: int
    done: int
    failed: int
    failed_attempts: int
    running: int
    remaining: int
    skipped: int = 0
    points: dict | None = None

    @property
    def complete(self) -> bool:
        """Every planned run is in ``runs/``: none failed for good, none left."""
        return self.failed == 0 and self.remaining == 0

    def to_dict(self) -> dict:
        """The counts as a JSON object (the keys are the field names; ``skipped`` and ``points`` only for a
        campaign with adaptive repetitions)."""
        d = asdict(self)
        if self.points is None:
            del d["skipped"], d["points"]
        return d


@dataclass(frozen=True)
class _Attempts:
    """Where each planned run stands: complete, its failed attempts' numbers, and those out of attempts."""

    complete: set[str]
    failed: dict[str, list[int]]
    used_up: set[str]


def _attempts(out: Path, run_ids: list[str], spec: dict) -> _Attempts:
    max_attempts = int(spec.get("max_attempts", 3))
    complete = {r for r in run_ids if rec.is_complete(out, r)}
    failed = {r: rec.failed_attempts(out, r) for r in run_ids}
    return _Attempts(complete, failed, {r for r in run_ids if r not in complete and len(failed[r]) >= max_attempts})


def given_up(out_dir: str | Path) -> dict[str, str]:
    """The runs whose attempts are used up, each with the reason its last attempt's record gives: what a
    campaign that ended incomplete says on its way out."""
    out = Path(out_dir)
    run_ids = load_plan(out).run_ids
    att = _attempts(out, run_ids, _spec_dict(out))
    reasons = {}
    for run_id in (r for r in run_ids if r in att.used_up):
        last = f"{run_id}.a{att.failed[run_id][-1]}"
        reasons[last] = str((_record_of(out / rec.FAILED / last) or {}).get("reason") or "no reason recorded")
    return reasons


def status(out_dir: str | Path) -> CampaignStatus:
    """The counts of the campaign directory ``out_dir`` (:class:`CampaignStatus`)."""
    out = Path(out_dir)
    plan = load_plan(out)
    spec = _spec_dict(out)
    run_ids = plan.run_ids
    att = _attempts(out, run_ids, spec)
    complete, attempts, given_up = att.complete, att.failed, att.used_up
    running = [r for r in rec.in_progress(out) if r in set(run_ids)]
    gate = make_gate(rule_of(spec), search_of(spec), [(r.run_id, r.scenario) for r in plan.runs], out,
                     settled=lambda r: r in complete or r in given_up)
    skipped = sum(1 for r in run_ids if r not in complete and r not in given_up and gate.is_skipped(r))
    points = gate.to_dict()["reasons"] if gate.rule is not None else None
    return CampaignStatus(campaign=plan.campaign, planned=len(run_ids), done=len(complete), failed=len(given_up),
                          failed_attempts=sum(len(a) for a in attempts.values()), running=len(running),
                          remaining=len(run_ids) - len(complete) - len(given_up) - skipped, skipped=skipped,
                          points=points)
