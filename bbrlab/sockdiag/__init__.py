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

from .binary import SamplerBinary, SamplerBuildError, build, source_sha256
from .command import check_interval_ms, check_ports, sampler_argv
from .deploy import REMOTE_PATH, Deployed, SamplerDeployError, ensure_on_host, remote_sha256
from .parse import (
    SockdiagFieldsMissing,
    SockdiagLog,
    SockdiagLogError,
    interval_stats,
    parse_log,
    rows,
    socket_row,
    summary,
)

__all__ = [
    "SamplerBinary", "SamplerBuildError", "build", "source_sha256",
    "check_interval_ms", "check_ports", "sampler_argv",
    "REMOTE_PATH", "Deployed", "SamplerDeployError", "ensure_on_host", "remote_sha256",
    "SockdiagFieldsMissing", "SockdiagLog", "SockdiagLogError", "interval_stats", "parse_log", "rows",
    "socket_row", "summary",
]
