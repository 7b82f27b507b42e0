"""``bbrlab kernel build|load|status|set``: the patched congestion-control module (bbr2b by default)."""

from __future__ import annotations

import contextlib
import json

from bbrlab.core.errors import BbrlabError
from bbrlab.testbed.driving import changing

from .common import TESTBED_HELP, add_force_option, load_testbed, refuse_if_busy


def register(sub) -> None:
    """Add ``bbrlab kernel`` (build, load, status, build-tree, check, ccas, set) to the subparsers ``sub``."""
    p = sub.add_parser("kernel", help="build, load and inspect patched congestion-control modules (bbr2b)",
                       description="Builds a patched tcp_bbr.c (default: the inflight-deficit patch, CA name "
                                   "bbr2b) as an out-of-tree module from the target kernel's own source, "
                                   "loads it beside stock bbr, and reports its identity and parameters.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    b = verbs.add_parser("build", help="patch and build the module (cached by input hash)")
    _build_args(b)
    b.add_argument("--headers", help="kernel build headers (default: newest /usr/src/linux-headers-*)")
    b.add_argument("--out", help="write the .ko here instead of the cache")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=run_build)

    load = verbs.add_parser("load", help="build for the target's kernel if needed, copy, insmod, verify")
    _build_args(load)
    _target_args(load)
    load.set_defaults(func=run_load)

    st = verbs.add_parser("status", help="available congestion controls; identity and parameters of the module")
    st.add_argument("--name", default="bbr2b", help="module / congestion-control name (default bbr2b)")
    _target_args(st)
    add_force_option(st)
    st.set_defaults(func=run_status)

    bt = verbs.add_parser("build-tree", help="build a sender kernel and its bbr2b from a kernel source tree",
                          description="Configures (x86_64_defconfig + kvm_guest.config + kernels/sender-kernel.config), "
                                      "builds bzImage and modules under nice with make O=OUT/build (the tree is not "
                                      "written to), installs them into OUT and builds bbr2b against the result. "
                                      "Boot it with: bbrlab testbed up --kernel OUT")
    bt.add_argument("--source", required=True, help="the kernel source tree (a google/bbr checkout, an unpacked "
                    "linux-source, ...); nothing is downloaded")
    bt.add_argument("--out", required=True, help="the kernel directory to create (bzImage, lib/modules, bbr2b/)")
    bt.add_argument("--jobs", type=int, default=None, help="make -j (default: the number of CPUs)")
    bt.add_argument("--nice", type=int, default=10, help="nice level of the compile (default 10; 0 = not niced)")
    bt.add_argument("--localversion", default="-bbrlab", help="appended to the release (default -bbrlab)")
    bt.add_argument("--no-bbr2b", action="store_true", help="build the kernel only")
    bt.add_argument("--bbr2b-patch", help="patch for bbr2b (default: the one kernels/ lists for the tree's tcp_bbr.c; "
                    "kernels/bbr3 for a BBRv3 tree)")
    bt.add_argument("--bbr2b-sha256", help="accept this tcp_bbr.c hash for the bbr2b patch (recorded in build.json)")
    bt.add_argument("--bbr2b-fuzz", type=int, default=0, help="context slack for the bbr2b patch, 0-2 (default 0)")
    bt.set_defaults(func=run_build_tree)

    chk = verbs.add_parser("check", help="resolve and check a sender kernel (name or path) without booting it")
    chk.add_argument("kernel", help="debian-6.1, debian-5.10, debian-6.12, or a kernel directory / linux-image .deb")
    chk.add_argument("--bbr2b", action="store_true", help="also check bbr2b can be had for it (downloads sources)")
    chk.add_argument("--json", action="store_true", help="machine-readable output")
    chk.set_defaults(func=run_check)

    cc = verbs.add_parser("ccas", help="each congestion control of the running sender: BBR version, patched, module")
    _target_args(cc)
    add_force_option(cc)
    cc.set_defaults(func=run_ccas)

    s = verbs.add_parser("set", help="change module parameters, e.g. deficit_gain=1000 deficit_enable=0")
    s.add_argument("assignments", nargs="+", metavar="PARAM=VALUE")
    s.add_argument("--name", default="bbr2b", help="module name (default bbr2b)")
    _target_args(s)
    s.set_defaults(func=run_set)


def _build_args(p) -> None:
    from bbrlab.kernel import DEFAULT_PATCH, DEFAULT_SOURCE

    p.add_argument("--patch", default=str(DEFAULT_PATCH), help=f"unified diff of net/ipv4/tcp_bbr.c "
                   f"(default {DEFAULT_PATCH.relative_to(DEFAULT_PATCH.parents[2])})")
    p.add_argument("--source", default=str(DEFAULT_SOURCE),
                   help="tcp_bbr.c, a kernel tree or a source tarball (default %(default)s)")
    p.add_argument("--sha256", help="SHA-256 of the pristine tcp_bbr.c (default: SOURCE.sha256 beside the patch)")


def _target_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--testbed", metavar="NAME|FILE", default=None, help="the sender of " + TESTBED_HELP)
    g.add_argument("--this-host", action="store_true", help="this machine (needs module loading)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _target(args):
    """(host to act on, the testbed it belongs to or None for this machine)."""
    from bbrlab.core.hosts import LocalHost

    if args.this_host:
        return LocalHost(), None
    tb = load_testbed(args)
    return tb.sender.host, tb.name


@contextlib.contextmanager
def _on_target(args, activity: str | None = None, **details):
    """The host the command acts on (:func:`_target`), closed at the end. With ``activity`` the command
    changes it and holds its testbed's lock (:func:`changing`) meanwhile; without, it only looks, which a
    busy testbed refuses unless ``--force``. This machine has no lock."""
    host, testbed = _target(args)
    try:
        if testbed and activity is None:
            refuse_if_busy(testbed, args.force, "run commands on its sender")
        with changing(testbed, activity, **details) if testbed and activity else contextlib.nullcontext():
            yield host
    finally:
        host.close()


def _print(data: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    for key, value in data.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k} = {v}")
        else:
            print(f"{key}: {value}")


def run_build(args) -> int:
    """``bbrlab kernel build``: patch and build the module on this machine (into the cache unless ``--out``)
    and print what was built; returns 0."""
    from bbrlab.kernel import build_module

    built = build_module(args.patch, args.headers, args.out, source=args.source, expected_sha256=args.sha256)
    _print(built.to_dict(), args.json)
    return 0


def run_load(args) -> int:
    """``bbrlab kernel load``: build the module for the target's kernel if needed and load it there, holding
    the testbed's lock, then print its identity; returns 0."""
    from bbrlab.kernel import ensure_module

    with _on_target(args, "kernel load", patch=args.patch) as host:
        identity = ensure_module(host, args.patch, source=args.source, expected_sha256=args.sha256)
    _print(identity, args.json)
    return 0


def run_status(args) -> int:
    """``bbrlab kernel status``: print the target's kernel release, its available congestion controls and the
    identity of module ``--name`` (or that it is not loaded); returns 0."""
    from bbrlab.kernel import available_ccas, loaded_srcversion, module_identity

    with _on_target(args) as host:
        data = {"host": host.name, "kernel": host.output(["uname", "-r"]), "available": " ".join(available_ccas(host))}
        data["module"] = module_identity(host, args.name) if loaded_srcversion(host, args.name) else "not loaded"
    _print(data, args.json)
    return 0


def parse_assignments(items: list[str]) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``; a malformed item is a user error."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise BbrlabError(f"parameter assignment {item!r} is not allowed: the form is NAME=VALUE")
        out[key] = value
    return out


def run_set(args) -> int:
    """``bbrlab kernel set PARAM=VALUE ...``: write module ``--name``'s parameters on the target (all or
    nothing) and print them as read back; returns 0."""
    from bbrlab.kernel import set_params

    params = parse_assignments(args.assignments)
    with _on_target(args, "kernel set", module=args.name, params=params) as host:
        after = set_params(host, args.name, **params)
    _print({"params": after}, args.json)
    return 0


def _progress(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def run_build_tree(args) -> int:
    """``bbrlab kernel build-tree``: build a sender kernel (and bbr2b unless ``--no-bbr2b``) from ``--source``
    into ``--out``, progress on stderr; returns 0."""
    from bbrlab.kernel.tree import build_tree

    result = build_tree(args.source, args.out, jobs=args.jobs, nice=args.nice, localversion=args.localversion,
                        bbr2b=not args.no_bbr2b, bbr2b_patch=args.bbr2b_patch, bbr2b_sha256=args.bbr2b_sha256,
                        bbr2b_fuzz=args.bbr2b_fuzz, progress=_progress)
    print(f"built {result.release} in {result.build_s:.0f} s into {result.out}; boot it with: "
          f"bbrlab testbed up --kernel {result.out}")
    return 0


def run_check(args) -> int:
    """``bbrlab kernel check KERNEL``: resolve a sender kernel without booting it and print it with its
    features and their evidence (and, with ``--bbr2b``, the patch bbr2b would use); returns 0."""
    from bbrlab.testbed import check_kernel

    resolved = check_kernel(args.kernel, need_bbr2b=args.bbr2b, progress=not args.json)
    data = {"kernel": resolved.kernel.to_dict(), "features": resolved.features.found,
            "evidence": resolved.features.evidence}
    if args.bbr2b:
        from bbrlab.kernel.bbr2b import plan_bbr2b

        data["bbr2b_patch"] = plan_bbr2b(resolved).patch
    _print(data, args.json)
    return 0


def run_ccas(args) -> int:
    """``bbrlab kernel ccas``: probe each congestion control of the target's running kernel and print its BBR
    version, whether it is patched, and its module; returns 0."""
    from bbrlab.kernel.ccaprobe import probe_ccas

    with _on_target(args) as host:
        found = probe_ccas(host)
    if args.json:
        print(json.dumps({k: v.to_dict() for k, v in found.items()}, indent=2))
        return 0
    for ident in found.values():
        version = f"BBRv{ident.bbr_version}" if ident.bbr_version else "not BBR"
        origin = f"module {ident.module}" if ident.module else "built in"
        patch = f", patched ({ident.patch_sha256[:12]})" if ident.patched else ""
        print(f"{ident.name:<10} {version:<8} {origin}{patch}")
    return 0
