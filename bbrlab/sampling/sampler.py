"""Sampling TCP socket state during a run: the sampler's life in a run and the ``ss -tin`` loop.

:func:`sampler` runs any of the three samplers for the length of a ``with`` block: ``bpf`` and ``netlink``
(:mod:`bbrlab.sampling.sockdiag`, the cheap ones; docs/sampling.md) or the ``ss`` loop described here, which forks
``ss`` for every sample and stays for cross-checks. All three fill the same table (the rows of
:func:`parse_ss_log`, with the units and the inflight and BDP definitions below).

The sampler runs INSIDE the sender (the contended VM): a small bash loop that, every
``interval_ms``, writes ``# t=<unix seconds>`` and then what ``ss -tinH state established FILTER``
prints for the flow's data connections. It costs CPU on the very machine whose CPU is scarce, which
is why the paper samples in separate runs; the loop is built to cost as little as possible:

- one fork per sample (``ss`` itself): time comes from bash's ``$EPOCHREALTIME``, and the pause is
  ``read -t`` on a pipe nobody writes to, not a ``sleep`` process;
- it keeps a fixed schedule (``t0 + k * interval``) and skips ticks it missed instead of drifting (the
  schedule and the stop are :mod:`bbrlab.core.hostloop`'s, shared with the rsync progress poller);
- it stops when a stop file appears (so the last sample is never cut in half) or after a deadline
  (so a lost connection cannot leave it running);
- at exit it writes ``# end samples=N ticks=utime,stime,cutime,cstime hz=H``: its own CPU cost,
  read from ``/proc/self/stat``, which the benchmarks and the run record report.

The log is parsed by :mod:`bbrlab.sampling.ss`; inflight and BDP are defined in
:mod:`bbrlab.sampling.inflight`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hostloop import RUNNING_SH, SCHEDULE_BASH
from bbrlab.core.hosts import Host
from bbrlab.core.ownedpids import KILL_OURS_SH
from bbrlab.scenario.sampling_limits import SAMPLE_LOG_MAX_BYTES

from . import sockdiag

#: iperf3's default server port: the data and control connections go there.
IPERF_PORT = 5201


# ---------------------------------------------------------------------------------------------
# The sampler (runs on the sender)
# ---------------------------------------------------------------------------------------------

#: bash program of the sampler. Arguments: interval_us, stop_after_s, stop_file, then ss's filter words.
SAMPLER_BASH = r"""
set -u
interval_us=$1; stop_after_s=$2; stop_file=$3; shift 3
filter=("$@"); samples=0
""" + SCHEDULE_BASH + r"""
sample() {
    local t=$EPOCHREALTIME
    printf '# t=%s\n' "${t/,/.}"
    ss -tinH state established "${filter[@]}"
    samples=$(( samples + 1 ))
}
on_schedule sample
read -r -a stat < /proc/$$/stat
printf '# end samples=%d ticks=%s,%s,%s,%s hz=%s\n' "$samples" "${stat[13]}" "${stat[14]}" "${stat[15]}" \
    "${stat[16]}" "$(getconf CLK_TCK)"
"""


def _check_port(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValidationError(field, value, "a TCP port number from 1 to 65535")
    return value


def ss_filter(data_ports: Sequence[int] | None = None, server_port: int = IPERF_PORT) -> list[str]:
    """ss filter words selecting the flow's connections.

    With ``data_ports`` (the iperf3 client's local ports, known in advance when the client binds them
    with ``--cport``) only the data streams match; without, every connection to ``server_port`` does,
    including iperf3's control connection, which the parser can drop by port afterwards.
    """
    _check_port(server_port, "server_port")
    words = ["(", "dport", "=", f":{server_port}"]
    if data_ports:
        ports = [_check_port(p, f"data_ports[{i}]") for i, p in enumerate(data_ports)]
        words += ["and", "("]
        for i, port in enumerate(sorted(ports)):
            words += (["or"] if i else []) + ["sport", "=", f":{port}"]
        words.append(")")
    words.append(")")
    return words


def sampler_argv(interval_ms: float, stop_after_s: float, stop_file: str,
                 data_ports: Sequence[int] | None = None, server_port: int = IPERF_PORT) -> list[str]:
    """The command that runs the sampler on the sender (an argument list: nothing is shell-joined)."""
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int | float) or not 1 <= interval_ms <= 10_000:
        raise ValidationError("sample_ms", interval_ms, "1 <= sample_ms <= 10000 ms")
    if not 1 <= stop_after_s <= 86_400:
        raise ValidationError("stop_after_s", stop_after_s, "1 <= stop_after_s <= 86400 s")
    if not stop_file.startswith("/") or "\n" in stop_file:
        raise ValidationError("stop_file", stop_file, "an absolute path without newlines")
    return ["bash", "-c", SAMPLER_BASH, "bbrlab-ss-sampler", str(int(round(interval_ms * 1000))),
            str(int(stop_after_s)), stop_file, *ss_filter(data_ports, server_port)]


class SamplerError(BbrlabError):
    """The sampler could not be started, stopped, or its samples could not be fetched."""


@dataclass
class Sampler:
    """A sampler running on ``host`` for one run, its log streamed into ``log_file`` on this machine.

    ``text`` is the log (footer included) once the ``with`` block of :func:`sampler` has ended normally and
    the stream is complete (None before, and after a failed block); ``binary`` names the program that ran
    (netlink and bpf: path, sha256, source_sha256, whether this run copied it). ``exit_code`` is how the
    sampler's command ended (:data:`bbrlab.core.commands.CAPPED_EXIT` when its log reached
    :data:`~bbrlab.scenario.sampling_limits.SAMPLE_LOG_MAX_BYTES` and was cut: then ``capped``)."""

    kind: str
    host: Host
    directory: str
    interval_ms: float
    log_file: Path
    binary: sockdiag.Deployed | None = None
    complete: bool = False
    exit_code: int | None = None
    capped: bool = False

    @property
    def text(self) -> str | None:
        """The sampler's log, once complete (None before)."""
        return self.log_file.read_text(errors="replace") if self.complete else None

    @property
    def pid_path(self) -> str:
        """Where on the host the sampler's pid is written."""
        return f"{self.directory}/pid"

    @property
    def stop_path(self) -> str:
        """The file whose creation asks the sampler to stop."""
        return f"{self.directory}/stop"


#: The sampler as the stream runs it: $1 the pid file (read by :data:`_STOP`); the rest the sampler's argv.
#: The shell is the session leader (sshd, resp. :meth:`LocalHost.stream`, made it one) and becomes the
#: sampler, whose stdout and stderr are the stream: nothing of the log is kept on the host.
#: The pid file holds ``<pid> <start ticks>``: the stop kills only that process (:mod:`bbrlab.core.ownedpids`).
_PID_LINE = KILL_OURS_SH + 'pid_line $$ > "$1"'
_STREAMED = _PID_LINE + ' && shift && exec "$@" 2>&1'
#: The ss loop writes every sample the moment it is taken; ``dd`` collects them into blocks of
#: :data:`STREAM_BLOCK_BYTES` (written when full and at the end), so the channel wakes once a block, not once a
#: sample, in the contended guest. The netlink and BPF samplers buffer as much themselves (stdio).
STREAM_BLOCK_BYTES = 1 << 20
_STREAMED_SS = _PID_LINE + f' && shift && "$@" 2>&1 | dd ibs=64K obs={STREAM_BLOCK_BYTES} status=none'
#: Seconds to wait for the stream's end after the sampler stopped (its last block crossing the channel).
STREAM_DRAIN_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0

#: $1 stop file, $2 pid file: ask the sampler to stop, wait up to 10 s for it, then SIGKILL its session while
#: its pid still names the process the pid file names (pid and start ticks).
_STOP = RUNNING_SH + KILL_OURS_SH + r"""
touch "$1"
ticks=
i=0
while [ -z "$ticks" ] && [ $i -lt 20 ]; do
    read_pid_line "$2"; [ -n "$ticks" ] || sleep 0.05; i=$((i + 1))
done
[ -n "$pid" ] && [ -n "$ticks" ] || exit 0
i=0
while running "$pid" && same "$pid" "$ticks" && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill_ours "$pid" "$ticks"
exit 0
"""


def _argv(kind: str, binary_path: str, interval_ms: float, stop_after_s: float, stop_file: str,
          ports: Sequence[int], server_port: int) -> list[str]:
    if kind == "ss":
        return sampler_argv(interval_ms, stop_after_s, stop_file, data_ports=ports, server_port=server_port)
    return sockdiag.sampler_argv(binary_path, interval_ms, stop_after_s, stop_file, ports, server_port, kind=kind)


def _tail(path: Path, nbytes: int = 600) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - nbytes))
        return f.read().decode(errors="replace").strip()


def _wait_ready(handle: Sampler, stream) -> None:
    """Until the sampler's ``# ready`` line has arrived in the log on this machine (its socket open, resp.
    its program loaded); :class:`SamplerError` when it ends first or after :data:`READY_TIMEOUT_S`."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with open(handle.log_file, "rb") as f:
            head = f.read(1 << 16)
        if head.startswith(b"# ready") or b"\n# ready" in head:
            return
        ended = stream.wait(0.05)
        if ended is not None or time.monotonic() > deadline:
            why = f"exited with {ended}" if ended is not None else f"not ready after {READY_TIMEOUT_S:g} s"
            raise SamplerError(f"the {handle.kind} sampler on {handle.host.name} did not start ({why}): "
                               f"{_tail(handle.log_file)}")


@contextmanager
def sampler(host: Host, ports: Sequence[int], interval_ms: float, stop_after_s: float, *, log_file: str | Path,
            server_port: int = IPERF_PORT, kind: str = "ss") -> Iterator[Sampler]:
    """Sample the flow's data connections (local ``ports``) on ``host`` during the ``with`` block, the log
    streamed into ``log_file`` on this machine as the sampler writes it.

    ``kind``: ``bpf`` (in-kernel program), ``netlink`` (inet_diag client) or ``ss`` (the fork loop); see
    :mod:`bbrlab.sampling.sockdiag`. Everything is checked before the sampler starts; a netlink or BPF sampler is
    copied to the host first when its copy there is missing or differs, and the block starts only once the
    sampler is ready (its socket open, resp. its program loaded), so the transfer is sampled from its
    start and pays none of the sampler's start-up.

    The sampler's output is never a file on ``host``: it runs as the command of a stream
    (:meth:`bbrlab.core.hosts.Host.stream`, an SSH channel of its own), in blocks of at most 1 MiB, so a long
    run cannot fill the host's tmpfs; on the host only its pid and stop files live, in a private directory
    (``mktemp -d``). It stops by itself after ``stop_after_s`` whatever happens to this process (and when
    the channel goes, at its next write). When the block ends, the sampler is asked to stop (stop file; its
    session is killed after 10 s) and the stream is drained: the log is complete and ``Sampler.text`` reads
    it. When the block fails, whatever arrived stays in ``log_file``. The log on this machine is capped at
    :data:`~bbrlab.scenario.sampling_limits.SAMPLE_LOG_MAX_BYTES` (the spec bounds' largest log and a margin): a
    sampler writing beyond it is cut off there and the run's checks fail it.
    """
    if kind not in ("ss", *sockdiag.KINDS):
        raise ValidationError("sampler", kind, f"one of ss, {', '.join(sockdiag.KINDS)}")
    if not ports:
        raise ValidationError("ports", ports, "the data streams' local ports (at least one)")
    _argv(kind, "/validated", interval_ms, stop_after_s, "/nonexistent", ports, server_port)  # checks every value
    deployed = sockdiag.ensure_on_host(host, kind=kind) if kind != "ss" else None
    with host.private_dir("sampler") as directory:
        handle = Sampler(kind, host, directory, interval_ms, Path(log_file),
                         binary=deployed)
        argv = _argv(kind, deployed.path if deployed else "", interval_ms, stop_after_s, handle.stop_path, ports,
                     server_port)
        wrapper = _STREAMED_SS if kind == "ss" else _STREAMED
        stream = host.stream(["sh", "-c", wrapper, "bbrlab-sampler", handle.pid_path, *argv], handle.log_file,
                             max_bytes=SAMPLE_LOG_MAX_BYTES)
        ended_normally = False
        try:
            if deployed is not None:
                _wait_ready(handle, stream)
            yield handle
            ended_normally = True
        finally:
            _stop(handle, stream, drain=ended_normally)


def _stop(handle: Sampler, stream, *, drain: bool) -> None:
    """Stop the sampler (stop file, then SIGKILL after 10 s) and, with ``drain``, wait for the rest of its
    log to arrive; mark the log complete."""
    try:
        handle.host.run(["sh", "-c", _STOP, "bbrlab-stop", handle.stop_path, handle.pid_path], timeout=60,
                        check=False)
        ended = stream.wait(STREAM_DRAIN_TIMEOUT_S if drain else 5)
    finally:
        stream.close()
    if drain:
        if ended is None:
            raise SamplerError(f"the {handle.kind} sampler's log from {handle.host.name} did not end within "
                               f"{STREAM_DRAIN_TIMEOUT_S:g} s of its stop")
        with open(handle.log_file, "rb") as f:
            os.fsync(f.fileno())
        handle.complete = True
    handle.exit_code, handle.capped = ended, stream.capped


#: Samplers left by a killed process (private directories of ours holding a log): ask each to stop; a
#: directory already asked to stop by an earlier recovery is removed (its sampler ended within seconds).
_STOP_STRAYS = r"""
n=0
for d in "${TMPDIR:-/tmp}"/bbrlab-sampler.*; do
    [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && { [ -e "$d/pid" ] || [ -e "$d/samples.log" ]; } || continue
    if [ -e "$d/stop" ]; then rm -rf -- "$d"; else touch "$d/stop" && n=$((n + 1)); fi
done
echo "$n"
"""


def stop_strays(host: Host) -> int:
    """Stop samplers that a killed predecessor left running on ``host``; return how many were asked to."""
    out = host.output(["sh", "-c", _STOP_STRAYS], timeout=30, check=False)
    return int(out) if out.isdigit() else 0


def parse_sampler_footer(text: str) -> dict | None:
    """The sampler's ``# end`` line as numbers: samples, cpu_s (own + children: ss) and cpu_per_sample_ms."""
    m = re.search(r"^# end samples=(\d+) ticks=(\d+),(\d+),(\d+),(\d+) hz=(\d+)\s*$", text, re.M)
    if not m:
        return None
    samples = int(m.group(1))
    hz = int(m.group(6))
    self_s = (int(m.group(2)) + int(m.group(3))) / hz
    children_s = (int(m.group(4)) + int(m.group(5))) / hz
    cpu_s = self_s + children_s
    return {
        "samples": samples,
        "cpu_self_s": self_s,
        "cpu_children_s": children_s,
        "cpu_s": cpu_s,
        "cpu_per_sample_ms": cpu_s * 1000 / samples if samples else None,
    }


def sample_times(text: str) -> list[float]:
    """The ``# t=`` times of a log, in seconds."""
    return [float(m.group(1)) for m in re.finditer(r"^# t=([0-9.]+)\s*$", text, re.M)]


def achieved_interval_ms(text: str) -> dict | None:
    """Median, mean and 95th percentile of the gaps between samples, in ms (None with < 2 samples)."""
    times = sample_times(text)
    gaps = sorted((b - a) * 1000 for a, b in zip(times, times[1:], strict=False))
    if not gaps:
        return None
    return {
        "median_ms": gaps[len(gaps) // 2],
        "mean_ms": sum(gaps) / len(gaps),
        "p95_ms": gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))],
        "samples": len(times),
    }
