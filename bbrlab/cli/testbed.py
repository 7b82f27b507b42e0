"""``bbrlab testbed up|down|status|shell``: the local testbed, or a lab's testbed file."""

from __future__ import annotations

import json
import os
import shlex
import sys

from bbrlab.core.errors import BbrlabError
from bbrlab.testbed.driving import changing
from bbrlab.testbed.holder import busy_elsewhere, describe_holder

from .common import (
    add_force_option,
    add_testbed_option,
    refuse_if_busy,
    testbed_arg,
)


def register(sub) -> None:
    """Add ``bbrlab testbed`` (verbs up, down, status, shell) to the subparsers ``sub``."""
    p = sub.add_parser("testbed", help="bring the local testbed up/down, show status, run commands on a role",
                       description="With no testbed file, 'up' builds (once) and boots the local testbed: a sender "
                                   "VM and an emulator VM (QEMU) and a receiver network namespace on this machine.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    up = verbs.add_parser("up", help="build the guest image if needed and boot the local testbed (idempotent)")
    up.add_argument("--name", "--testbed", dest="name", default=None,
                    help="testbed name (default: $BBRLAB_TESTBED, else local)")
    up.add_argument("--sender-vcpus", type=int, default=1, help="vCPUs of the sender VM (default: 1)")
    up.add_argument("--quiet", action="store_true", help="no progress lines")
    up.add_argument("--no-bbr2b", action="store_true",
                    help="do not build and load the patched BBR (bbr2b) in the sender (loaded by default)")
    up.add_argument("--kernel", default="debian-6.1", metavar="KERNEL",
                    help="the sender's kernel: debian-6.1 (default, the image's), debian-5.10, debian-6.12, or a path "
                         "to a kernel directory (bzImage + lib/modules/<release>) or a linux-image .deb; a running "
                         "testbed with another sender kernel reboots only its sender")
    up.set_defaults(func=run_up)

    down = verbs.add_parser("down", help="stop the VMs and remove every namespace, tap and bridge of the testbed")
    down.add_argument("--name", "--testbed", dest="name", default=None,
                      help="testbed name (default: $BBRLAB_TESTBED, else the local testbed that is up)")
    down.set_defaults(func=run_down)

    st = verbs.add_parser("status", help="each role: reachable, kernel, CCAs, qdiscs; sender QEMU pid, vCPU threads")
    add_testbed_option(st)
    add_force_option(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=run_status)

    sh = verbs.add_parser("shell", help="run COMMAND on a role (or an interactive shell on it)")
    sh.add_argument("role", choices=["sender", "emulator", "receiver", "hypervisor"])
    sh.add_argument("argv", nargs="*", metavar="COMMAND", help="the command, after --  (e.g. -- uname -r)")
    add_testbed_option(sh, " (give it before ROLE)")
    add_force_option(sh)
    sh.set_defaults(func=run_shell)


def run_up(args) -> int:
    """``bbrlab testbed up``: build the guest image if needed and boot local testbed ``--name`` while holding
    its lock (idempotent; a running one with another ``--kernel`` reboots only its sender); prints its
    addresses and sender kernel, returns 0."""
    from bbrlab import testbed
    from bbrlab.core.signals import interruptible
    from bbrlab.testbed.local.state import check_name
    from bbrlab.testbed.target import DEFAULT_NAME, ENV

    name = check_name(args.name or os.environ.get(ENV, "").strip() or DEFAULT_NAME)
    with changing(name, "testbed up"), interruptible():  # a signal: the half-built image or testbed is removed
        tb = testbed.up(name, sender_vcpus=args.sender_vcpus, progress=not args.quiet,
                        load_bbr2b=not args.no_bbr2b, kernel=args.kernel)
    print(f"testbed '{tb.name}' is up ({tb.accelerator}); sender {tb.sender.experiment_ip} -> "
          f"receiver {tb.receiver.experiment_ip} through the emulator ({', '.join(tb.emulator.ports)}); "
          f"sender kernel {testbed.sender_kernel(tb).label}")
    return 0


def run_down(args) -> int:
    """``bbrlab testbed down``: stop the testbed's VMs and remove its namespaces, taps and bridges while
    holding its lock; prints what went, returns 0."""
    from bbrlab import testbed
    from bbrlab.testbed.local.state import check_name
    from bbrlab.testbed.target import resolve

    name = check_name(resolve(args.name))
    with changing(name, "testbed down"):
        removed = testbed.down(name)
    print(f"testbed '{name}' is down: stopped {len(removed['qemu_pids'])} QEMU process(es), removed "
          f"{len(removed['netns'])} namespace(s)")
    return 0


def run_status(args) -> int:
    """``bbrlab testbed status``: print each role's reachability, kernel, congestion controls and qdiscs and
    the sender's QEMU pid and vCPU threads (only who holds the testbed while another process does, unless
    ``--force``). Returns 1 when a role it asked is unreachable, else 0."""
    from bbrlab import testbed

    tb = testbed.load(testbed_arg(args))
    busy = None if args.force else busy_elsewhere(tb.name)
    if busy is not None:  # a campaign (or another command) is using it: say so, touch nothing
        if args.json:
            print(json.dumps({"name": tb.name, "accelerator": tb.accelerator, "busy": busy}, indent=2))
        else:
            print(f"testbed {tb.name}: in use by {describe_holder(busy)}\n"
                  "  its guests were not asked anything (that would take CPU from the run); --force asks anyway")
        return 0
    st = testbed.status(tb)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0 if all(r.get("reachable") for r in st["roles"].values()) else 1
    print(f"testbed {st['name']} ({st['kind']}): accelerator {st['accelerator']}"
          + (f", {st['hypervisor']}" if st.get("hypervisor") else ""))
    for name, r in st["roles"].items():
        if not r.get("reachable"):
            print(f"  {name:<9} UNREACHABLE ({r['host']}): {r.get('error', '')}")
            continue
        qd = " ".join(f"{q}:{how}" for q, how in r.get("qdiscs", {}).items())
        print(f"  {name:<9} {r['host']:<28} kernel {r['kernel']}  ip {r.get('experiment_ip') or '-'}")
        print(f"  {'':<9} cca: {' '.join(r.get('congestion_controls', []))}   qdiscs: {qd}")
        if name == "sender":
            print(f"  {'':<9} QEMU pid {r.get('qemu_pid')}  vCPU threads {r.get('vcpu_threads')}"
                  + (f"  ({r['vcpu_error']})" if r.get("vcpu_error") else ""))
            if st.get("sender_kernel_identity"):
                from bbrlab.kernel.sender import SenderKernel

                print(f"  {'':<9} booted: {SenderKernel.from_dict(st['sender_kernel_identity']).label}")
    return 0 if all(r.get("reachable") for r in st["roles"].values()) else 1


def run_shell(args) -> int:
    """``bbrlab testbed shell ROLE [-- COMMAND]``: run COMMAND on the role's host and return its exit code, or
    replace this process with an interactive shell there (ssh to a guest, else a local shell, in the role's
    network namespace if it has one)."""
    from bbrlab import testbed

    tb = testbed.load(testbed_arg(args))
    refuse_if_busy(tb.name, args.force, "open a shell on it")
    host = tb.sender.hypervisor if args.role == "hypervisor" else tb.roles[args.role].host
    if args.argv:
        res = host.run(args.argv, check=False, timeout=None)
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        return res.exit_code
    return _interactive(host)


def _interactive(host) -> int:
    """An interactive shell: ssh(1) with the testbed's key and pinned known_hosts, or the netns."""
    if getattr(host, "netns", ""):
        argv = ["ip", "netns", "exec", host.netns, os.environ.get("SHELL", "/bin/bash")]
    elif getattr(host, "address", ""):
        argv = ["ssh", "-p", str(host.port), "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes"]
        if host.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={host.known_hosts}"]
        if host.key_path:
            argv += ["-i", host.key_path]
        argv.append(f"{host.user}@{host.address}")
    elif host.is_local:
        argv = [os.environ.get("SHELL", "/bin/bash")]
    else:
        raise BbrlabError(f"no interactive shell for {host.name}")
    print(f"$ {shlex.join(argv)}", file=sys.stderr)
    os.execvp(argv[0], argv)
    return 0  # not reached
