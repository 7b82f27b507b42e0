"""The ``bbrlab`` command whose reader closes stdout early (``bbrlab campaign schema | head -1``) exits quietly:
no traceback on stderr, status 0 or 141 (128 + SIGPIPE) as other tools."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bbrlab.cli import main as cli

COMMAND = [sys.executable, "-m", "bbrlab.cli.main"]


def test_piped_through_head_it_prints_the_first_line_and_no_traceback(tmp_path):
    shell = f"set -o pipefail; {' '.join(COMMAND)} campaign schema 2>stderr.txt | head -1"
    done = subprocess.run(["bash", "-c", shell], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout == "{\n"
    assert done.returncode in (0, cli.BROKEN_PIPE_STATUS)
    assert (tmp_path / "stderr.txt").read_text() == ""


@pytest.mark.parametrize("args", [["campaign", "schema"], ["--help"]])
def test_a_stdout_closed_before_the_first_line_ends_it_quietly(args):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is printed: every write meets a closed pipe
    try:
        done = subprocess.run([*COMMAND, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode in (0, cli.BROKEN_PIPE_STATUS)


def test_another_broken_pipe_is_not_hidden(monkeypatch):
    def broken(_args):
        raise BrokenPipeError(32, "a subprocess's pipe")

    monkeypatch.setattr(cli, "_run", broken)
    with pytest.raises(BrokenPipeError):
        cli.main(["campaign", "schema"])  # stdout (pytest's capture) is fine: the error is someone else's

