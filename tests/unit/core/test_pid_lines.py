"""The one form a pid is kept in (``<pid> <start ticks>``): written and read by the shell helpers of
:mod:`bbrlab.core.ownedpids` and by :func:`~bbrlab.core.ownedpids.parse_pid_line`, for real processes of this
machine (a spawn's answer, the sampler's pid file, the trace reader's pid file)."""

from __future__ import annotations

import subprocess

import pytest

from bbrlab.core import owners
from bbrlab.core.hosts import LocalHost
from bbrlab.core.ownedpids import KILL_OURS_SH, Spawned, parse_pid_line
from bbrlab.sampling import vcputrace


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def test_pid_line_and_read_pid_line_carry_pid_and_start_ticks(tmp_path):
    proc = _sleeper()
    try:
        path = tmp_path / "pid"
        script = KILL_OURS_SH + 'pid_line "$1" > "$2"; read_pid_line "$2"; echo "$pid|$ticks"'
        out = subprocess.run(["sh", "-c", script, "sh", str(proc.pid), str(path)], capture_output=True, text=True,
                             check=True).stdout.strip()
        ticks = owners.start_ticks(proc.pid)
        assert out == f"{proc.pid}|{ticks}"
        assert parse_pid_line(path.read_text()) == Spawned(proc.pid, ticks)
    finally:
        proc.kill()
        proc.wait()


def test_read_pid_line_of_a_missing_file_leaves_both_empty(tmp_path):
    script = KILL_OURS_SH + 'pid=1; ticks=2; read_pid_line "$1"; echo "[$pid|$ticks]"'
    out = subprocess.run(["sh", "-c", script, "sh", str(tmp_path / "none")], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[|]"


@pytest.mark.parametrize("text, expected", [("123 456\n", Spawned(123, 456)), ("123 \n", Spawned(123, None)),
                                            ("123", Spawned(123, None))])
def test_parse_pid_line(text, expected):
    assert parse_pid_line(text) == expected


@pytest.mark.parametrize("text", ["", "x 1", "0 5", "-3 5"])
def test_a_line_without_a_pid_is_refused_naming_where(text):
    with pytest.raises(ValueError, match="the reader's pid file"):
        parse_pid_line(text, "the reader's pid file")


def test_a_spawn_answers_its_pid_and_start_ticks(tmp_path):
    spawned = LocalHost().spawn_process(["sleep", "60"], str(tmp_path / "log"))
    try:
        assert spawned.start_ticks is not None and spawned.start_ticks == owners.start_ticks(spawned.pid)
    finally:
        subprocess.run(["kill", "-KILL", str(spawned.pid)], check=False)


def test_the_trace_reader_stop_signals_only_the_process_its_pid_file_names(tmp_path):
    """The reader's stop sends SIGTERM to the pid in the file only while that pid still names the process that
    started at the file's ticks (a reader that ended may have handed its pid to another process)."""
    path = tmp_path / "reader.pid"
    stranger, reader = _sleeper(), _sleeper()
    try:
        path.write_text(f"{stranger.pid} {owners.start_ticks(stranger.pid) + 1}\n")  # its pid, another start
        subprocess.run(["sh", "-c", vcputrace._STOP_READER, "sh", str(path)], check=True)
        assert stranger.poll() is None
        path.write_text(f"{reader.pid} {owners.start_ticks(reader.pid)}\n")
        subprocess.run(["sh", "-c", vcputrace._STOP_READER, "sh", str(path)], check=True)
        assert reader.wait(timeout=10) == -15
    finally:
        for p in (stranger, reader):
            p.kill()
            p.wait()
