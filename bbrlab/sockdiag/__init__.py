"""The netlink (inet_diag) socket sampler: build, deploy, command line, and reading its output.

A small static C program (``bbrlab/native/sockdiag_sampler.c``) runs inside the sender for the
length of a run. It keeps one ``NETLINK_SOCK_DIAG`` socket open and, on a fixed schedule, asks the
kernel for the flow's data connections by their exact 4-tuple: tcp_info, the congestion control's
name and its own info (BBR's bandwidth estimate, min RTT, gains). No process is forked per sample,
so a sample costs the contended sender about a millisecond of CPU under TCG instead of the ~100 ms
of forking ``ss`` (see benchmarks/sampling.py for the numbers measured on the local testbed).

::

    from bbrlab import sockdiag
    deployed = sockdiag.ensure_on_host(tb.sender.host)           # build (cached) and copy if needed
    argv = sockdiag.sampler_argv(deployed.path, 10, 60, "/tmp/x/stop", [20000, 20001], 5201)
    ...                                                         # run it during the transfer
    rows = sockdiag.rows(text, ports=[20000, 20001])            # the ss table's rows
    sockdiag.summary(text)                                      # samples, missed ticks, CPU, intervals
"""

from . import bpf
from . import parse as _netlink
from .binary import KINDS, SamplerBinary, SamplerBuildError, build, source_sha256
from .command import check_interval_ms, check_ports, sampler_argv
from .deploy import REMOTE_PATH, Deployed, SamplerDeployError, ensure_on_host, remote_path, remote_sha256
from .parse import (
    SockdiagFieldsMissing,
    SockdiagLog,
    SockdiagLogError,
    interval_stats,
    parse_log,
    socket_row,
)

__all__ = [
    "KINDS", "SamplerBinary", "SamplerBuildError", "build", "source_sha256",
    "check_interval_ms", "check_ports", "sampler_argv",
    "REMOTE_PATH", "Deployed", "SamplerDeployError", "ensure_on_host", "remote_path", "remote_sha256",
    "SockdiagFieldsMissing", "SockdiagLog", "SockdiagLogError", "interval_stats", "parse_log", "rows",
    "socket_row", "summary", "log_kind", "bpf",
]


def log_kind(text: str) -> str:
    """Which sampler wrote ``text``: ``netlink`` or ``bpf`` (:class:`SockdiagLogError` for neither)."""
    if text.startswith(_netlink.MAGIC + " "):
        return "netlink"
    if text.startswith(bpf.MAGIC + " "):
        return "bpf"
    raise SockdiagLogError(f"not a sampler log (first line {text.splitlines()[0][:80] if text else ''!r})")


def rows(text, **kwargs) -> list[dict]:
    """Rows of the ss table from either sampler's log (see :func:`bbrlab.sockdiag.parse.rows`)."""
    if isinstance(text, SockdiagLog):
        return _netlink.rows(text, **kwargs)
    if isinstance(text, bpf.BpfLog):
        return bpf.rows(text, **kwargs)
    return (_netlink.rows if log_kind(text) == "netlink" else bpf.rows)(text, **kwargs)


def summary(text) -> dict:
    """What a run record keeps about either sampler (samples, missed ticks, CPU per sample, intervals)."""
    if isinstance(text, SockdiagLog):
        return _netlink.summary(text)
    if isinstance(text, bpf.BpfLog):
        return bpf.summary(text)
    return (_netlink.summary if log_kind(text) == "netlink" else bpf.summary)(text)
