"""Write datasets in the 2BRobust authors' published layout, with invented values.

The layout and key names follow what their ``measure/run.sh`` writes and their ``results/plots``
notebooks read (see bbrlab/analysis/authors.py): ``<YYYYmmdd-HHMMSS>/meta.json`` (one line, every value a
string, deadlines in nanoseconds), ``<stamp>/sender/iperf_<i>.json`` for i = 1..n, an empty
``<stamp>/emulator/``, and ``socket_data/ss_<scenario>_scheduling_bbr<v>[_N].log``. The numbers are
NOT measurements: a small model (below) makes throughputs and socket states that differ per BBR
version and patch, so tests and notebooks can tell them apart.

``python -m tests.authors_layout DIR`` writes the committed fixture (tests/fixtures/authors/); the
ingest benchmark uses :func:`write_grid` for its 20,000 repetitions.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import sys
from pathlib import Path

T0 = dt.datetime(2026, 2, 2, 9, 0, 0, tzinfo=dt.UTC)
INTERVALS = 10  # one per second of a 10 s transfer

# (meta cca, meta kernel) of each congestion control in the fixture, and its median throughput
# [Mbit/s] at (timeslice_ms, share_pct) on a 100 Mbit/s link (invented, shaped like the paper's).
VARIANTS = {
    "Cubic": ("cubic", "kernel6-1", {(1, 25): 84, (10, 25): 78, (1, 50): 95, (10, 50): 94}),
    "BBRv1": ("bbr", "kernel6-1", {(1, 25): 9, (10, 25): 4, (1, 50): 83, (10, 50): 41}),
    "BBRv3": ("bbr", "BBRv3", {(1, 25): 6, (10, 25): 2, (1, 50): 78, (10, 50): 30}),
    "BBRv3 patched": ("bbr", "BBRv3_fixed", {(1, 25): 71, (10, 25): 33, (1, 50): 93, (10, 50): 82}),
}
FULL_SHARE_MBIT = 95.0


def meta_json(*, cca: str, kernel: str, run_ns: int | None, period_ns: int | None, rate_mbit: int = 100,
              rtt_ms: int = 20, parallel: int = 1, n: int = 3, loss: str = "none", vm: str = "qemu_kvm",
              chaos: str = "on_1", **extra: str) -> dict:
    """meta.json's content as run.sh's ``jq --arg`` makes it: every value a string."""
    loss_mode, _, loss_params = loss.partition(" ")
    bdp_bytes = rate_mbit * 1e6 / 8 * rtt_ms / 1e3
    meta = {"chaos": chaos}
    if run_ns is not None:
        meta |= {"deadline_run": str(run_ns), "deadline_period": str(period_ns)}
    meta |= {
        "os": "debian", "bdp": "1.0", "setup": "new", "cca": cca, "cpus": "2", "kernel": kernel, "mode": "iperf3",
        "loss": {"mode": loss_mode, "params": loss_params, "seed1": "4242"}, "rate": str(rate_mbit),
        "delay_rtt": str(rtt_ms), "buffer_size_bytes": str(int(bdp_bytes)), "parallel": str(parallel),
        "socket_buffer": "2147483647", "app_buffer": "default", "n": str(n), "sysctl_cmd": "",
        "adapter_type": "virtio", "vm": vm,
    }
    return meta | {k: str(v) for k, v in extra.items()}


def iperf_json(*, cca: str, mbit: float, rng: random.Random, start_unix_s: float, streams: int = 1,
               rtt_ms: float = 21.0, error: str | None = None) -> dict:
    """An iperf3 client report (the keys bbrlab and the authors' parser read) around ``mbit``."""
    per_s = [round(max(0.0, rng.gauss(mbit, mbit * 0.08 + 0.3)), 3) for _ in range(INTERVALS)]
    intervals = []
    for i, rate in enumerate(per_s):
        s = {"socket": 5, "start": float(i), "end": float(i + 1), "seconds": 1.0, "bytes": int(rate * 1e6 / 8),
             "bits_per_second": round(rate * 1e6), "retransmits": rng.randrange(0, 3), "snd_cwnd": 100 * 1448,
             "rtt": int(rtt_ms * 1000), "rttvar": 300, "pmtu": 1500, "omitted": False, "sender": True}
        total = {k: s[k] for k in ("start", "end", "seconds", "bytes", "bits_per_second", "retransmits", "omitted",
                                   "sender")}
        intervals.append({"streams": [s], "sum": total})
    sent_bps = round(sum(per_s) / INTERVALS * 1e6)
    received = {"start": 0.0, "end": float(INTERVALS), "seconds": float(INTERVALS),
                "bytes": int(sent_bps * INTERVALS / 8 * 0.999), "bits_per_second": round(sent_bps * 0.999), "sender": True}
    report = {
        "start": {"connected": [{"socket": 5, "local_host": "10.0.1.2", "local_port": 40000 + rng.randrange(9999),
                                 "remote_host": "10.0.2.2", "remote_port": 5201}],
                  "version": "iperf 3.12", "timestamp": {"timesecs": int(start_unix_s)},
                  "test_start": {"protocol": "TCP", "num_streams": streams, "blksize": 131072, "omit": 0,
                                 "duration": INTERVALS, "bytes": 0, "blocks": 0, "reverse": 0, "tos": 0}},
        "intervals": intervals,
        "end": {"sum_sent": {**received, "bytes": int(sent_bps * INTERVALS / 8), "bits_per_second": sent_bps,
                             "retransmits": sum(i["sum"]["retransmits"] for i in intervals)},
                "sum_received": received,
                "cpu_utilization_percent": {"host_total": round(rng.uniform(20, 60), 3), "host_user": 1.0,
                                            "host_system": 20.0, "remote_total": 3.0, "remote_user": 0.5,
                                            "remote_system": 2.5},
                "sender_tcp_congestion": cca, "receiver_tcp_congestion": "cubic"},
    }
    if error:
        report = {"start": report["start"], "intervals": [], "end": {}, "error": error}
    return report


def write_point(root: Path, stamp: str, meta: dict, reports: list[dict | str]) -> Path:
    """One measurement point: meta.json (one line), sender/iperf_<i>.json from 1, an empty emulator/."""
    point = root / stamp
    (point / "sender").mkdir(parents=True)
    (point / "emulator").mkdir()
    (point / "meta.json").write_text(json.dumps(meta, separators=(", ", ": ")) + "\n")
    for i, report in enumerate(reports, 1):
        text = report if isinstance(report, str) else json.dumps(report)
        (point / "sender" / f"iperf_{i}.json").write_text(text)
    return point


def stamp_of(index: int) -> str:
    """Folder name of the index-th point: run.sh's ``date +%Y%m%d-%H%M%S``, 5 minutes apart."""
    return (T0 + dt.timedelta(minutes=5 * index)).strftime("%Y%m%d-%H%M%S")


def grid_points(reps: int) -> list[tuple[dict, list[float], str]]:
    """(meta, per-repetition median throughput, iperf cca) of the main grid: 4 CCAs x 1/10 ms x 25/50/100 %."""
    out = []
    for cca, kernel, table in VARIANTS.values():
        for ts in (1, 10):
            for share in (25, 50, 100):
                mbit = FULL_SHARE_MBIT if share == 100 else table[(ts, share)]
                run_ns = ts * 1_000_000
                meta = meta_json(cca=cca, kernel=kernel, run_ns=run_ns, period_ns=run_ns * 100 // share, n=reps)
                out.append((meta, [mbit] * reps, cca))
    return out


def write_grid(root: Path, reps: int, *, start_index: int = 0, seed: int = 7, copies: int = 1) -> int:
    """The main grid ``copies`` times (new stamps each time); returns the number of iperf3 files."""
    rng = random.Random(seed)
    index, files = start_index, 0
    for _ in range(copies):
        for meta, mbits, cca in grid_points(reps):
            start = (T0 + dt.timedelta(minutes=5 * index)).timestamp()
            reports = [iperf_json(cca=cca, mbit=m, rng=rng, start_unix_s=start + 25 * k) for k, m in enumerate(mbits)]
            write_point(root, stamp_of(index), meta, reports)
            index, files = index + 1, files + len(reports)
    return files


def special_points(root: Path, start_index: int) -> None:
    """Points that exercise the reader's rules (each documented in the fixture's README)."""
    rng = random.Random(11)

    def reports(cca, mbit, k=3, **kw):
        return [iperf_json(cca=cca, mbit=mbit, rng=rng, start_unix_s=T0.timestamp(), **kw) for _ in range(k)]

    specials = [
        # BBRv1 as bbr1 on the BBRv3 kernel; and the patched BBRv1 of a kernel6-1_fixed kernel
        (meta_json(cca="bbr1", kernel="BBRv3", run_ns=1_000_000, period_ns=4_000_000), reports("bbr1", 10)),
        (meta_json(cca="bbr", kernel="kernel6-1_fixed", run_ns=1_000_000, period_ns=4_000_000), reports("bbr", 68)),
        # the sender's qdisc is fq
        (meta_json(cca="cubic", kernel="kernel6-1", run_ns=1_000_000, period_ns=2_000_000, qdisc="fq"),
         reports("cubic", 95)),
        # real hypervisor load instead of deadline scheduling, on VirtualBox
        (meta_json(cca="bbr", kernel="kernel6-1", run_ns=None, period_ns=None, chaos="real_kvm", loadperc="50",
                   vm="virtualbox"), reports("bbr", 60)),
        # random loss 0.1 % (25 % correlation), 4 flows
        (meta_json(cca="bbr", kernel="BBRv3", run_ns=None, period_ns=None, chaos="none", loss="random 0.1 25",
                   parallel=4), reports("bbr", 90, streams=4)),
        # at 30 ms RTT, apart from the grid: repetition 2 of 3 has an iperf3 error: 2 fails, 3 is left out
        (meta_json(cca="bbr", kernel="BBRv3", run_ns=10_000_000, period_ns=40_000_000, rtt_ms=30),
         [*reports("bbr", 2, k=1), iperf_json(cca="bbr", mbit=0, rng=rng, start_unix_s=0,
                                             error="unable to connect to server: Connection refused"),
          *reports("bbr", 2, k=1)]),
        # repetition 1 ran cubic although meta.json says bbr: the whole point is left out
        (meta_json(cca="bbr", kernel="kernel6-1", run_ns=10_000_000, period_ns=20_000_000, rtt_ms=30),
         [*reports("cubic", 95, k=1), *reports("bbr", 40, k=2)]),
        # n says 3, only 2 files
        (meta_json(cca="cubic", kernel="kernel6-1", run_ns=10_000_000, period_ns=20_000_000, rtt_ms=30),
         reports("cubic", 94, k=2)),
    ]
    for k, (meta, reps) in enumerate(specials):
        write_point(root, stamp_of(start_index + k), meta, reps)


# -- socket logs ------------------------------------------------------------------------------------

SOCKET_LOGS = {  # file stem -> (cca as ss prints it, BBR version, patched, share)
    "ss_no_scheduling_bbr1": ("bbr1", 1, False, 100),
    "ss_25_scheduling_bbr1": ("bbr1", 1, False, 25),
    "ss_no_scheduling_bbr3": ("bbr", 3, False, 100),
    "ss_25_scheduling_bbr3": ("bbr", 3, False, 25),
    "ss_patched_25_scheduling_bbr3": ("bbr", 3, True, 25),
    "ss_25_scheduling_bbr2_1": ("bbr2", 2, False, 25),
}
SS_SAMPLES = 50  # 10 s every 200 ms
MSS = 1448


def socket_lines(cca: str, patched: bool, share: int, rng: random.Random, *, t0: float,
                 with_address: bool = False) -> list[str]:
    """``<epoch>,<ss -ti output>`` lines of one flow: BBR's state cycling through ProbeBW's gains;
    under contention inflight stays below BBR's BDP, and the patched module then paces at 2.77."""
    lines = [f"{t0 - 0.2:.6f},\tcubic wscale:7,7 rto:204 rtt:0.5/0.2 mss:{MSS} cwnd:10 bytes_sent:120 "
             "bytes_acked:121 send 231Mbps lastsnd:4 pacing_rate 462Mbps app_limited"]  # iperf3's control socket
    sent = acked = 0
    bw = 95.0 if share == 100 else (70.0 if patched else 8.0)
    for k in range(SS_SAMPLES):
        gain = [1.25, 0.75, 1, 1, 1, 1, 1, 1][k % 8]
        inflight_bdp = rng.uniform(1.05, 1.6) if share == 100 else rng.uniform(0.3, 0.95)
        if patched and inflight_bdp < 1:
            gain = 2.77
        mrtt = 20.1
        bdp_bytes = bw * 1e6 / 8 * mrtt / 1e3
        inflight = int(inflight_bdp * bdp_bytes)
        acked += int(bw * 1e6 / 8 * 0.2)
        sent = acked + inflight
        delivery = max(0.1, rng.gauss(bw, bw * 0.1))
        info = (f"{cca} wscale:7,7 rto:220 rtt:{mrtt + rng.uniform(0.3, 4):.3f}/0.6 ato:40 mss:{MSS} pmtu:1500 "
                f"rcvmss:536 advmss:{MSS} cwnd:{max(4, int(2 * bdp_bytes / MSS))} bytes_sent:{sent} bytes_acked:{acked} "
                f"segs_out:{sent // MSS} segs_in:{acked // MSS // 2} data_segs_out:{sent // MSS} "
                f"bbr:(bw:{bw * 1e6:.0f}bps,mrtt:{mrtt},pacing_gain:{gain},cwnd_gain:2) send {bw * 1.9:.1f}Mbps "
                f"lastsnd:4 pacing_rate {bw * gain:.1f}Mbps delivery_rate {delivery:.1f}Mbps "
                f"delivered:{acked // MSS} busy:{200 * (k + 1)}ms unacked:{max(1, inflight // MSS)} "
                f"rcv_space:14480 rcv_ssthresh:64088 minrtt:{mrtt}")
        stamp = f"{t0 + 0.2 * k:.6f}"
        lines.append(f"{stamp},ESTAB 0 0 10.0.1.2:40412 10.0.2.2:5201 {info}" if with_address
                     else f"{stamp},\t{info}")
    return lines


def write_socket_logs(root: Path) -> None:
    folder = root / "socket_data"
    folder.mkdir(parents=True)
    rng = random.Random(3)
    for k, (stem, (cca, _version, patched, share)) in enumerate(SOCKET_LOGS.items()):
        lines = socket_lines(cca, patched, share, rng, t0=T0.timestamp() + 3600 * (k + 1),
                             with_address=stem == "ss_25_scheduling_bbr1")
        (folder / f"{stem}.log").write_text("\n".join(lines) + "\n")


def write_fixture(root: Path) -> None:
    """The committed fixture: the main grid (3 repetitions), the special points, the socket logs."""
    write_grid(root, reps=3)
    special_points(root, start_index=len(grid_points(3)))
    write_socket_logs(root)


if __name__ == "__main__":
    write_fixture(Path(sys.argv[1]))
