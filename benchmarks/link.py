"""Emulated link on the local testbed: configured vs measured (ping RTT, UDP and TCP goodput), and the
cost of setting and clearing the qdiscs on the emulator VM over SSH.

Holds the testbed lock for the whole benchmark; brings the local testbed up if it is not, and down
again at the end only in that case. ``BBRLAB_BENCH_LINKS`` limits the grid (e.g. ``20x50,40x100``:
RTT ms x rate Mbit/s).
"""

from __future__ import annotations

import os
import time

GRID = [(20, 50), (10, 10), (40, 100), (20, 100)]


def _grid() -> list[tuple[float, float]]:
    text = os.environ.get("BBRLAB_BENCH_LINKS")
    if not text:
        return GRID
    return [tuple(float(x) for x in item.split("x")) for item in text.split(",")]


def _set_clear_cost(tb, link, n: int = 5) -> None:
    from bbrlab.link import emulator as linkmod

    t0 = time.monotonic()
    for _ in range(n):
        linkmod.set(tb.emulator.host, tb.emulator.ports, link)
    t_set = (time.monotonic() - t0) / n
    t0 = time.monotonic()
    linkmod.clear(tb.emulator.host, tb.emulator.ports)
    t_clear = time.monotonic() - t0
    print(f"set + read back + check over SSH: {t_set:.2f} s; clear + read back: {t_clear:.2f} s", flush=True)


def main() -> None:
    from bbrlab.link.validate import validate as validate_link

    import bbrlab.testbed as tbmod
    from bbrlab.link import emulator as linkmod
    from bbrlab.scenario.scenario import Link

    with tbmod.testbed_lock("local"):
        try:
            tb, started = tbmod.load("local"), False
        except Exception:  # not up: bring it up for this benchmark only
            tb, started = tbmod.up("local", progress=False), True
        try:
            print(f"{'rtt ms':>7} {'rate':>6} | {'ping median':>11} {'min':>6} | {'udp wire':>11} "
                  f"{'goodpt':>6} {'lost %':>6} | {'tcp':>6} {'retr':>5}", flush=True)
            for rtt_ms, rate_mbit in _grid():
                link = Link(rtt_ms=rtt_ms, rate_mbit=rate_mbit)
                linkmod.set(tb.emulator.host, tb.emulator.ports, link)
                r = validate_link(tb, link)
                rtt, udp, tcp = r["rtt_ms"], r["udp_mbit"], r["tcp_mbit"]
                print(f"{rtt_ms:>7g} {rate_mbit:>6g} | {rtt['measured']:>11.2f} {rtt['min']:>6.2f} | "
                      f"{udp['measured']:>11.2f} {udp['goodput_mbit']:>6.2f} {udp['lost_pct']:>6.2f} | "
                      f"{tcp['measured']:>6.2f} {tcp['retransmits']!s:>5}", flush=True)
            lossy = Link(rtt_ms=20, rate_mbit=50, loss_model="uniform", loss_pct=1.0)
            linkmod.set(tb.emulator.host, tb.emulator.ports, lossy)
            from bbrlab.link.validate import measure_loss

            loss = measure_loss(tb, lossy, packets=10_000)
            print(f"loss 1 % configured: {loss['measured']:.2f} % of {loss['packets']} datagrams lost", flush=True)
            _set_clear_cost(tb, Link(rtt_ms=20, rate_mbit=50))
        finally:
            linkmod.clear(tb.emulator.host, tb.emulator.ports)
            tb.close()
            if started:
                tbmod.down("local", progress=False)
