"""Entry point of the ``bbrlab`` command: registers the subcommands listed in :data:`COMMANDS` and dispatches."""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys

from bbrlab import __version__
from bbrlab.core.errors import BbrlabError
from bbrlab.core.signals import Interrupted

DESCRIPTION = """\
bbrlab measures TCP congestion control (cubic, bbr, patched bbr) from a sender VM whose
vCPU threads run under SCHED_DEADLINE, through an emulated bottleneck (netem + token bucket),
and turns the run records into the figures of the 2BRobust paper.

Typical session on one machine (root):
  bbrlab doctor                      what this machine can do
  bbrlab testbed up                  build the guest image (once) and boot the local testbed
  bbrlab campaign run specs/demo.yaml --out runs/demo
  bbrlab ingest runs/demo            tidy parquet tables for the notebooks
  bbrlab testbed down
  bbrlab cache show                  what ~/.cache/bbrlab holds (bbrlab cache prune frees space)
  bbrlab claims check                recompute every number the README and docs state about data/
  bbrlab check runs/demo             judge the runs against the spec's expect: block (exit 1 on a fail)

Several testbeds at once (docs/scaling.md):
  bbrlab campaign run SPEC --out DIR --testbed a --testbed b     local testbeds, one CPU partition each
  bbrlab tls ca --out labca; bbrlab tls cert ...                a lab: its CA, a certificate per host
  bbrlab worker --testbed lab.yaml --scheduler tls://HOST:8786 --tls-ca-file ... --tls-cert ... --tls-key ...
  bbrlab campaign run SPEC --out DIR --scheduler tls://HOST:8786 --tls-ca-file ... (one worker per testbed)
"""


#: The subcommands, in the order ``bbrlab --help`` lists them: module ``bbrlab.cli.<name>`` defines
#: ``register(subparsers)``; the handler of ``bbrlab NAME VERB`` is ``run_<verb>`` in that module, the
#: handler of a command without verbs is ``run``.
COMMANDS = ("doctor", "testbed", "link", "contention", "kernel", "calibrate", "campaign", "worker", "tls", "ingest",
            "hostload", "figures", "claims", "compare", "check", "demo", "cache")


def build_parser() -> argparse.ArgumentParser:
    """The ``bbrlab`` argument parser, with every subcommand of :data:`COMMANDS` registered."""
    parser = argparse.ArgumentParser(
        prog="bbrlab", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"bbrlab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def _tell(message: str) -> None:
    """Print to stderr, if there still is one (after SIGHUP the terminal may be gone)."""
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass


#: The exit status when the reader of stdout went away early (``bbrlab campaign schema | head -1``): 128 + SIGPIPE,
#: as a shell reports a tool that SIGPIPE ended.
BROKEN_PIPE_STATUS = 141


def main(argv: list[str] | None = None) -> int:
    """Run the ``bbrlab`` command on ``argv`` (default: ``sys.argv[1:]``) and return its exit status: the
    handler's, 1 for a :class:`~bbrlab.core.errors.BbrlabError` (printed; raised with ``-v``), the signal's
    status for :class:`~bbrlab.core.signals.Interrupted`, 130 for Ctrl-C, 2 without a subcommand, and
    :data:`BROKEN_PIPE_STATUS`, quietly, when stdout's reader closed it before all was printed."""
    try:
        rc = _run(argv)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at the interpreter's exit
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe broke (a subprocess's, a socket's): not ours to hide
        _drop_stdout()
        return BROKEN_PIPE_STATUS
    return rc


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader is gone (polling it reports an error or a hang-up)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is buffered does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _run(argv: list[str] | None) -> int:
    """:func:`main` up to its exit status, a closed stdout aside."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except BbrlabError as e:
        if args.verbose:
            raise
        print(f"bbrlab: error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        _tell(f"bbrlab: {e}; what the command had changed on the testbed was restored, and a build in progress "
              "removed")
        return e.exit_code
    except KeyboardInterrupt:
        _tell("bbrlab: interrupted")
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
