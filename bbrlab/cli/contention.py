"""``bbrlab contention set|show|clear|recount``: SCHED_DEADLINE on a VM's vCPU threads by hand.

Campaigns apply contention per run and restore it themselves; these commands are for trying a
setting out, looking at what a VM's threads run under, and cleaning up. ``recount`` makes a host's
kernel count its admitted deadline bandwidth again when that count has drifted (admission refused
with EBUSY though no deadline thread holds the bandwidth: bbrlab.contention.accounting).
"""

from __future__ import annotations

import argparse
import contextlib
import json

from bbrlab.contention.vcpu import explicit_vcpu_threads, named_vcpu_threads, owning_testbed, qmp_vcpu_threads
from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import Host, LocalHost
from bbrlab.scenario.cpumodels.deadline import DEADLINE_MODES, DEFAULT_DEADLINE_MODE
from bbrlab.testbed.driving import changing

from .common import TESTBED_HELP, testbed_arg

SET_EPILOG = """\
`set` leaves the policy in place after the command exits: it stays until `bbrlab contention clear`
(or until the VM stops). Inside Python, use bbrlab.contention.deadline.contended(), which restores the
previous policy on exit, exceptions, Ctrl-C and SIGTERM.

examples:
  bbrlab contention set --timeslice 1ms --share 25%        the sender of the local testbed that is up
  bbrlab contention show --measure 3
  bbrlab contention clear
  bbrlab contention set --timeslice 10ms --share 50% --testbed lab.yaml
  bbrlab contention set --timeslice 10ms --share 25% --deadline-mode implicit   deadline = period (40 ms)
  bbrlab contention set --timeslice 1ms --share 25% --qmp /path/to/vm.qmp   any local QEMU
"""

RECOUNT_DESCRIPTION = """\
Admission control keeps a running total of the deadline bandwidth it admitted. Some kernels (measured on
a 6.18 host; Debian's 6.1 guest refused with no deadline thread left, likely the same) keep counting the bandwidth of a thread that slept often while
under SCHED_DEADLINE after it went back to SCHED_OTHER, as QEMU's vCPU threads do. After some runs
every admission is refused with EBUSY though no deadline thread exists. This makes the kernel rebuild
its root domains, which counts the threads that are really there (cgroup v1: the root cpuset's load
balancing off and on again, in an instant; cgroup v2: it says how).

examples:
  bbrlab contention recount                     this machine (a local testbed's hypervisor)
  bbrlab contention recount --testbed lab.yaml  the sender's hypervisor of a lab
"""


def _target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pid", type=int, metavar="QEMU_PID",
                   help="a local QEMU started with -name NAME,debug-threads=on (vCPU threads are named 'CPU N/...')")
    g.add_argument("--qmp", metavar="SOCKET", help="a local QEMU's QMP unix socket (asks query-cpus-fast)")
    g.add_argument("--threads", metavar="TID,TID", help="explicit thread ids (any hypervisor, e.g. VirtualBox)")
    g.add_argument("--testbed", metavar="NAME|FILE",
                   help="the sender VM's vCPU threads on its hypervisor, of " + TESTBED_HELP)
    p.add_argument("--method", choices=("auto", "syscall", "chrt"), default="auto",
                   help="sched_setattr(2) directly (this machine) or chrt on the host; auto picks (default)")


def register(sub) -> None:
    """Add ``bbrlab contention`` (verbs set, show, clear) to the subparsers ``sub``."""
    p = sub.add_parser("contention", help="SCHED_DEADLINE on a VM's vCPU threads: set, show, clear",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    s = verbs.add_parser("set", help="apply runtime = timeslice, period = timeslice / share (stays until clear)",
                         description="Apply SCHED_DEADLINE to every vCPU thread and read it back.",
                         epilog=SET_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--timeslice", required=True, help="runtime (= deadline when constrained), e.g. 1ms, 10ms, 500us")
    s.add_argument("--share", required=True, help="CPU share, e.g. 25%% (100%% = no policy)")
    s.add_argument("--deadline-mode", choices=DEADLINE_MODES, default=DEFAULT_DEADLINE_MODE,
                   help="constrained: deadline = runtime (default, the paper's); implicit: deadline = period")
    _target_args(s)
    s.set_defaults(func=run_set)

    sh = verbs.add_parser("show", help="the threads' current policy (and, with --measure, the CPU they use)")
    _target_args(sh)
    sh.add_argument("--measure", type=float, metavar="SECONDS",
                    help="also measure the CPU share each thread uses over SECONDS (from /proc/<tid>/schedstat)")
    sh.add_argument("--json", action="store_true", help="machine-readable output")
    sh.set_defaults(func=run_show)

    c = verbs.add_parser("clear", help="put threads under SCHED_DEADLINE back to SCHED_OTHER")
    _target_args(c)
    c.set_defaults(func=run_clear)

    r = verbs.add_parser("recount", help="make the kernel count its admitted deadline bandwidth again (after EBUSY "
                         "with nothing holding it)", description=RECOUNT_DESCRIPTION,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--testbed", metavar="NAME|FILE",
                   help="the hypervisor host of this testbed's sender (default: this machine); " + TESTBED_HELP)
    r.set_defaults(func=run_recount)


# -- finding the threads --------------------------------------------------------------------------

def parse_thread_list(text: str) -> list[int]:
    """``--threads`` text such as ``"1234,1235"`` as a list of thread ids; raises
    :class:`~bbrlab.core.errors.ValidationError` when an item is not a whole number."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValidationError("--threads", text, "comma-separated thread ids, e.g. 1234,1235") from None


def resolve_target(args) -> tuple[Host, list[int], str | None]:
    """(hypervisor host, vCPU thread ids, the testbed they belong to) named by the target options.

    Without --pid, --qmp or --threads: the sender of ``--testbed`` (or of the default testbed). The
    testbed of explicit threads is known when they belong to a local testbed's sender QEMU.
    """
    if args.pid is not None:
        tids = named_vcpu_threads(args.pid, "--pid")
    elif args.qmp:
        tids = qmp_vcpu_threads(args.qmp)
    elif args.threads:
        tids = explicit_vcpu_threads(parse_thread_list(args.threads), "--threads")
    else:
        return testbed_target(testbed_arg(args))
    return LocalHost(), tids, owning_testbed(tids[0])


def testbed_target(name_or_file: str) -> tuple[Host, list[int], str]:
    """The sender's hypervisor and vCPU threads of a local testbed (by name) or a testbed file."""
    from bbrlab.testbed import load

    tb = load(name_or_file)
    return tb.sender.hypervisor, tb.sender.vcpu_threads(), tb.name


def _changing(name: str | None, activity: str, **details):
    """The testbed's lock while its sender's policy changes (nothing to lock for threads of no testbed)."""
    return changing(name, activity, **details) if name else contextlib.nullcontext()


# -- the verbs --------------------------------------------------------------------------------------

def run_set(args) -> int:
    """``bbrlab contention set``: put SCHED_DEADLINE (runtime = ``--timeslice``, period = timeslice / ``--share``,
    deadline = runtime or, with ``--deadline-mode implicit``, = period) on the target's vCPU threads and print it
    as read back; it stays until ``clear``. A 100 % share applies nothing. Returns 0."""
    from bbrlab.contention.deadline import ContentionSession
    from bbrlab.core.units import parse_percent, parse_time_ms
    from bbrlab.scenario.cpumodels import DeadlineParams
    from bbrlab.scenario.scenario import Contention

    contention = Contention(timeslice_ms=parse_time_ms(args.timeslice, "--timeslice"),
                            cpu_share_pct=parse_percent(args.share, "--share"),
                            params=DeadlineParams(args.deadline_mode))
    host, tids, testbed = resolve_target(args)
    with _changing(testbed, "contention set", timeslice_ms=contention.timeslice_ms,
                   cpu_share_pct=contention.cpu_share_pct):
        session = ContentionSession(host, tids, contention, method=args.method)
        session.prepare()
        session.apply()
    if contention.unlimited:
        print(f"share 100 %: no policy applied to {len(tids)} thread(s)")
    for tid, policy in session.applied.items():
        print(f"{host.name} thread {tid}: {policy.describe()}")
    if not contention.unlimited:
        print("the policy stays until `bbrlab contention clear`")
    return 0


def run_show(args) -> int:
    """``bbrlab contention show``: print each target thread's scheduling policy and, with ``--measure S``, the
    share of a CPU it used over S seconds; returns 0."""
    from bbrlab.contention.deadline import measure_usage, show_policies

    host, tids, _testbed = resolve_target(args)
    policies = show_policies(host, tids, args.method)
    usage = {u.tid: u for u in measure_usage(host, tids, args.measure)} if args.measure else {}
    if args.json:
        rows = [{"tid": tid, **p.to_dict(), **({"usage": usage[tid].to_dict()} if tid in usage else {})}
                for tid, p in policies.items()]
        print(json.dumps({"host": host.name, "threads": rows}, indent=2))
        return 0
    for tid, policy in policies.items():
        line = f"{host.name} thread {tid}: {policy.describe()}"
        if tid in usage:
            u = usage[tid]
            line += f"; used {u.cpu_share_pct:.1f} % of a CPU over {u.wall_s:.1f} s"
        print(line)
    return 0


def run_clear(args) -> int:
    """``bbrlab contention clear``: put the target's threads that are under SCHED_DEADLINE back to SCHED_OTHER
    and say which; returns 0."""
    from bbrlab.contention.deadline import clear_deadline

    host, tids, testbed = resolve_target(args)
    with _changing(testbed, "contention clear"):
        cleared = clear_deadline(host, tids, args.method)
    print(f"{host.name}: {len(cleared)} thread(s) back to SCHED_OTHER: {cleared}" if cleared
          else f"{host.name}: no thread was under SCHED_DEADLINE")
    return 0


def run_recount(args) -> int:
    """``bbrlab contention recount``: rebuild the host's root domains and print the kernel's count; returns 0."""
    from bbrlab.contention.accounting import kernel_total, recount

    host, testbed = LocalHost(), None
    if args.testbed:
        from bbrlab.testbed import load

        tb = load(args.testbed)
        host, testbed = tb.sender.hypervisor, tb.name
    before = kernel_total(host)
    with _changing(testbed, "contention recount"):
        after = recount(host)
    if after is None:
        print(f"{host.name}: root domains rebuilt; the kernel's count is not readable here (debugfs not mounted)")
    else:
        was = f"{100 * before.total_cpus:.1f} %" if before else "unknown"
        print(f"{host.name}: deadline bandwidth the kernel counts as admitted: was {was}, now "
              f"{100 * after.total_cpus:.1f} % (the fair server's reservation included)")
    return 0
