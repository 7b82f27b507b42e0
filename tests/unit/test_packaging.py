"""The pip and conda dependency lists name the same packages."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_names = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            conda_names |= {_name(r) for r in dep.get("pip", [])}
        elif not dep.startswith(("python", "pip")) or dep.startswith("python-"):
            conda_names.add(_name(dep))
    assert pip_names == conda_names, f"only in pyproject: {pip_names - conda_names}; only in environment.yml: {conda_names - pip_names}"


def test_notebooks_committed_without_outputs():
    import json

    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        for cell in cells:
            assert not cell.get("outputs"), f"{nb.name} has outputs committed"
            assert cell.get("execution_count") is None, f"{nb.name} has execution counts committed"
