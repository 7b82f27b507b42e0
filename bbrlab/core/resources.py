"""Files that travel with the package: notebooks, campaign specs, kernel patches and recipes.

In the repository they are the top-level folders ``notebooks/``, ``specs/`` and ``kernels/``; setup.py
installs them as the data packages ``bbrlab.notebooks``, ``bbrlab.specs`` and ``bbrlab.kernels``, so
the same :mod:`importlib.resources` lookup finds them in a checkout (editable install) and in an
installed wheel, whatever the current directory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import BbrlabError


def folder(name: str) -> Path:
    """The installed folder of ``bbrlab.<name>`` as a filesystem path.

    Parameters
    ----------
    name : str
        ``"notebooks"``, ``"specs"`` or ``"kernels"``.

    Returns
    -------
    pathlib.Path
        e.g. ``<checkout>/notebooks`` or ``<site-packages>/bbrlab/notebooks``.
    """
    found = resources.files(f"bbrlab.{name}")
    path = Path(str(found))
    if not path.is_dir():  # e.g. a zipped install: papermill and the kernel build need real files
        raise BbrlabError(f"bbrlab.{name} is not a folder on disk ({found}); install bbrlab unzipped")
    return path


def notebooks_dir() -> Path:
    """The analysis notebooks (``*.ipynb``) that ``bbrlab figures`` executes."""
    return folder("notebooks")


def specs_dir() -> Path:
    """The campaign specs (``*.yaml``) shipped with bbrlab (``demo.yaml``, ``fig4-100mbit.yaml`` ...)."""
    return folder("specs")


def kernels_dir() -> Path:
    """Kernel patches, the out-of-tree build template and the BBRv3 kernel recipe."""
    return folder("kernels")


def spec_path(spec: str | Path) -> Path:
    """A campaign spec given as a path, or by the name of a shipped spec (``demo``, ``demo.yaml``).

    Examples
    --------
    >>> spec_path("demo").name
    'demo.yaml'
    """
    path = Path(spec)
    if path.is_file():
        return path
    name = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    shipped = specs_dir() / name
    if path.parent in (Path("."), Path("specs")) and shipped.is_file():
        return shipped
    available = ", ".join(sorted(p.stem for p in specs_dir().glob("*.yaml")))
    raise BbrlabError(f"spec {spec}: no such file, and bbrlab ships no spec of that name (shipped: {available})")
