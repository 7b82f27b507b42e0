"""``bbrlab figures``: execute every analysis notebook with papermill into an output directory.

The notebooks are the ones installed with bbrlab (``bbrlab.core.resources.notebooks_dir()``) unless
``--notebooks`` names another folder. Each runs non-interactively (parameter ``interactive=False``) in a
kernel reached over local IPC sockets in Jupyter's private runtime folder rather than TCP, so nothing
listens on the network and the kernel has no transport warning to print; an idle kernel is shut down by
message without a prior SIGINT (which ipykernel reported as a KeyboardInterrupt).
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

from bbrlab.core.errors import BbrlabError

#: A UNIX socket path must fit in 108 bytes; longer runtime folders fall back to a private temp folder.
MAX_IPC_PREFIX = 90


def register(sub) -> None:
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
    from bbrlab.analysis import data

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


def notebook_parameters(notebooks: list[Path], extra: dict) -> dict[Path, dict]:
    """Per notebook, the parameters it declares out of ``interactive=False`` and ``extra``; a name in
    ``extra`` that no notebook declares is an error (a typo would otherwise change nothing)."""
    import papermill

    declared = {nb: set(papermill.inspect_notebook(str(nb))) for nb in notebooks}
    known = set().union(*declared.values())
    unknown = sorted(set(extra) - known)
    if unknown:
        raise BbrlabError(f"--param {', '.join(unknown)}: no notebook has such a parameter; they have: "
                          f"{', '.join(sorted(known - {'data_dir', 'out_dir'}))}")
    wanted = {"interactive": False, **extra}
    return {nb: {k: v for k, v in wanted.items() if k in names} for nb, names in declared.items()}


def ipc_kernel_manager():
    """A Jupyter kernel manager whose kernels listen on IPC sockets (files in a 0700 folder), not TCP."""
    from jupyter_client import AsyncKernelManager
    from jupyter_core.paths import jupyter_runtime_dir
    from traitlets import default

    class IpcKernelManager(AsyncKernelManager):
        """IPC transport; and no SIGINT before the shutdown request of an idle kernel (papermill shuts
        kernels down only after the last cell; the signal made ipykernel log a KeyboardInterrupt)."""

        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

        @default("transport")
        def _transport_default(self) -> str:
            return "ipc"

        @default("ip")
        def _ip_default(self) -> str:
            folder = jupyter_runtime_dir()
            os.makedirs(folder, mode=0o700, exist_ok=True)
            prefix = os.path.join(folder, f"bbrlab-kernel-{uuid.uuid4().hex[:12]}")
            if len(prefix) > MAX_IPC_PREFIX:
                prefix = os.path.join(tempfile.mkdtemp(prefix="bbrlab-kernel-"), "k")
            return prefix

    return IpcKernelManager


def run(args) -> int:
    import papermill

    from bbrlab.core.resources import notebooks_dir

    notebooks = notebooks_in(args.notebooks or notebooks_dir(), args.only)
    params = notebook_parameters(notebooks, parse_params(args.param))
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
                                       parameters={**params[nb], "data_dir": str(data_dir), "out_dir": str(out_dir)},
                                       cwd=str(out_dir), progress_bar=False, execution_timeout=args.timeout,
                                       kernel_manager_class=ipc_kernel_manager())
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
