"""``bbrlab link set|show|clear|validate``: the emulated bottleneck on the emulator's bridge ports.

The emulator's sender-side port delays ACKs; its receiver-side port delays data (netem, with loss
and jitter) and limits the rate with a token bucket whose queue is the buffer (tbf). `--queue authors`
builds the paper authors' tree instead (tbf at the root with netem below it, on both ports): tbf's limit
is then not in force and netem's 100000 packets are the queue (docs/link.md). Every value is checked
before the emulator is touched, and `set` reads the qdiscs (and the ports' offloads) back from the kernel
and fails if they differ from the request; it prints which queue limit is in force.

examples:
  bbrlab link set --rtt 20ms --rate 50mbit --buffer 1bdp
  bbrlab link set --rtt 40ms --rate 100mbit --loss 0.1% --delay-split forward
  bbrlab link set --rtt 20ms --rate 50mbit --loss-model gemodel --ge-p 1% --ge-r 25%
  bbrlab link set --rtt 20ms --rate 100mbit --queue authors --emulator-offloads on
  bbrlab link show --json
  bbrlab link validate --json          measures the link that is set (ping, UDP, TCP)
  bbrlab link clear
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from bbrlab.core.errors import ValidationError
from bbrlab.core.units import parse_buffer, parse_percent, parse_rate_mbit, parse_size_bytes, parse_time_ms
from bbrlab.scenario.link import EMULATOR_OFFLOADS
from bbrlab.scenario.linksizing import QUEUE_MODES
from bbrlab.testbed.driving import driving

from .common import add_force_option, add_testbed_option, load_testbed, refuse_if_busy, testbed_arg

if TYPE_CHECKING:
    from bbrlab.link.counters import QueueHeld

LINK_FLAGS = ("rtt", "rate")


def _link_args(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("link" if required else "link (give --rtt and --rate to set it before validating)")
    g.add_argument("--rtt", required=required, help="round-trip time, e.g. 20ms (negative values: --rtt=-5ms)")
    g.add_argument("--rate", required=required, help="bottleneck rate, e.g. 50mbit, 1gbit")
    g.add_argument("--buffer", default="1bdp", help="bottleneck queue: 1bdp, 0.5bdp or bytes such as 256k (default 1bdp)")
    g.add_argument("--loss", default=None, help="uniform random loss on the data direction, e.g. 1%%")
    g.add_argument("--loss-model", choices=("none", "uniform", "gemodel"), default=None,
                   help="none, uniform (default when --loss is given) or gemodel (Gilbert-Elliott)")
    g.add_argument("--ge-p", default="0", help="gemodel: good -> bad transition chance, e.g. 1%%")
    g.add_argument("--ge-r", default="100", help="gemodel: bad -> good transition chance (default 100%%)")
    g.add_argument("--ge-h", default="0", help="gemodel: chance to deliver in the bad state (default 0%%)")
    g.add_argument("--ge-k", default="100", help="gemodel: chance to deliver in the good state (default 100%%)")
    g.add_argument("--loss-seed", type=int, default=None, help="seed netem's loss generator (needs netem with seed)")
    g.add_argument("--jitter", default="0ms", help="delay jitter on the data direction, e.g. 1ms (reorders packets)")
    g.add_argument("--delay-split", choices=("symmetric", "forward"), default="symmetric",
                   help="symmetric: RTT/2 each way (default); forward: the whole RTT on the data direction")
    g.add_argument("--mtu", default="1500", help="IP MTU of the path in bytes (default 1500)")
    g.add_argument("--queue", choices=QUEUE_MODES, default="bbrlab",
                   help="bbrlab: netem -> tbf, tbf's limit (--buffer) is the queue (default); authors: tbf -> netem "
                        "as the paper authors built it, netem's 100000 packets are the queue")
    g.add_argument("--emulator-offloads", choices=EMULATOR_OFFLOADS, default="off",
                   help="TSO, GSO and GRO on the emulator's ports: off (default) or on (as the authors had them)")


def _common(p: argparse.ArgumentParser) -> None:
    add_testbed_option(p)


def register(sub) -> None:
    """Add ``bbrlab link`` (verbs set, show, clear, validate) to the subparsers ``sub``."""
    p = sub.add_parser("link", help="the emulated bottleneck (netem + token bucket): set, show, clear, validate",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    s = verbs.add_parser("set", help="put delay, rate, buffer and loss on the emulator's ports and read them back")
    _link_args(s, required=True)
    _common(s)
    s.add_argument("--json", action="store_true", help="print the read-back as JSON: {qdiscs, bottleneck (the queue "
                   "in force), emulator_offloads}")
    s.set_defaults(func=run_set)

    sh = verbs.add_parser("show", help="the emulator ports' qdiscs as the kernel reports them")
    _common(sh)
    add_force_option(sh)
    sh.add_argument("--json", action="store_true", help="machine-readable output")
    sh.set_defaults(func=run_show)

    c = verbs.add_parser("clear", help="remove bbrlab's qdiscs; the ports get the kernel's defaults back")
    _common(c)
    c.set_defaults(func=run_clear)

    v = verbs.add_parser("validate", help="measure RTT (ping), UDP and TCP goodput against the configured link")
    _link_args(v, required=False)
    _common(v)
    v.add_argument("--pings", type=int, default=200, help="echo requests, 10 ms apart (default 200)")
    v.add_argument("--udp-seconds", type=float, default=5.0, help="UDP run length (default 5)")
    v.add_argument("--tcp-seconds", type=float, default=5.0, help="TCP run length (default 5)")
    v.add_argument("--loss-packets", type=int, default=10_000, help="datagrams for the loss count (default 10000)")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=run_validate)


def link_from_args(args: argparse.Namespace):
    """A validated :class:`~bbrlab.scenario.scenario.Link` from the flags (raises before anything is touched)."""
    from bbrlab.scenario.linksizing import BufferBelowMinimum

    buffer_bdp, buffer_bytes = parse_buffer(args.buffer, "--buffer")
    loss_pct = parse_percent(args.loss, "--loss") if args.loss is not None else 0.0
    model = args.loss_model or ("uniform" if args.loss is not None else "none")
    try:
        return _link(args, buffer_bdp, buffer_bytes, loss_pct, model)
    except ValidationError as e:  # a buffer out of range: the flag the user typed, with what its --rate x --rtt allow
        if isinstance(e, BufferBelowMinimum) or e.field in ("link.buffer_bdp", "link.buffer_bytes"):
            raise ValidationError("--buffer", args.buffer, e.allowed) from None
        raise


def _link(args: argparse.Namespace, buffer_bdp, buffer_bytes, loss_pct: float, model: str):
    from bbrlab.scenario.scenario import Link

    return Link(
        rtt_ms=parse_time_ms(args.rtt, "--rtt"),
        rate_mbit=parse_rate_mbit(args.rate, "--rate"),
        buffer_bdp=buffer_bdp,
        buffer_bytes=buffer_bytes,
        loss_model=model,
        loss_pct=loss_pct,
        ge_p_pct=parse_percent(args.ge_p, "--ge-p"),
        ge_r_pct=parse_percent(args.ge_r, "--ge-r"),
        ge_h_pct=parse_percent(args.ge_h, "--ge-h"),
        ge_k_pct=parse_percent(args.ge_k, "--ge-k"),
        loss_seed=args.loss_seed,
        jitter_ms=parse_time_ms(args.jitter, "--jitter"),
        delay_split=args.delay_split,
        mtu_bytes=parse_size_bytes(args.mtu, "--mtu"),
        queue=args.queue,
        emulator_offloads=args.emulator_offloads,
    )


def describe(qdisc: dict) -> str:
    """One line for a qdisc of the read-back, in the units bbrlab uses."""
    o = qdisc.get("options") or {}
    where = "root" if qdisc.get("root") else f"parent {qdisc.get('parent')}"
    text = f"{qdisc.get('kind')} {qdisc.get('handle')} ({where})"
    if qdisc.get("kind") == "netem":
        d = o.get("delay") or {}
        text += f" delay {d.get('delay', 0) * 1e3:g} ms"
        if d.get("jitter"):
            text += f" jitter {d['jitter'] * 1e3:g} ms"
        if o.get("loss-random"):
            text += f" loss {o['loss-random']['loss'] * 100:g} %"
        if o.get("loss-gemodel"):
            text += f" loss gemodel {o['loss-gemodel']}"
        text += f" limit {o.get('limit')} packets"
    elif qdisc.get("kind") == "tbf":
        text += f" rate {o.get('rate', 0) * 8 / 1e6:g} Mbit/s burst {o.get('burst')} B limit {o.get('limit')} B"
    if "drops" in qdisc:
        text += f"  [sent {qdisc.get('packets')} pkts, dropped {qdisc.get('drops')}]"
    return text


def _print_ports(readbacks: dict, ports: tuple[str, str]) -> None:
    role = {ports[0]: "sender side, ACKs", ports[1]: "receiver side, data"}
    for ifname, qdiscs in readbacks.items():
        print(f"{ifname} ({role.get(ifname, '?')}):")
        for q in qdiscs:
            print(f"  {describe(q)}")


def queue_line(queue: QueueHeld, link) -> str:
    """The bottleneck queue in force, in words (``queue`` from :func:`bbrlab.link.counters.effective_queue`)."""
    in_force = queue.in_force
    limit = in_force.limit_in_force if in_force is not None else ("tbf" if queue.queue_bytes is not None else None)
    if limit is None:
        return "no bottleneck queue (no token bucket)"
    if limit == "netem":
        return (f"queue in force: netem's {in_force.queue_packets} packets = about {queue.queue_bytes} B at "
                f"full-size frames = {queue.queue_bdp} BDP (BDP {link.bdp_bytes} B); tbf's limit "
                f"{in_force.tbf_limit_bytes} B is NOT in force (authors' tree)")
    return f"queue in force: tbf's limit {queue.queue_bytes} B = {queue.queue_bdp} BDP (BDP {link.bdp_bytes} B)"


def run_set(args) -> int:
    """``bbrlab link set``: validate the link given by the flags, put it on the emulator's ports (qdiscs and
    offloads) while holding the testbed's lock, and print the kernel's read-back: the qdiscs, which queue limit
    is in force, and the ports' offloads; returns 0."""
    from bbrlab.link import emulator as linkmod
    from bbrlab.link.counters import effective_queue

    link = link_from_args(args)  # validated before the testbed is even looked up
    with driving(testbed_arg(args), "link set", rtt_ms=link.rtt_ms, rate_mbit=link.rate_mbit) as tb:
        applied = linkmod.apply(tb.emulator.host, tb.emulator.ports, link)
    readbacks = applied.qdiscs
    queue = effective_queue(readbacks, tb.emulator.ports, link)  # as the kernel holds it
    if args.json:
        print(json.dumps({"qdiscs": readbacks, "bottleneck": queue.to_dict(),
                          "emulator_offloads": applied.offloads.to_dict()}, indent=2))
    else:
        print(f"link set on {tb.emulator.host.name}: RTT {link.rtt_ms:g} ms, {link.rate_mbit:g} Mbit/s, "
              f"{queue_line(queue, link)}, loss {link.effective_loss_pct:g} %")
        _print_ports(readbacks, tb.emulator.ports)
        print("offloads (tso gso gro): " + ", ".join(f"{port} {' '.join(f.values())}"
                                                   for port, f in applied.offloads.ports.items()))
    return 0


def run_show(args) -> int:
    """``bbrlab link show``: print the qdiscs of the emulator's ports as the kernel reports them (refused
    while another process holds the testbed, unless ``--force``); returns 0."""
    from bbrlab.link import emulator as linkmod

    tb = load_testbed(args)
    refuse_if_busy(tb.name, args.force, "read the emulator's qdiscs")
    readbacks = linkmod.show(tb.emulator.host, tb.emulator.ports)
    if args.json:
        print(json.dumps(readbacks, indent=2))
    else:
        _print_ports(readbacks, tb.emulator.ports)
    return 0


def run_clear(args) -> int:
    """``bbrlab link clear``: remove bbrlab's qdiscs from the emulator's ports and print each port's root
    qdisc now; returns 0."""
    from bbrlab.link import emulator as linkmod

    with driving(testbed_arg(args), "link clear") as tb:
        after = linkmod.clear(tb.emulator.host, tb.emulator.ports)
    print(f"cleared {', '.join(after)} on {tb.emulator.host.name}; roots now: "
          + ", ".join(f"{i}={linkmod.root_qdisc(q).get('kind') if linkmod.root_qdisc(q) else 'none'}"
                      for i, q in after.items()))
    return 0


def _configured_link(args, tb):
    """The link to validate: from the flags (then it is set first), or as the emulator holds it now."""
    from bbrlab.link import emulator as linkmod
    from bbrlab.scenario.scenario import Link

    given = [f for f in LINK_FLAGS if getattr(args, f) is not None]
    if given and len(given) != len(LINK_FLAGS):
        raise ValidationError("--rtt/--rate", given, "both --rtt and --rate (to set the link), or neither")
    if given:
        return link_from_args(args), True
    now = linkmod.configured_from_readback(linkmod.show(tb.emulator.host, tb.emulator.ports), tb.emulator.ports)
    return Link(rtt_ms=now["rtt_ms"], rate_mbit=now["rate_mbit"], buffer_bdp=None, buffer_bytes=now["queue_bytes"],
                loss_model="uniform" if now["loss_pct"] else "none", loss_pct=now["loss_pct"],
                queue=now["queue"] or "bbrlab"), False


def run_validate(args) -> int:
    """``bbrlab link validate``: set the link first when ``--rtt`` and ``--rate`` are given (else take it as
    the emulator holds it), measure RTT, UDP and TCP against it and print each check. Returns 0 when every
    check is ok, else 1."""
    from bbrlab.link import emulator as linkmod
    from bbrlab.run.linkcheck import validate as validate_link

    if args.rtt is not None and args.rate is not None:
        link_from_args(args)  # bad values fail before the testbed is looked up
    with driving(testbed_arg(args), "link validate") as tb:
        link, to_set = _configured_link(args, tb)
        if to_set:
            linkmod.set(tb.emulator.host, tb.emulator.ports, link)
        report = validate_link(tb, link, pings=args.pings, udp_s=args.udp_seconds, tcp_s=args.tcp_seconds,
                                  loss_packets=args.loss_packets)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, entry in report.items():
            extra = {k: v for k, v in entry.items() if k not in ("configured", "measured", "ok")}
            print(f"{name:<9} configured {entry['configured']:<8g} measured {entry['measured']:<10g} "
                  f"{'ok' if entry['ok'] else 'OFF'}  {extra}")
    return 0 if all(e["ok"] for e in report.values()) else 1
