"""bbrlab as a user gets it: the wheel, installed into a new virtual environment outside the checkout.

The wheel is built from a clean copy of the sources (what git tracks, plus new files not ignored: a fresh
clone, no stale build/ folder) with the dev environment's setuptools, without network. The new venv
borrows the dev environment's third-party packages through a .pth file (installing them again would only
test PyPI); bbrlab itself comes from the wheel alone, which the test checks. Then, from a directory
outside the checkout, ``bbrlab figures`` renders every notebook on the repository's data/ and
``bbrlab campaign plan`` finds a shipped spec.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).parents[2]
DATA_FOLDERS = ("notebooks", "kernels", "specs")


def run(argv, **kw):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{argv}: {proc.stdout}{proc.stderr}"
    return proc


def source_files() -> list[str]:
    listed = run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"]).stdout.splitlines()
    return [p for p in listed if not p.startswith(("data/", "tests/")) and (ROOT / p).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for rel in source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(dist), str(src)])
    (found,) = dist.glob("bbrlab-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    (Path(site) / "dev-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", str(wheel)])
    return env_dir


def isolated_env(tmp: Path) -> dict:
    """No user or project Jupyter folders: the kernel is the new venv's own ``python3``."""
    return {**os.environ, "JUPYTER_DATA_DIR": str(tmp / "jupyter-data"), "JUPYTER_PATH": str(tmp / "jupyter-path"),
            "JUPYTER_CONFIG_DIR": str(tmp / "jupyter-config"), "PYTHONNOUSERSITE": "1"}


def test_the_wheel_carries_every_notebook_spec_and_kernel_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = [p for p in source_files() if p.startswith(tuple(f"{f}/" for f in DATA_FOLDERS))]
    assert tracked and all(f"bbrlab/{p}" in names for p in tracked), sorted(
        p for p in tracked if f"bbrlab/{p}" not in names)
    assert "bbrlab/testbed/local/guest/bbrlab-init" in names
    assert not [n for n in names if "/build/" in n or n.endswith((".pyc", ".ko"))]


def test_installed_bbrlab_carries_every_notebook_and_renders_from_another_directory(venv, tmp_path):
    env = isolated_env(tmp_path)
    python, bbrlab = venv / "bin" / "python", venv / "bin" / "bbrlab"
    where = run([str(python), "-c", "import bbrlab, bbrlab.core.resources as r; print(bbrlab.__file__); "
                 "print(r.notebooks_dir()); from jupyter_client.kernelspec import KernelSpecManager as K; "
                 "print(K().get_kernel_spec('python3').argv[0])"], cwd=tmp_path, env=env).stdout.split()
    assert all(p.startswith(str(venv)) for p in where[:2]), where  # bbrlab from the wheel, not the checkout
    assert Path(where[2]).parent == python.parent, where  # the kernel runs the new venv's interpreter
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.stem for p in Path(where[1]).glob("*.ipynb")) == notebooks  # the wheel carries every notebook
    # One of them rendered by the installed bbrlab (test_figures.py renders every notebook on data/).
    out = tmp_path / "figures"
    proc = run([str(bbrlab), "figures", "--data", str(ROOT / "data"), "--out", str(out), "--kernel", "python3",
                "--only", "patched_vs_original"], cwd=tmp_path, env=env)
    assert "patched_vs_original ... ok" in proc.stdout, proc.stdout
    assert "[IPKernelApp]" not in proc.stdout + proc.stderr, proc.stderr  # batch runs speak only when it matters
    panels = json.loads((out / "fig10_15_patched_vs_original.points.json").read_text())
    labels = {line["label"] for p in panels for line in p["lines"]}
    # data/ holds 8 s runs over three bottleneck queues (data/buffer-queue-local) and the demo's 10 s runs with
    # 1 BDP: a line per variant and condition (runkey), never one line over several queues or durations;
    # data/demo carries its calibration, hence the ceiling.
    variants, queues = ("BBRv1", "BBRv1 patched"), ("1 BDP", "8 BDP", "authors' queue")
    assert labels == ({f"{v} [{q}, 8 s]" for v in variants for q in queues} | {f"{v} [1 BDP, 10 s]" for v in variants}
                      | {"CPU ceiling"})
    plan = run([str(bbrlab), "campaign", "plan", "demo"], cwd=tmp_path, env=env)
    assert plan.stdout.startswith("demo: ")
