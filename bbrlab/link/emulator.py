"""The emulated link on the emulator's bridge ports: set, read back, check, clear.

``apply(host, ports, link)`` builds the qdisc tree of :mod:`bbrlab.link.qdisc` on the two ports, reads back
what the kernel reports (``tc -raw -j -s qdisc show``, JSON, no text parsing) and raises if the kernel
did not take what was asked. The read-back is what a run stores. It also sets the ports' offloads as the
link asks (:mod:`bbrlab.link.offloads`) and reads them back; it returns both (:class:`Applied`), and
``set(host, ports, link)`` the qdiscs' read-back alone. Which tree and queue limit are in force is read from
the read-back by :mod:`bbrlab.link.bottleneck` (:func:`bbrlab.link.counters.effective_queue` keeps it in a
run record); what one run did to the link is counted by :mod:`bbrlab.link.counters`.

Where the emulator host is this machine (``LocalHost``/``NetnsHost``) the tree goes in with pyroute2;
on any other host (the emulator VM over SSH) with ``tc`` through :meth:`Host.run`. Both are renderings
of the same tree.

Order of events in :func:`apply`: everything that can be checked without changing the host is checked
first (the link and port names, that the ports exist and carry no foreign root qdisc, that the host
kernel has every qdisc the tree needs); only then are qdiscs changed. If anything fails after that,
the ports are cleared again before the error propagates.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bbrlab.core.commands import CommandError
from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.scenario.scenario import Link
from bbrlab.testbed import hostlock

from . import offloads
from .bottleneck import Readback, configured_from_readback, queue_mode_of  # noqa: F401 - the link's API
from .offloads import Offloads
from .qdisc import (
    ROOT_HANDLE,
    LinkTree,
    Netem,
    PortTree,
    QdiscNode,
    Tbf,
    UnsupportedByRenderer,
    apply_pyroute2,
    build_tree,
    clear_argv,
    clear_pyroute2,
    to_tc_argv,
)

#: What read-back may differ from the request by: the kernel stores times in 64 ns ticks and tc
#: prints microseconds; tbf's burst is stored as a time at the configured rate.
DELAY_TOLERANCE_US = 2.0
BURST_TOLERANCE_US = 2.0
PCT_TOLERANCE = 1e-6

#: Probes for :func:`host_supports`: the qdisc (tc arguments after ``root handle 1:``) tried on the
#: loopback device of a throw-away network namespace.
_PROBES = {
    "tbf": ["tbf", "rate", "1mbit", "burst", "5000", "limit", "10000"],
    "netem": ["netem", "delay", "1ms"],
    "netem-seed": ["netem", "loss", "random", "1%", "seed", "7"],
}
#: A constant script: the probe's arguments arrive as "$@", never pasted into the script text.
_PROBE_SCRIPT = 'tc qdisc add dev lo root handle 1: "$@" && exec tc -raw -j qdisc show dev lo'


class LinkMismatch(TestbedError):
    """The kernel reports qdiscs different from the ones requested."""


# -- read-back ----------------------------------------------------------------------------------------
def readback(host: Host, ifname: str) -> list[dict]:
    """The qdiscs of ``ifname`` as the kernel reports them (``tc -raw -j -s qdisc show dev IF``)."""
    try:
        out = host.output(["tc", "-raw", "-j", "-s", "qdisc", "show", "dev", ifname])
    except CommandError as e:
        raise TestbedError(f"cannot read the qdiscs of {ifname} on {host.name}: {e}") from e
    return json.loads(out) if out else []


def show(host: Host, ports: Sequence[str]) -> Readback:
    """``{ifname: [qdisc, ...]}`` for each port, as the kernel reports them, in ONE ``tc`` command.

    ``tc -j qdisc show`` without ``dev`` tags every qdisc with its ``dev``; grouped by it (and the tag
    dropped) each list is what :func:`readback` gives for that port. Every SSH call is slow in a TCG guest,
    and this runs after every run. A port missing from the output is read on its own (which says clearly
    when it does not exist).
    """
    try:
        out = host.output(["tc", "-raw", "-j", "-s", "qdisc", "show"])
    except CommandError as e:
        raise TestbedError(f"cannot read the qdiscs on {host.name}: {e}") from e
    grouped: dict[str, list[dict]] = {}
    for qdisc in json.loads(out) if out else []:
        grouped.setdefault(qdisc.pop("dev", None), []).append(qdisc)
    return {ifname: grouped[ifname] if ifname in grouped else readback(host, ifname) for ifname in ports}


def root_qdisc(qdiscs: list[dict]) -> dict | None:
    """The root qdisc of one port's read-back (None when the port has none listed)."""
    return next((q for q in qdiscs if q.get("root")), None)


def is_default(qdisc: dict | None) -> bool:
    """The kernel's own root qdisc (handle 0:), which deleting the root brings back."""
    return qdisc is None or qdisc.get("handle") == "0:"


def is_ours(qdisc: dict | None) -> bool:
    """bbrlab's root qdisc (its handle), as :func:`apply` puts it on a port."""
    return qdisc is not None and qdisc.get("handle") == ROOT_HANDLE


# -- probing what a host's kernel can do --------------------------------------------------------------
def host_supports(host: Host, kind: str) -> bool:
    """Whether ``host``'s kernel (and tc) take qdisc ``kind`` (``tbf``, ``netem``, ``netem-seed``).

    Tried for real on the loopback device of a throw-away network namespace (``unshare -n``), so no
    interface of the host is touched. ``netem-seed`` also needs the seed to come back in the read-back:
    a kernel that silently ignores the attribute does not count.
    """
    if kind not in _PROBES:
        raise ValidationError("kind", kind, f"one of {', '.join(sorted(_PROBES))}")
    argv = ["unshare", "-n", "sh", "-c", _PROBE_SCRIPT, "probe", *_PROBES[kind]]
    res = host.run(argv, check=False, timeout=30)
    if not res.ok:
        return False
    if kind != "netem-seed":
        return True
    qdiscs = json.loads(res.stdout or "[]")
    return any("seed" in (q.get("options") or {}) for q in qdiscs)


def check_host_can_run(host: Host, tree: LinkTree, known: set[str] | None = None) -> None:
    """Refuse, before anything changes, a tree the host's kernel cannot build. ``known``: the kinds this host's
    kernel was already seen to take (not probed again, each probe is a command on the host); the kinds it takes
    now are added to it."""
    known = builtins.set() if known is None else known  # (this module's own set() puts a link on ports)
    for kind in sorted(tree.kinds):
        if kind in known:
            continue
        if host_supports(host, kind):
            known.add(kind)
        else:
            where = ("the emulator VM runs netem (e.g. bbrlab link set --testbed local); this host's kernel "
                     "was built without sch_netem" if kind == "netem" else f"install a kernel with sch_{kind}")
            raise TestbedError(f"no {kind} on {host.name}: {where}. Nothing was changed.")
    seeds = [n.qdisc.seed for p in tree.ports for n in p.nodes if isinstance(n.qdisc, Netem) and n.qdisc.seed is not None]
    if seeds and "netem-seed" not in known and host_supports(host, "netem-seed"):
        known.add("netem-seed")
    if seeds and "netem-seed" not in known:
        raise ValidationError("link.loss_seed", seeds[0],
                              f"unset: netem on {host.name} cannot take a seed (needs Linux and iproute2 "
                              "6.6 or later); nothing was changed")


def owner_note(host: Host) -> str:
    """The name of the note on ``host`` saying which session set bbrlab's qdiscs there (one per network
    namespace: ports are named per namespace)."""
    return f"link-{_local_netns(host) or 'host'}.owner"


def check_ports_free(host: Host, ports: Sequence[str]) -> Readback:
    """Each port exists and its root qdisc is the kernel default or bbrlab's, and bbrlab's is not another
    campaign's: one whose note (:func:`mark_ports`) names another session that still holds the host
    (:mod:`bbrlab.testbed.hostlock`) is refused, naming that campaign. Returns the read-back."""
    before = show(host, ports)
    for ifname, qdiscs in before.items():
        root = root_qdisc(qdiscs)
        if not (is_default(root) or is_ours(root)):
            raise TestbedError(
                f"{ifname} on {host.name} has a root qdisc {root.get('kind')} {root.get('handle')} that bbrlab did "
                f"not set; remove it first (tc qdisc del dev {ifname} root). Nothing was changed.")
    _refuse_another_campaigns(host, ports, before)
    return before


def _refuse_another_campaigns(host: Host, ports: Sequence[str], readbacks: Readback) -> None:
    """Raise when bbrlab's qdiscs on ``ports`` were set by another session that still holds ``host``."""
    if not any(is_ours(root_qdisc(q)) for q in readbacks.values()):
        return
    note, live = hostlock.mark_of(host, owner_note(host))
    if live:
        raise TestbedError(
            f"the qdiscs on {', '.join(ports)} of {host.name} belong to another campaign that still holds that "
            f"host: {hostlock.describe(note)}. Nothing was changed.")


def mark_ports(host: Host, ports: Sequence[str]) -> None:
    """Note on ``host`` that this session sets bbrlab's qdiscs on ``ports`` (before it does)."""
    hostlock.mark(host, owner_note(host), {"ports": list(ports)})


# -- comparing read-back with the request -------------------------------------------------------------
def _close(got: float | None, want: float, tol: float) -> bool:
    return got is not None and math.isclose(got, want, abs_tol=tol, rel_tol=0)


def _netem_diffs(where: str, n: Netem, opts: dict) -> list[str]:
    diffs = []
    delay = opts.get("delay") or {}
    got_delay_us = delay.get("delay", 0.0) * 1e6
    got_jitter_us = delay.get("jitter", 0.0) * 1e6
    if not _close(got_delay_us, n.delay_us, DELAY_TOLERANCE_US):
        diffs.append(f"{where} delay {got_delay_us:.0f} us, asked {n.delay_us} us")
    if not _close(got_jitter_us, n.jitter_us, DELAY_TOLERANCE_US):
        diffs.append(f"{where} jitter {got_jitter_us:.0f} us, asked {n.jitter_us} us")
    if opts.get("limit") != n.limit_packets:
        diffs.append(f"{where} limit {opts.get('limit')} packets, asked {n.limit_packets}")
    uniform = n.loss.pct / 100 if n.loss and n.loss.model == "uniform" else 0.0
    got_uniform = (opts.get("loss-random") or {}).get("loss", 0.0)
    if not _close(got_uniform, uniform, PCT_TOLERANCE):
        diffs.append(f"{where} loss {got_uniform:.6f}, asked {uniform:.6f}")
    ge = opts.get("loss-gemodel")
    if n.loss and n.loss.model == "gemodel":
        want = {"p": n.loss.p_pct, "r": n.loss.r_pct, "1-h": n.loss.one_minus_h_pct, "1-k": n.loss.one_minus_k_pct}
        for key, pct in want.items():
            if not _close((ge or {}).get(key), pct / 100, PCT_TOLERANCE):
                diffs.append(f"{where} gemodel {key} {(ge or {}).get(key)}, asked {pct / 100}")
    elif ge:
        diffs.append(f"{where} has gemodel loss {ge}, none asked")
    if n.seed is not None and opts.get("seed") != n.seed:
        diffs.append(f"{where} seed {opts.get('seed')}, asked {n.seed}")
    return diffs


def _tbf_diffs(where: str, t: Tbf, opts: dict) -> list[str]:
    diffs = []
    if not _close(opts.get("rate"), t.rate_bytes_per_s, 1):
        diffs.append(f"{where} rate {opts.get('rate')} B/s, asked {t.rate_bytes_per_s}")
    burst_tol = max(t.rate_bytes_per_s * BURST_TOLERANCE_US / 1e6, 16)
    if not _close(opts.get("burst"), t.burst_bytes, burst_tol):
        diffs.append(f"{where} burst {opts.get('burst')} B, asked {t.burst_bytes}")
    if opts.get("limit") != t.limit_bytes:
        diffs.append(f"{where} limit {opts.get('limit')} B, asked {t.limit_bytes}")
    return diffs


def _node_diffs(ifname: str, node: QdiscNode, qdiscs: list[dict]) -> list[str]:
    where = f"{ifname} {node.kind} {node.handle}"
    got = next((q for q in qdiscs if q.get("handle") == node.handle), None)
    if got is None:
        return [f"{where} missing"]
    if got.get("kind") != node.kind:
        return [f"{where} is a {got.get('kind')}"]
    placed = "root" if got.get("root") else got.get("parent")
    if placed != node.parent:
        return [f"{where} hangs at {placed}, asked {node.parent}"]
    opts = got.get("options") or {}
    return _netem_diffs(where, node.qdisc, opts) if isinstance(node.qdisc, Netem) else _tbf_diffs(where, node.qdisc, opts)


def diff_port(spec: PortTree, qdiscs: list[dict]) -> list[str]:
    """Every way the kernel's qdiscs on one port differ from ``spec`` (empty: it took what was asked)."""
    if not spec.nodes:
        root = root_qdisc(qdiscs)
        return [] if is_default(root) else [f"{spec.ifname} should carry no bbrlab qdisc, has {root}"]
    diffs = [d for node in spec.nodes for d in _node_diffs(spec.ifname, node, qdiscs)]
    asked = {n.handle for n in spec.nodes}
    extra = [q.get("handle") for q in qdiscs if q.get("handle") not in asked | {"0:"}]
    if extra:
        diffs.append(f"{spec.ifname} has qdiscs not asked for: {extra}")
    return diffs


def check_readback(tree: LinkTree, readbacks: Readback) -> None:
    """Raise :class:`LinkMismatch` unless every port carries exactly what ``tree`` asks for."""
    diffs = [d for p in tree.ports for d in diff_port(p, readbacks.get(p.ifname, []))]
    if diffs:
        raise LinkMismatch("the kernel did not take the requested qdiscs: " + "; ".join(diffs))


# -- changing the ports --------------------------------------------------------------------------------
def _local_netns(host: Host) -> str | None:
    return getattr(host, "netns", None) or None


def _apply_port(host: Host, spec: PortTree) -> None:
    """One port, through pyroute2 on this machine or tc elsewhere (tc also locally for what pyroute2 lacks)."""
    if host.is_local:
        try:
            apply_pyroute2(spec, netns=_local_netns(host))
            return
        except UnsupportedByRenderer:
            pass  # e.g. gemodel loss: the same tree, rendered for tc instead
    for argv in to_tc_argv(spec):
        host.run(argv)


def _clear_port(host: Host, ifname: str) -> None:
    """Remove bbrlab's root qdisc from ``ifname`` if it is there; anything else is left alone."""
    if not is_ours(root_qdisc(readback(host, ifname))):
        return
    if host.is_local:
        clear_pyroute2(ifname, netns=_local_netns(host))
    else:
        host.run(clear_argv(ifname))


#: A constant script running its arguments as commands separated by ``;`` arguments, stopping at the first that
#: fails (named on stderr): several ``tc`` commands in one round trip, their arguments never pasted into a script.
_BATCH_SCRIPT = ('cmd=(); run() { [ ${#cmd[@]} -eq 0 ] && return 0; "${cmd[@]}" && cmd=() && return 0; rc=$?; '
                 'echo "bbrlab: failed (exit $rc): ${cmd[*]}" >&2; exit $rc; }; '
                 'for a in "$@"; do if [ "$a" = ";" ]; then run; else cmd+=("$a"); fi; done; run')


def run_batch(host: Host, argvs: Sequence[Sequence[str]]) -> None:
    """Run ``argvs`` on ``host`` one after the other in ONE command (one SSH round trip, slow in a TCG guest),
    stopping at the first that fails (raises :class:`CommandError`)."""
    args: list[str] = []
    for argv in argvs:
        if ";" in argv:
            raise ValidationError("argv", list(argv), "no bare ';' argument (it separates the batch's commands)")
        args += [*argv, ";"]
    if args:
        host.run(["bash", "-c", _BATCH_SCRIPT, "bbrlab-batch", *args])


def _rebuild_ports(host: Host, tree: LinkTree, before: Readback) -> None:
    """Each port of ``tree`` cleared of bbrlab's root qdisc (as ``before`` read it) and built anew: locally
    through pyroute2 port by port, elsewhere in one batch of ``tc`` commands."""
    if host.is_local:
        for spec in tree.ports:
            _clear_port(host, spec.ifname)
            _apply_port(host, spec)
        return
    argvs: list[list[str]] = []
    for spec in tree.ports:
        if is_ours(root_qdisc(before.get(spec.ifname, []))):
            argvs.append(clear_argv(spec.ifname))
        argvs += to_tc_argv(spec)
    run_batch(host, argvs)


def clear(host: Host, ports: Sequence[str]) -> Readback:
    """Remove bbrlab's qdiscs from ``ports``; the kernel's defaults come back. Returns the read-back,
    and raises if a port still carries a non-default root qdisc afterwards, or (before any change) when
    they are another live campaign's (:func:`check_ports_free`)."""
    _refuse_another_campaigns(host, ports, show(host, ports))
    for ifname in ports:
        _clear_port(host, ifname)
    after = show(host, ports)
    left = {i: root_qdisc(q) for i, q in after.items() if not is_default(root_qdisc(q))}
    if left:
        raise TestbedError(f"after clear, ports still carry qdiscs: {left}")
    hostlock.unmark(host, owner_note(host))
    return after


@dataclass(frozen=True)
class Applied:
    """What :func:`apply` read back: the ports' qdiscs and their offloads
    (:func:`bbrlab.link.offloads.apply`'s :class:`~bbrlab.link.offloads.Offloads`)."""

    qdiscs: Readback
    offloads: Offloads


def apply(host: Host, ports: Sequence[str], link: Link, *, known: set[str] | None = None) -> Applied:
    """Put ``link`` on the emulator ``ports = (sender_side, receiver_side)``: its qdiscs and its offloads;
    return both as the kernel reports them.

    Raises before any change for a bad link, unknown/foreign ports, or a kernel missing a qdisc
    (``TestbedError`` naming netem and the emulator VM when the host has no netem). Raises
    :class:`LinkMismatch` (after clearing the qdiscs) if the kernel reports qdiscs other than asked, and
    :class:`~bbrlab.link.offloads.OffloadMismatch` if a port did not take the offloads. ``known``: the qdisc
    kinds the host was already seen to take (:func:`check_host_can_run`).
    """
    if not isinstance(link, Link):
        raise ValidationError("link", link, "a bbrlab.scenario.scenario.Link")
    tree = build_tree(link, tuple(ports))
    names = [p.ifname for p in tree.ports]
    before = check_ports_free(host, names)
    check_host_can_run(host, tree, known)
    mark_ports(host, names)
    try:
        taken = offloads.apply(host, names, link.emulator_offloads)
        _rebuild_ports(host, tree, before)
        after = show(host, names)
        check_readback(tree, after)
    except BaseException:
        _restore(host, names)
        raise
    return Applied(after, taken)


def set(host: Host, ports: Sequence[str], link: Link) -> Readback:
    """Put ``link`` on the emulator ``ports = (sender_side, receiver_side)``; return the kernel's read-back of
    the qdiscs (:func:`apply` says what it checks and raises, and also returns the offloads)."""
    return apply(host, ports, link).qdiscs


def _restore(host: Host, names: list[str]) -> None:
    """Best effort after a failure: take bbrlab's qdiscs off again; the original error is what matters."""
    for ifname in names:
        try:
            _clear_port(host, ifname)
        except Exception:  # keep restoring the other ports
            pass


# -- the link of a campaign: set once, kept while it does not change (counted per run: bbrlab.link.counters) --
class EmulatorLink:
    """The emulated link of one campaign on an emulator: knows what it set.

    :meth:`holding` sets ``link`` only when it differs from what this object set last (the VMs and qdiscs
    stay up between runs), and clears the ports if anything fails inside the block: after a failure the
    emulator's state is unknown, so the next run sets the link again. :meth:`close` takes bbrlab's qdiscs
    off at the end of a campaign.
    """

    def __init__(self, host: Host, ports: Sequence[str]):
        self.host, self.ports = host, tuple(ports)
        self.current: Link | None = None
        #: The ports' offloads as read back when the link was set (:func:`bbrlab.link.offloads.apply`).
        self.offloads: Offloads | None = None
        #: The qdisc kinds the emulator's kernel was seen to take (probed once: its kernel does not change).
        self.known_kinds: set[str] = builtins.set()
        self._fresh: Readback | None = None  # the read-back taken when the link was just set, not yet used

    @contextlib.contextmanager
    def holding(self, link: Link) -> Iterator[bool]:
        """The ``with`` block runs on ``link``; yields whether it had to be (re)configured."""
        changed = self.current != link
        self._fresh = None
        if changed:
            self.current, self.offloads = None, None
            applied = apply(self.host, self.ports, link, known=self.known_kinds)
            self.offloads, self.current, self._fresh = applied.offloads, link, applied.qdiscs
        try:
            yield changed
        except BaseException:
            self.forget()
            raise

    def readback(self) -> Readback:
        """The qdiscs on the ports as the kernel reports them now (with counters)."""
        self._fresh = None
        return show(self.host, self.ports)

    def counters_start(self) -> Readback:
        """The read-back a run's counters start from: the one :meth:`holding` took as it set the link (nothing
        ran on the link since), or, when the link was kept, one read now."""
        fresh, self._fresh = self._fresh, None
        return fresh if fresh is not None else self.readback()

    def forget(self) -> None:
        """Clear the ports, best effort (the error that led here is what gets reported)."""
        self.current, self.offloads, self._fresh = None, None, None
        with contextlib.suppress(Exception):
            clear(self.host, self.ports)

    def close(self) -> None:
        """Take bbrlab's qdiscs off the ports (raises if the kernel keeps one)."""
        self.current, self.offloads = None, None
        clear(self.host, self.ports)
