"""``bbrlab figures``: execute every analysis notebook with papermill into an output directory."""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import BbrlabError

DEFAULT_NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def register(sub) -> None:
    p = sub.add_parser("figures", help="render every notebook (papermill) into figures + executed notebooks",
                       description="Ingests DATA, then executes each notebook in the notebooks folder with "
                                   "papermill (parameters data_dir and out_dir) and writes the executed notebooks "
                                   "to OUT/notebooks/ and the figures (PDF, PNG, points.json) to OUT/.")
    p.add_argument("--data", type=Path, default=Path("data"), help="data directory (default: data/)")
    p.add_argument("--out", type=Path, default=Path("build/figures"), help="output directory (default: build/figures)")
    p.add_argument("--notebooks", type=Path, default=DEFAULT_NOTEBOOKS, help="folder of .ipynb files")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these notebooks (names without .ipynb)")
    p.add_argument("--kernel", default=None, help="Jupyter kernel (default: bbrlab if registered, else python3)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=YAML",
                   help="extra notebook parameter, value in YAML, e.g. -p 'filters={cca: [bbr, cubic]}' or "
                        "-p rate_mbit=50 (repeatable; a notebook without that parameter ignores it)")
    p.add_argument("--timeout", type=float, default=1800, help="per-cell timeout in seconds (default 1800)")
    p.set_defaults(func=run)


def pick_kernel(requested: str | None) -> str:
    """The registered ``bbrlab`` kernel (make setup) or this interpreter's ``python3``."""
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    if requested:
        if requested not in specs:
            raise BbrlabError(f"--kernel {requested!r} is not installed; installed: {', '.join(sorted(specs))}")
        return requested
    return "bbrlab" if "bbrlab" in specs else "python3"


def notebooks_in(folder: Path, only: list[str] | None) -> list[Path]:
    found = sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith((".", "_")))
    if only:
        names = {p.stem: p for p in found}
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise BbrlabError(f"--only: no notebook {', '.join(unknown)}; available: {', '.join(sorted(names))}")
        found = [names[n] for n in only]
    if not found:
        raise BbrlabError(f"{folder}: no notebooks (*.ipynb)")
    return found


def check_data(data_dir: Path) -> None:
    """Fail early, with a clear message, when the data directory holds no runs; ingest it once."""
    from .. import data

    if not data_dir.is_dir():
        raise BbrlabError(f"--data {data_dir}: no such directory (run a campaign first, e.g. `make demo`)")
    tables = data.load(data_dir)
    if tables.runs.empty:
        raise BbrlabError(f"--data {data_dir}: no runs found (expected campaign directories with runs/, or the "
                          "authors' logs/<timestamp>/meta.json layout); nothing to plot")
    c = tables.counts()
    print(f"data: {data_dir}: {c['runs']} runs ({c['ok']} ok), {c['intervals']} intervals, {c['ss']} ss samples")


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
        except yaml.YAMLError as e:
            raise BbrlabError(f"--param {name}: not valid YAML ({e})") from e
    return params


def run(args) -> int:
    import papermill

    extra = parse_params(args.param)
    notebooks = notebooks_in(args.notebooks, args.only)
    data_dir, out_dir = args.data.resolve(), args.out.resolve()
    check_data(data_dir)
    kernel = pick_kernel(args.kernel)
    executed_dir = out_dir / "notebooks"
    executed_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    for i, nb in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {nb.stem} ...", end=" ", flush=True)
        t0 = time.monotonic()
        try:
            papermill.execute_notebook(str(nb), str(executed_dir / nb.name), kernel_name=kernel,
                                       parameters={**extra, "data_dir": str(data_dir), "out_dir": str(out_dir)},
                                       cwd=str(nb.parent), progress_bar=False, execution_timeout=args.timeout)
        except papermill.PapermillExecutionError as e:
            failed.append(nb.stem)
            print(f"FAILED ({e.ename}: {e.evalue}); see {executed_dir / nb.name}")
            continue
        print(f"ok ({time.monotonic() - t0:.1f} s)")
    print(f"figures in {out_dir}, executed notebooks in {executed_dir}")
    if failed:
        print(f"failed notebooks: {', '.join(failed)}")
        return 1
    return 0
