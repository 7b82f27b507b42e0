"""Socket sampling on the contended sender: the ss fork loop, the netlink sampler and the BPF sampler, in one run.

On the local testbed (holds its lock), through the emulator at 20 ms / 100 Mbit/s, one iperf3 stream per
run, the samplers started before the client as a run does. Printed:

1. guest CPU per sample, each asked for 10 ms at 100 % share: the ss loop (bash's /proc ticks with ss as
   its children), the netlink sampler (its ``getrusage`` after start-up) and the BPF sampler (its loader's
   ``getrusage`` after start-up plus the BPF program's own run time, BPF_STATS_RUN_TIME); the ratios of
   the ss loop's to the others' (target >= 100); start-up CPU apart (it is spent before the transfer);
2. the achieved interval of the netlink and BPF samplers at 100 % share (target: median 10 ms, p99 <= 12
   ms) and at 1 ms / 25 % and 10 ms / 25 % share (gap distribution; target median <= 12 ms at 1 ms / 25 %);
3. perturbation: median throughput with each sampler at 10 ms / median without, bbr and cubic, at 100 %
   and at 1 ms / 25 % (runs without and with each sampler interleaved; goal >= 0.95).

All three run on a TCG guest of a shared 2-core machine: guest CPU time includes whatever the host took
from the vCPU while the sampler was current (the guest cannot tell), so the absolute numbers grow with
the host's load; the load average is printed at the start and the end.

``BBRLAB_TESTBED`` names the testbed (default ``local``), ``BBRLAB_BENCH_REPS`` the repetitions per
perturbation cell (default 5), ``BBRLAB_BENCH_SAMPLING_S`` the transfer length (default 10 s).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from bbrlab.contention.deadline import contended
from bbrlab.core.hostloop import RUNNING_SH
from bbrlab.link import emulator as link
from bbrlab.run import iperf
from bbrlab.sampling import sampler as sampling
from bbrlab.sampling import sockdiag
from bbrlab.scenario.scenario import Contention, Link

LINK = Link(rtt_ms=20, rate_mbit=100)
INTERVAL_MS = 10
FULL = Contention(10, 100)
SETTINGS_25 = (Contention(1, 25), Contention(10, 25))
GAP_EDGES_MS = (9, 11, 12, 20, 50, 100, 250)

#: Stop a sampler and print its log: $1 directory, $2 pid (it finishes its sample and writes its footer).
_STOP = RUNNING_SH + r"""
touch "$1/stop"
i=0
while running "$2" && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
kill -KILL "$2" 2>/dev/null
cat "$1/samples.log"
rm -rf "$1"
"""


#: Wait until a sampler has written its "# ready" line: $1 log, $2 pid (fails when it exits first).
_WAIT_READY = RUNNING_SH + r"""
i=0
until grep -q '^# ready' "$1" 2>/dev/null; do
    running "$2" || { cat "$1" >&2; exit 1; }
    [ $i -lt 1200 ] || exit 1
    sleep 0.05; i=$((i + 1))
done
"""


@dataclass
class Outcome:
    """One transfer: what iperf3 measured and what the sampler (if any) reported."""

    throughput_mbit: float
    sampler: dict | None


def _label(c: Contention) -> str:
    return "100 % share" if c.unlimited else f"{c.timeslice_ms:g} ms / {c.cpu_share_pct:g} %"


class Bench:
    """Runs transfers on one testbed; ports move on from run to run (TIME_WAIT)."""

    def __init__(self, tb, duration_s: int):
        self.tb = tb
        self.duration_s = duration_s
        self.port = 26_000
        self.deployed = {kind: sockdiag.ensure_on_host(tb.sender.host, kind=kind) for kind in sockdiag.KINDS}
        self.threads = tb.sender.vcpu_threads()

    def _start(self, kind: str, directory: str, port: int) -> int:
        host = self.tb.sender.host
        host.run(["mkdir", "-p", directory])
        stop_after_s = self.duration_s + 120
        if kind in sockdiag.KINDS:
            argv = sockdiag.sampler_argv(self.deployed[kind].path, INTERVAL_MS, stop_after_s, f"{directory}/stop",
                                         [port], iperf.DEFAULT_PORT, kind=kind)
        else:
            argv = sampling.sampler_argv(INTERVAL_MS, stop_after_s, f"{directory}/stop", data_ports=[port])
        pid = host.spawn(argv, f"{directory}/samples.log")
        if kind in sockdiag.KINDS:  # loading (the BPF program: relocating against the kernel's BTF) is done first
            host.run(["sh", "-c", _WAIT_READY, "sh", f"{directory}/samples.log", str(pid)], timeout=120)
        return pid

    def transfer(self, cca: str, contention: Contention, kind: str | None) -> Outcome:
        """One transfer of ``cca`` under ``contention`` with sampler ``kind`` (netlink, ss or None)."""
        tb, self.port = self.tb, self.port + 1
        sender, receiver = tb.sender.host, tb.receiver
        directory = f"/tmp/bbrlab-bench-sampling-{self.port}"
        server_log = f"/tmp/bbrlab-bench-server-{self.port}.log"
        server = iperf.start_server(receiver.host, server_log, lifetime_s=self.duration_s + 120)
        pid = None
        try:
            pid = self._start(kind, directory, self.port) if kind else None
            with contended(tb.sender.hypervisor, self.threads, contention):
                result = sender.run(iperf.client_argv(receiver.experiment_ip, cca=cca, duration_s=self.duration_s,
                                                      cport=self.port),
                                    timeout=self.duration_s + iperf.CLIENT_MARGIN_S + 30, check=False)
            text = sender.output(["sh", "-c", _STOP, "sh", directory, str(pid)], timeout=60) if pid else None
        finally:
            iperf.stop(receiver.host, server, remove=[server_log])
        parsed = iperf.parse_result(result.stdout)
        if text is None:
            return Outcome(parsed.receiver_mbit, None)
        return Outcome(parsed.receiver_mbit, _sampler_summary(text) if kind in sockdiag.KINDS else _ss_summary(text))


def _sampler_summary(text: str) -> dict:
    s = sockdiag.summary(text)
    if sockdiag.log_kind(text) == "netlink":
        times = [x.monotonic_ns for x in sockdiag.parse_log(text).samples]
    else:
        times = sorted({r["slot"]: r["mono_ns"] for r in reversed(sockdiag.bpf.parse_log(text).records)}.values())
    s["gaps_ms"] = [(b - a) / 1e6 for a, b in zip(times, times[1:], strict=False)]
    return s


def _ss_summary(text: str) -> dict:
    footer = sampling.parse_sampler_footer(text) or {}
    times_ns = [round(t * 1e9) for t in sampling.sample_times(text)]
    return {"kind": "ss", "samples": footer.get("samples"), "cpu_per_sample_ms": footer.get("cpu_per_sample_ms"),
            "cpu_s": footer.get("cpu_s"), "interval": sockdiag.interval_stats(times_ns), "missed_ticks": None}


def _interval_text(s: dict) -> str:
    iv = s["interval"] or {}
    missed = f", {s['missed_ticks']} ticks missed" if s.get("missed_ticks") is not None else ""
    return (f"{s['samples']} samples{missed}; interval median {iv.get('median_ms', float('nan')):.2f} ms, "
            f"p99 {iv.get('p99_ms', float('nan')):.2f} ms, longest gap {iv.get('longest_gap_ms', float('nan')):.1f} ms")


def _gap_distribution(gaps_ms: list[float]) -> str:
    edges = (0, *GAP_EDGES_MS, float("inf"))
    parts = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        n = sum(lo <= g < hi for g in gaps_ms)
        label = f">={lo:g}" if hi == float("inf") else f"{lo:g}-{hi:g}"
        parts.append(f"{label} ms: {n}")
    return "gaps " + ", ".join(parts)


def _cost_text(s: dict) -> str:
    startup = f", start-up {s['cpu_startup_s']:.2f} s" if s.get("cpu_startup_s") is not None else ""
    return f"{s['cpu_per_sample_ms']:8.3f} ms CPU per sample{startup}"


def cost_and_intervals(bench: Bench) -> None:
    print(f"-- guest CPU per sample, each asked for {INTERVAL_MS} ms, bbr at 100 % share, {bench.duration_s} s each "
          "(netlink: its getrusage after start-up; bpf: the loader's after start-up + the BPF program's run time)",
          flush=True)
    out = {kind: bench.transfer("bbr", FULL, kind) for kind in ("ss", "netlink", "bpf")}
    for kind, o in out.items():
        print(f"{kind:7s}: {_cost_text(o.sampler)}; {_interval_text(o.sampler)}; {o.throughput_mbit:.1f} Mbit/s")
    ss_cost = out["ss"].sampler["cpu_per_sample_ms"]
    for kind in ("netlink", "bpf"):
        print(f"ratio ss / {kind} CPU per sample: {ss_cost / out[kind].sampler['cpu_per_sample_ms']:.0f}x "
              "(target >= 100x)")
    for kind in ("netlink", "bpf"):
        iv = out[kind].sampler["interval"]
        print(f"{kind} at 100 %: median {iv['median_ms']:.2f} ms (target 10), p99 {iv['p99_ms']:.2f} ms "
              "(target <= 12)")
        print("  " + _gap_distribution(out[kind].sampler["gaps_ms"]), flush=True)
    for contention in SETTINGS_25:
        for kind in ("netlink", "bpf"):
            o = bench.transfer("bbr", contention, kind)
            target = " (target median <= 12 ms)" if contention.timeslice_ms == 1 else ""
            print(f"{kind} at {_label(contention)}: {_interval_text(o.sampler)}{target}; {_cost_text(o.sampler)}; "
                  f"{o.throughput_mbit:.1f} Mbit/s")
            print("  " + _gap_distribution(o.sampler["gaps_ms"]), flush=True)


def perturbation(bench: Bench, reps: int) -> None:
    print(f"-- perturbation: median throughput with a sampler at {INTERVAL_MS} ms / median without, {reps} runs "
          "each, interleaved (none, netlink, bpf)", flush=True)
    for contention in (FULL, SETTINGS_25[0]):
        for cca in ("bbr", "cubic"):
            mbit: dict = {None: [], "netlink": [], "bpf": []}
            cpu: dict = {"netlink": [], "bpf": []}
            for _ in range(reps):
                for kind in mbit:
                    out = bench.transfer(cca, contention, kind)
                    mbit[kind].append(out.throughput_mbit)
                    if kind:
                        cpu[kind].append(out.sampler["cpu_per_sample_ms"])
            base = statistics.median(mbit[None])
            print(f"{_label(contention):>13} {cca:5s}: without {base:6.2f} Mbit/s {[round(x, 1) for x in mbit[None]]}",
                  flush=True)
            for kind in ("netlink", "bpf"):
                ratio = statistics.median(mbit[kind]) / base
                print(f"{'':>13} {'':5s}  {kind:7s} {statistics.median(mbit[kind]):6.2f} Mbit/s "
                      f"{[round(x, 1) for x in mbit[kind]]}; ratio {ratio:.3f} (goal >= 0.95); CPU per sample "
                      f"median {statistics.median(cpu[kind]):.3f} ms", flush=True)


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    import bbrlab.testbed as tbmod

    name = os.environ.get("BBRLAB_TESTBED", "local")
    reps = int(os.environ.get("BBRLAB_BENCH_REPS", "5"))
    duration_s = int(os.environ.get("BBRLAB_BENCH_SAMPLING_S", "10"))
    with tbmod.testbed_lock(name):
        tb = tbmod.up(name, progress=False)
        try:
            link.set(tb.emulator.host, tb.emulator.ports, LINK)
            bench = Bench(tb, duration_s)
            shas = ", ".join(f"{k} {d.sha256[:12]}" for k, d in bench.deployed.items())
            print(f"testbed {name} ({tb.accelerator}), link {LINK.rtt_ms:g} ms / {LINK.rate_mbit:g} Mbit/s, samplers "
                  f"{shas}; this machine's load average {_load()}", flush=True)
            t0 = time.monotonic()
            cost_and_intervals(bench)
            perturbation(bench, reps)
            print(f"load average at the end {_load()}, {time.monotonic() - t0:.0f} s")
        finally:
            link.clear(tb.emulator.host, tb.emulator.ports)
            tb.close()


if __name__ == "__main__":
    main()
