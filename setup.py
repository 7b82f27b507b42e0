"""Which folders travel inside the wheel (the project's metadata is in pyproject.toml).

``notebooks/``, ``kernels/`` and ``specs/`` stay at the top of the repository, where people look for
them, and are installed as the data-only packages ``bbrlab.notebooks``, ``bbrlab.kernels`` and
``bbrlab.specs`` (``bbrlab.core.resources`` finds them with ``importlib.resources``). Every file under them
travels, except build outputs, caches and dotfiles, so a new notebook, spec or kernel recipe needs no
change here.
"""

from __future__ import annotations

import os

from setuptools import find_namespace_packages, setup

DATA_FOLDERS = ("notebooks", "kernels", "specs")
SKIP_DIRS = {"build", "__pycache__", ".ipynb_checkpoints", "tables"}
SKIP_SUFFIXES = (".py", ".pyc", ".o", ".ko", ".cmd", ".mod", ".tmp")


def data_files_of(folder: str) -> list[str]:
    """Every file under ``folder`` (relative to it) that is source, not a build output."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        rel = os.path.relpath(root, folder)
        out += [os.path.normpath(os.path.join(rel, f)) for f in sorted(files)
                if not f.startswith(".") and not f.endswith(SKIP_SUFFIXES)]
    return out


def data_packages() -> tuple[list[str], dict[str, str], dict[str, list[str]]]:
    packages, package_dir, package_data = [], {}, {}
    for folder in DATA_FOLDERS:
        name = f"bbrlab.{folder}"
        package_dir[name] = folder
        subpackages = [f"{name}.{p}" for p in find_namespace_packages(where=folder, exclude=[f"{s}*" for s in SKIP_DIRS])]
        packages += [name, *subpackages]
        package_data[name] = data_files_of(folder)
    return packages, package_dir, package_data


packages, package_dir, package_data = data_packages()
setup(
    packages=find_namespace_packages(include=["bbrlab", "bbrlab.*"], exclude=["*__pycache__*"]) + packages,
    package_dir=package_dir,
    package_data={"bbrlab": ["testbed/local/guest/*", "kernel/guest/*", "**/*.c", "**/*.h"], **package_data},
)
