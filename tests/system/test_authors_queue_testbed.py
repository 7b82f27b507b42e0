"""Which queue limit is in force, measured on the local testbed's emulator VM (issue #26).

The paper authors' emulator put tbf at the root and netem (``limit 100000``) below it; the comment at the top of
Linux's ``net/sched/sch_tbf.c`` says tbf's limit then only sized the default child netem replaced. bbrlab
builds that tree with ``Link(queue="authors")`` and its own (netem -> tbf) by default. These tests push one
cubic flow through each tree with the same small buffer asked (6056 bytes, four full-size frames) on a
10 Mbit/s, 20 ms link and sample the data port's qdisc statistics on the emulator every 0.2 s while it runs
(one command streamed over SSH, so the samples do not wait on SSH round trips):

- the authors' tree: the bottleneck's backlog grows far beyond tbf's configured limit (more than twice that
  limit plus what the delay line holds, rate x one-way delay = 12500 bytes) and nothing is dropped: tbf's
  limit is not in force, netem's 100000 packets are the queue;
- bbrlab's tree: tbf's backlog never exceeds its limit and tbf drops: the buffer asked is the queue (make
  test-slow; test_bottleneck_testbed shows the same of bbrlab's tree in make test).

A third test sets the authors' offloads (TSO, GSO, GRO on) on the emulator's ports and reads them back.

The host kernel has no netem: these tests need the emulator VM. Two flows of 8-10 s and their set-up (the
sampling stops once the flow has ended); about 15 s each once the testbed is up. Run them with::

    BBRLAB_KEEP_TESTBED=1 /work/main/.venv/bin/python -m pytest tests/system/test_authors_queue_testbed.py -v -s
"""

from __future__ import annotations

import json
import time

import pytest

from bbrlab.link import counters as linkcount
from bbrlab.link import emulator as linkmod
from bbrlab.link import offloads
from bbrlab.scenario.scenario import Link
from bbrlab.testbed import lock as tblock
from tests.testbed_flows import client_report, received_mbit, serve_once

pytestmark = [pytest.mark.system, pytest.mark.testbed]

RATE_MBIT, RTT_MS, ASKED_BYTES = 10, 20, 6056
#: What the delay line holds at full rate: rate x one-way delay (10 Mbit/s x 10 ms), in bytes.
DELAY_LINE_BYTES = int(RATE_MBIT * 1e6 / 8 * RTT_MS / 2 / 1e3)
SAMPLE_EVERY_S = 0.2
#: The fewest qdisc samples a flow must yield. Measured on the local testbed (3 runs each, 2026-12-02): 35-37 over
#: the 10 s flow, 29 over the 8 s one (a round takes about 0.3 s under TCG, not 0.2). Ten is a sampler that
#: covered the flow at a third of that pace; one that ran for a fraction of it falls below.
MIN_SAMPLES = 10
#: One command on the emulator: the data port's qdiscs (JSON, with statistics) every SAMPLE_EVERY_S until the file
#: ``$stop`` exists (written once the flow has ended), at most n times. Its values (n, the port, the stop file)
#: arrive as arguments. (Under TCG one round takes far longer than SAMPLE_EVERY_S: tc's own start-up.)
SAMPLER = ('n=$1; dev=$2; stop=$3; i=0; while [ "$i" -lt "$n" ] && [ ! -e "$stop" ]; do '
           f'tc -raw -j -s qdisc show dev "$dev"; echo; sleep {SAMPLE_EVERY_S}; i=$((i + 1)); done')


@pytest.fixture
def emulator(testbed):
    """The emulator role with the testbed lock held; afterwards its offloads are off again (bbrlab's default) and
    bbrlab's qdiscs are cleared, whatever happened."""
    emu = testbed.emulator
    with tblock.testbed_lock(testbed.name):
        try:
            yield emu
        finally:
            try:
                offloads.apply(emu.host, emu.ports, "off")
            finally:
                linkmod.clear(emu.host, emu.ports)


def _cubic_flow_sampled(testbed, emu, tmp_path, port: int, duration_s: int) -> tuple[list[list[dict]], dict]:
    """A cubic flow of ``duration_s`` from the sender to the receiver while the emulator samples its data port's
    qdiscs; ``(samples, iperf3 report)``, each sample the port's qdiscs as ``tc -j`` lists them."""
    serve_once(testbed, port, tmp_path)
    n = int((duration_s + 5) / SAMPLE_EVERY_S)
    out = tmp_path / "qdisc-samples.jsonl"
    with emu.host.private_dir("qdiscs") as tmp:
        stop = f"{tmp}/stop"
        stream = emu.host.stream(["sh", "-c", SAMPLER, "sampler", str(n), emu.ports[1], stop], out)
        try:
            t0 = time.monotonic()
            report = client_report(testbed, port, duration_s, "-C", "cubic")
            flow_s = time.monotonic() - t0
            emu.host.run(["touch", stop], timeout=30)
            code = stream.wait(timeout_s=60)
        finally:
            stream.close()
    assert code == 0, out.read_text()[-500:]
    samples = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("[")]
    print(f"{len(samples)} samples of the qdiscs over a flow of {flow_s:.1f} s")
    assert len(samples) >= MIN_SAMPLES, f"only {len(samples)} samples"
    assert report["end"]["sender_tcp_congestion"] == "cubic"
    return samples, report


def _of(sample: list[dict], kind: str) -> dict:
    return next(q for q in sample if q.get("kind") == kind)


def test_under_the_authors_tree_the_backlog_exceeds_tbfs_limit(testbed, emulator, tmp_path):
    link = Link(rtt_ms=RTT_MS, rate_mbit=RATE_MBIT, buffer_bdp=None, buffer_bytes=ASKED_BYTES, queue="authors")
    readback = linkmod.set(emulator.host, emulator.ports, link)
    tbf, netem = (_of(readback[emulator.ports[1]], k) for k in ("tbf", "netem"))
    assert tbf.get("root") and netem["parent"] == "bb:1"
    assert tbf["options"]["limit"] == ASKED_BYTES and netem["options"]["limit"] == 100_000  # configured, both
    queue = linkcount.effective_queue(readback, emulator.ports, link)
    assert (queue.in_force.limit_in_force, queue.in_force.queue_packets) == ("netem", 100_000)
    before = linkcount.counters(linkmod.show(emulator.host, emulator.ports), emulator.ports)

    samples, report = _cubic_flow_sampled(testbed, emulator, tmp_path, 5321, duration_s=10)

    peak = max(max(_of(s, "tbf").get("backlog", 0), _of(s, "netem").get("backlog", 0)) for s in samples)
    after = linkcount.counters(linkmod.show(emulator.host, emulator.ports), emulator.ports)
    drops = after.minus(before).data
    print(f"authors' tree: peak backlog {peak} B against tbf's limit {ASKED_BYTES} B (+ {DELAY_LINE_BYTES} B in the "
          f"delay line); drops {drops}; {received_mbit(report):.2f} Mbit/s received")
    assert peak > 2 * (ASKED_BYTES + DELAY_LINE_BYTES)  # tbf's limit is not in force
    assert drops["tbf"].drops == 0 and drops["netem"].drops == 0  # nothing reached netem's 100000 packets


@pytest.mark.slow
def test_bbrlabs_tree_enforces_its_limit(testbed, emulator, tmp_path):
    """In make test-slow (25 s, a flow of 8 s): the contrast to the authors' tree above. make test covers
    bbrlab's own tree (netem -> tbf) holding its queue to tbf's limit on the emulator's kernel, sampled while a
    cubic flow overflows it (backlog at most the limit plus one aggregate, tbf's drops rising), in
    test_bottleneck_testbed.py::test_a_cubic_run_fills_the_sampled_queue_and_records_both_clocks; which
    qdisc's limit is in force, read from the kernel's tree: tests/unit/scenario/test_buffer_floor.py."""
    link = Link(rtt_ms=RTT_MS, rate_mbit=RATE_MBIT, buffer_bdp=None, buffer_bytes=ASKED_BYTES)
    readback = linkmod.set(emulator.host, emulator.ports, link)
    assert linkcount.effective_queue(readback, emulator.ports, link).in_force.limit_in_force == "tbf"
    before = linkcount.counters(linkmod.show(emulator.host, emulator.ports), emulator.ports)

    samples, report = _cubic_flow_sampled(testbed, emulator, tmp_path, 5322, duration_s=8)

    peak = max(_of(s, "tbf").get("backlog", 0) for s in samples)
    after = linkcount.counters(linkmod.show(emulator.host, emulator.ports), emulator.ports)
    delta = after.minus(before).data
    print(f"bbrlab's tree: peak tbf backlog {peak} B, limit {ASKED_BYTES} B; tbf drops {delta['tbf'].drops}, "
          f"netem's own {delta['netem'].drops - delta['tbf'].drops}; {received_mbit(report):.2f} Mbit/s")
    assert peak <= ASKED_BYTES  # sampled every 0.2 s: a 4-frame queue at 10 Mbit/s drains in 5 ms, so often 0
    assert delta["tbf"].drops > 0  # the queue overflowed: it is the bottleneck buffer
    assert delta["netem"].drops == delta["tbf"].drops  # netem itself dropped nothing


def test_the_authors_offloads_are_set_and_read_back_on_the_emulator(emulator):
    link = Link(rtt_ms=RTT_MS, rate_mbit=RATE_MBIT, queue="authors", emulator_offloads="on")
    applied = linkmod.apply(emulator.host, emulator.ports, link)
    assert applied.offloads.to_dict() == {"asked": "on", "ports": {p: {"tso": "on", "gso": "on", "gro": "on"}
                                                                  for p in emulator.ports}}
    back = linkmod.apply(emulator.host, emulator.ports, Link(rtt_ms=RTT_MS, rate_mbit=RATE_MBIT))
    assert all(set(f.values()) == {"off"} for f in back.offloads.ports.values())
