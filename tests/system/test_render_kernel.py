"""The IPC kernel that renders the notebooks, started for real: its socket files live in a 0700 folder, and the
short folder it makes when the runtime folder's path is too long for a UNIX socket goes with the kernel."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from pathlib import Path

import pytest

from bbrlab.analysis.render import MAX_IPC_PREFIX, ipc_kernel_manager, pick_kernel

pytestmark = pytest.mark.system


def _short_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("bbrlab-kernel-*"))


async def _start_and_shut_down(manager) -> str:
    await manager.start_kernel()
    try:
        client = manager.client()
        client.start_channels()
        await client.wait_for_ready(timeout=120)
        client.stop_channels()
        return manager.ip
    finally:
        await manager.shutdown_kernel(now=False)


def test_a_long_runtime_folder_gets_a_short_socket_folder_that_goes_with_the_kernel(tmp_path, monkeypatch):
    runtime = tmp_path / ("r" * max(1, MAX_IPC_PREFIX - len(str(tmp_path))))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    before = _short_dirs()
    manager = ipc_kernel_manager()(kernel_name=pick_kernel(None))
    prefix = asyncio.run(_start_and_shut_down(manager))
    folder = Path(prefix).parent
    assert folder.name.startswith("bbrlab-kernel-") and folder.parent == Path(tempfile.gettempdir()), prefix
    assert not folder.exists(), sorted(os.listdir(folder))  # removed at the kernel's shutdown
    assert _short_dirs() <= before


def test_a_short_runtime_folder_is_used_as_it_is_and_kept_private(monkeypatch):
    with tempfile.TemporaryDirectory(prefix="rt") as short:  # pytest's tmp_path is too long for a socket
        runtime = Path(short) / "rt"
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
        before = _short_dirs()
        manager = ipc_kernel_manager()(kernel_name=pick_kernel(None))
        prefix = asyncio.run(_start_and_shut_down(manager))
        assert Path(prefix).parent == runtime and _short_dirs() <= before
        assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
