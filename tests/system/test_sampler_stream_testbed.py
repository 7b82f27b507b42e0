"""A sampled run's log is streamed to this machine while the run goes on (issue 24, item 10).

The sampler in the local testbed's sender VM (Debian 6.1 guest, TCG) writes into an SSH channel, never into
a file of the guest's tmpfs: a watcher on a second SSH connection looks at the guest during the run and sees
the sampler's stdout is a pipe and its private directory holds nothing but its pid file, while the log grows
here. The run's record also carries the bottleneck queue the emulator's kernel held (item 7).
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from bbrlab.core.ownedpids import KILL_OURS_SH
from bbrlab.run.runner import SAMPLE_FILES, run_once
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling import sockdiag
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

pytestmark = [pytest.mark.system, pytest.mark.testbed]

#: For every sampler directory in the guest: its size in bytes (du, apparent sizes), then what the
#: sampler's stdout is (readlink of /proc/PID/fd/1); "none" when no sampler runs.
_LOOK = KILL_OURS_SH + r"""
found=0
for d in /tmp/bbrlab-sampler.*; do
    [ -d "$d" ] || continue
    found=1
    size=$(du -sb "$d" | cut -f1)
    read_pid_line "$d/pid"
    out=$( [ -n "$pid" ] && readlink "/proc/$pid/fd/1" )
    echo "$size $out $(ls "$d" | tr '\n' ,)"
done
[ "$found" = 1 ] || echo none
"""


class GuestWatch:
    """Looks at the guest twice a second on a connection of its own, and at the log file here."""

    def __init__(self, host, log_file):
        self.host = dataclasses.replace(host)  # its own SSH connection
        self.log_file = log_file
        self.seen: list[tuple[int, str, str, int]] = []  # (dir bytes, stdout, files, local log bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.5):
            out = self.host.output(["sh", "-c", _LOOK], timeout=30, check=False)
            local = self.log_file.stat().st_size if self.log_file.exists() else 0
            for line in out.splitlines():
                if line != "none":
                    size, stdout, files = (line.split(" ") + ["", ""])[:3]
                    self.seen.append((int(size), stdout, files, local))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)
        self.host.close()


@pytest.mark.parametrize("kind, sample_ms", [("bpf", 2), pytest.param("ss", 10, marks=pytest.mark.slow)])
def test_the_log_streams_here_and_the_guest_holds_no_log(testbed, tmp_path, kind, sample_ms):
    """The ss case is in make test-slow (25 s, a 10 s run); make test covers what it shows on the same parts:
    the sampler's log streamed over its SSH channel with nothing but its pid file in the guest, in the BPF case
    here (the ss loop's wrapper differs only by the ``dd`` that blocks its output); the ss loop's log arriving
    here through that channel, parsed into samples, in test_transfer_testbed.py::
    test_copy_at_no_loss_arrives_whole_through_the_experiment_link (``ss.log``, ``sampling.rows``); and its
    private directory gone after the run, nothing written at a predictable name, in test_run_path_testbed.py::
    test_no_per_run_file_at_a_predictable_tmp_name."""
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=100), Contention(10, 100),
                        Flow("bbr", IperfParams(duration_s=10), sample_ms=sample_ms, sampler=kind))
    log_file = tmp_path / SAMPLE_FILES[kind]
    with GuestWatch(testbed.sender.host, log_file) as watch:
        record = run_once(testbed, scenario, tmp_path)
    assert record["status"] == "ok", record["reason"]
    running = [s for s in watch.seen if s[1]]
    assert len(running) >= 5, watch.seen  # looked at the sampler while it ran
    assert all(s[1].startswith("pipe:") for s in running), running  # its stdout goes to the channel
    # nothing but the owner stamp (made with the directory), the pid file and, at the end, the stop file; the pid
    # is missing for an instant before it is written and after it is removed
    other = [s for s in watch.seen if s[2] not in ("", "owner,", "owner,pid,", "owner,pid,stop,", "owner,stop,")]
    assert other == [], other  # no log file in the guest
    assert max(s[0] for s in watch.seen) < 4096, watch.seen
    text = log_file.read_text()
    if kind == "bpf":  # 10 s x 500 samples/s x ~620 bytes: 1 MiB blocks arrived during the run
        assert max(s[3] for s in running) >= sampling.STREAM_BLOCK_BYTES, watch.seen
        assert len(sockdiag.rows(text, ports=record["metadata"]["flow"]["client_ports"])) >= 2000
        # what test_sockdiag_testbed's run-path test checks of a netlink-sampled run (its BPF case is slow)
        s = record["metadata"]["sampling"]
        assert s["kind"] == "bpf" and s["binary"]["sha256"] == sockdiag.build("bpf").sha256
        assert s["asked_interval_ms"] == sample_ms and s["samples"] >= 500, s
        assert {"median_ms", "p99_ms", "longest_gap_ms"} <= set(s["interval"]) and s["missed_ticks"] is not None
        assert s["cpu_per_sample_ms"] > 0 and record["metadata"]["cca"]["ss_seen"] == ["bbr"]
        assert record["scenario"]["flow"]["sampler"] == "bpf" and not (tmp_path / "ss.log").exists()
    else:
        assert sampling.parse_sampler_footer(text)["samples"] >= 20  # a fork of ss takes 170-520 ms under TCG
    assert record["metadata"]["sampling"]["samples"] > 0
    print(kind, {k: record["metadata"]["sampling"].get(k) for k in ("samples", "missed_ticks", "cpu_per_sample_ms",
                                                                    "dropped", "interval")})
    leftover = testbed.sender.host.output(["sh", "-c", "ls -d /tmp/bbrlab-sampler.* 2>/dev/null || true"])
    assert leftover == ""
    # item 7: the queue the emulator's kernel held, in the record: 1 BDP of 100 Mbit/s x 20 ms
    assert {k: record["metadata"]["link"][k] for k in ("queue_bytes", "queue_bdp")} == \
        {"queue_bytes": 250_000, "queue_bdp": 1.0}
