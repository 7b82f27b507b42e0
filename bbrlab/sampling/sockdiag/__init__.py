"""The netlink and BPF socket samplers: build, deploy, command line, and reading their output.

Two small static C programs (``bbrlab/sampling/native/``) run inside the sender for the length of a run and sample
the flow's data sockets every ``sample_ms`` without forking anything:

- ``bpf`` (``sockbpf_sampler``): a BPF program on the ``tcp_probe`` tracepoint copies a socket's state into
  a ring buffer when an ACK arrives in a new slot; the loader drains it a few times a second. No wake-up
  and no system call per sample: about 0.2 ms of guest CPU per sample under TCG, the default.
- ``netlink`` (``sockdiag_sampler``): one NETLINK_SOCK_DIAG socket asks the kernel for the sockets by their
  exact 4-tuple on an absolute schedule (tcp_info, the CCA's name, BBR's info): about 1.5-3 ms per sample
  under TCG, on any kernel with inet_diag.

docs/sampling.md compares them with the ``ss`` loop (benchmarks/sampling.py measures all three)::

    from bbrlab.sampling import sockdiag
    deployed = sockdiag.ensure_on_host(tb.sender.host, kind="bpf")   # build (cached), copy if needed
    argv = sockdiag.sampler_argv(deployed.path, 10, 60, "/tmp/x/stop", [20000], 5201, kind="bpf")
    ...                                                              # run it during the transfer
    rows = sockdiag.rows(text, ports=[20000])                        # the ss table's rows (either log)
    sockdiag.summary(text)                                           # samples, missed ticks, CPU, intervals
"""

from . import bpf
from . import parse as _netlink
from .binary import KINDS, SamplerBinary, SamplerBuildError, build, source_sha256
from .command import check_interval_ms, check_ports, sampler_argv
from .deploy import REMOTE_PATH, Deployed, SamplerDeployError, ensure_on_host, remote_path, remote_sha256
from .parse import SockdiagFieldsMissing, SockdiagLog, SockdiagLogError, interval_stats, parse_log, socket_row

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
    """Rows of the ss table from either sampler's log (see :func:`bbrlab.sampling.sockdiag.parse.rows`)."""
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
