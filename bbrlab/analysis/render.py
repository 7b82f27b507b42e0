"""Execute the analysis notebooks with papermill into an output folder: what ``bbrlab figures`` and the
demo render.

Each notebook runs non-interactively (parameter ``interactive=False``) in a kernel reached over local
IPC sockets in Jupyter's private runtime folder rather than TCP, so nothing listens on the network and the
kernel has no transport warning to print; an idle kernel is shut down by message without a prior SIGINT
(which ipykernel reported as a KeyboardInterrupt). papermill and jupyter_client are imported when used.
After the notebooks, every figure they saved is checked for drawn points outside their panel's axes
(:func:`hidden_data`); a figure that hides data fails the rendering like a failed notebook.

May import: ``bbrlab.core``, ``bbrlab.analysis``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from bbrlab.core.errors import BbrlabError
from bbrlab.core.resources import notebooks_dir

from . import data, offaxis

#: A UNIX socket path must fit in 108 bytes; longer runtime folders fall back to a private temp folder.
MAX_IPC_PREFIX = 90


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
    """The notebooks of ``folder`` (``only``: these names, in this order); refused when one is missing."""
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
    if not data_dir.is_dir():
        raise BbrlabError(f"--data {data_dir}: no such directory (run a campaign first, e.g. `make demo`)")
    tables = data.load(data_dir)
    if tables.runs.empty:
        raise BbrlabError(f"--data {data_dir}: no runs found (expected campaign directories with runs/, or the "
                          "authors' logs/<timestamp>/meta.json layout); nothing to plot")
    c = tables.counts()
    print(f"data: {data_dir}: {c['runs']} runs ({c['ok']} ok), {c['intervals']} intervals, {c['ss']} ss samples")


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
                self._short_dir = tempfile.mkdtemp(prefix="bbrlab-kernel-")
                prefix = os.path.join(self._short_dir, "k")
            return prefix

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart=restart)
            short_dir = getattr(self, "_short_dir", None)
            if short_dir and not restart:  # the folder made for a short socket path goes with the kernel
                shutil.rmtree(short_dir, ignore_errors=True)

    return IpcKernelManager


def render(data_dir: Path, out_dir: Path, *, notebooks: Path | None = None, only: list[str] | None = None,
           kernel: str | None = None, params: dict | None = None, timeout_s: float = 1800) -> int:
    """Execute each notebook of ``notebooks`` (default: the installed ones) on ``data_dir`` into ``out_dir``
    (figures) and ``out_dir/notebooks`` (executed notebooks). Returns 0, or 1 when a notebook failed."""
    import papermill

    notebooks = notebooks_in(notebooks or notebooks_dir(), only)
    params = notebook_parameters(notebooks, params or {})
    data_dir, out_dir = Path(data_dir).resolve(), Path(out_dir).resolve()
    check_data(data_dir)
    kernel = pick_kernel(kernel)
    executed_dir = out_dir / "notebooks"
    executed_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    started = time.time() - 1.0  # figures older than this render (a previous one's) are not checked
    for i, nb in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {nb.stem} ...", end=" ", flush=True)
        t0 = time.monotonic()
        try:
            papermill.execute_notebook(str(nb), str(executed_dir / nb.name), kernel_name=kernel,
                                       parameters={**params[nb], "data_dir": str(data_dir), "out_dir": str(out_dir)},
                                       cwd=str(out_dir), progress_bar=False, execution_timeout=timeout_s,
                                       kernel_manager_class=ipc_kernel_manager())
        except papermill.PapermillExecutionError as e:
            failed.append(nb.stem)
            print(f"FAILED ({e.ename}: {e.evalue}); see {executed_dir / nb.name}")
            continue
        print(f"ok ({time.monotonic() - t0:.1f} s)")
    print(f"figures in {out_dir}, executed notebooks in {executed_dir}")
    hiding = hidden_data(out_dir, since=started)
    for name, hidden in hiding.items():
        print(f"ERROR hidden data: {offaxis.hidden_points_summary(name, hidden)}")
    if failed:
        print(f"failed notebooks: {', '.join(failed)}")
    return 1 if failed or hiding else 0


def hidden_data(out_dir: Path, since: float = 0.0) -> dict[str, list[dict]]:
    """Per figure of ``out_dir`` (its ``<name>.points.json`` written at or after ``since``, a time.time()),
    the drawn points outside their panel's axes (:func:`bbrlab.analysis.offaxis.points_outside_axes`);
    figures that show all their data are left out."""
    found = {}
    for path in sorted(Path(out_dir).glob("*.points.json")):
        if path.stat().st_mtime < since:
            continue
        hidden = offaxis.points_outside_axes(json.loads(path.read_text()))
        if hidden:
            found[path.name.removesuffix(".points.json")] = hidden
    return found
