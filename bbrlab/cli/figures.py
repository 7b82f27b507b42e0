"""``bbrlab figures``: execute every analysis notebook with papermill into an output directory.

The notebooks are the ones installed with bbrlab (``bbrlab.core.resources.notebooks_dir()``) unless
``--notebooks`` names another folder; the rendering itself is :mod:`bbrlab.analysis.render`'s.
"""

from __future__ import annotations

from pathlib import Path

from bbrlab.analysis.render import render
from bbrlab.core.errors import BbrlabError


def register(sub) -> None:
    """Add ``bbrlab figures`` to the subparsers ``sub``."""
    p = sub.add_parser("figures", help="render every notebook (papermill) into figures + executed notebooks",
                       description="Ingests DATA, then executes each notebook in the notebooks folder with "
                                   "papermill (parameters data_dir and out_dir) and writes the executed notebooks "
                                   "to OUT/notebooks/ and the figures (PDF, PNG, points.json) to OUT/.")
    p.add_argument("--data", type=Path, default=Path("data"), help="data directory (default: data/)")
    p.add_argument("--out", type=Path, default=Path("build/figures"), help="output directory (default: build/figures)")
    p.add_argument("--notebooks", type=Path, default=None,
                   help="folder of .ipynb files (default: the notebooks installed with bbrlab)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these notebooks (names without .ipynb)")
    p.add_argument("--kernel", default=None, help="Jupyter kernel (default: bbrlab if registered, else python3)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=YAML",
                   help="extra notebook parameter, value in YAML, e.g. -p 'filters={cca: [bbr, cubic]}' or "
                        "-p rate_mbit=50 (repeatable; a notebook without that parameter ignores it)")
    p.add_argument("--timeout", type=float, default=1800, help="per-cell timeout in seconds (default 1800)")
    p.set_defaults(func=run)


def parse_params(items: list[str]) -> dict:
    """``NAME=YAML`` pairs -> parameters; the names data_dir and out_dir belong to --data and --out."""
    import yaml

    params = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise BbrlabError(f"--param {item!r}: expected NAME=VALUE with NAME a Python identifier")
        if name in ("data_dir", "out_dir"):
            raise BbrlabError(f"--param {name}: use --data / --out for it")
        try:
            params[name] = yaml.safe_load(text)
        except (yaml.YAMLError, ValueError) as e:  # ValueError: a whole number beyond Python's 4300 digits
            raise BbrlabError(f"--param {name}: not valid YAML ({e})") from None
    return params


def run(args) -> int:
    """``bbrlab figures``: execute the notebooks on ``--data`` into ``--out``
    (:func:`bbrlab.analysis.render.render`); returns 0, or 1 when a notebook failed. A malformed
    ``--param`` raises :class:`~bbrlab.core.errors.BbrlabError`."""
    return render(args.data, args.out, notebooks=args.notebooks, only=args.only, kernel=args.kernel,
                  params=parse_params(args.param), timeout_s=args.timeout)
