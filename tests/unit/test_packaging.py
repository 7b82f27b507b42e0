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


def _notebooks():
    import json

    return {nb.stem: json.loads(nb.read_text()) for nb in sorted((ROOT / "notebooks").glob("*.ipynb"))}


def test_notebooks_are_the_source_run_by_the_bbrlab_kernel_with_a_parameters_cell():
    notebooks = _notebooks()
    assert set(notebooks) == {"buffer_queue", "contention_models", "fairness", "fidelity", "link_utilisation",
                              "loss_sweep", "patched_vs_original", "socket_state", "throughput_vs_share", "timeline",
                              "timeseries"}
    assert not list((ROOT / "notebooks").glob("_generate*")), "nothing generates the notebooks"
    for name, nb in notebooks.items():
        assert nb["metadata"]["kernelspec"]["name"] == "bbrlab", name
        tagged = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
        assert len(tagged) == 1, name
        names = [line.split("=")[0].strip() for line in "".join(tagged[0]["source"]).splitlines() if "=" in line]
        assert {"data_dir", "out_dir", "filters", "include_sampled"} <= set(names), name
        assert len(names) == len(set(names)), f"{name}: a parameter assigned twice"
        assert ("interactive" in names) == (name in ("socket_state", "timeline", "timeseries")), name


def test_notebook_cells_use_the_one_selection_rule():
    for name, nb in _notebooks().items():
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        assert "data.load(data_dir)" in code, name
        for gone in ("apply_filters", "unsampled", "missing_dimensions", "read_campaign", "ingest("):
            assert gone not in code, f"{name} calls {gone}"
