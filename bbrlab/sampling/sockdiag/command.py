"""The samplers' command lines, every value checked before anything starts."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bbrlab.core.errors import ValidationError
from bbrlab.scenario.scenario import SAMPLER_MAX_PORTS

#: The C programs' limits (bbrlab/sampling/native/sampler_common.h, sockdiag_sampler.c, sockbpf_sampler.c).
MAX_PORTS = SAMPLER_MAX_PORTS
MIN_INTERVAL_MS = 0.1
MAX_INTERVAL_MS = 10_000
MAX_STOP_AFTER_S = 86_400


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def check_interval_ms(value: object, field: str = "interval_ms") -> float:
    """``value`` as a float of ms; :class:`ValidationError` (naming ``field``) unless it is a finite number
    from 0.1 to 10000."""
    if not _number(value) or not MIN_INTERVAL_MS <= value <= MAX_INTERVAL_MS:
        raise ValidationError(field, value, f"{MIN_INTERVAL_MS} <= {field} <= {MAX_INTERVAL_MS} ms")
    return float(value)


def check_port(value: object, field: str) -> int:
    """``value`` unchanged; :class:`ValidationError` (naming ``field``) unless it is an int (not a bool)
    from 1 to 65535."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValidationError(field, value, "a TCP port number from 1 to 65535")
    return value


def check_ports(ports: object, field: str = "ports") -> list[int]:
    """``ports`` as a list; :class:`ValidationError` unless it is a sequence of 1 to :data:`MAX_PORTS`
    distinct port numbers (each checked by :func:`check_port`)."""
    if isinstance(ports, str | bytes) or not isinstance(ports, Sequence) or not 1 <= len(ports) <= MAX_PORTS:
        raise ValidationError(field, ports, f"the data connections' local ports: 1 to {MAX_PORTS} port numbers")
    checked = [check_port(p, f"{field}[{i}]") for i, p in enumerate(ports)]
    if len(set(checked)) != len(checked):
        raise ValidationError(field, ports, "each port once")
    return checked


def sampler_argv(binary_path: str, interval_ms: float, stop_after_s: float, stop_file: str,
                 ports: Sequence[int], server_port: int, *, kind: str = "netlink", family: int = 4,
                 batch_ms: int = 250) -> list[str]:
    """The argument list that runs a sampler on the sender (nothing is shell-joined).

    ``interval_ms`` 0.1 .. 10000 (rounded to whole microseconds); ``stop_after_s`` 1 .. 86400 (the
    sampler's own deadline, rounded up to whole seconds); ``stop_file`` an absolute path; ``ports`` the
    data connections' local ports, ``server_port`` their peer port. ``kind`` netlink: ``family`` 4
    (IPv4) or 6 (IPv6); bpf: ``batch_ms`` 10 .. 10000, how often the loader drains the ring buffer.
    """
    interval_us = round(check_interval_ms(interval_ms) * 1000)
    if not _number(stop_after_s) or not 1 <= stop_after_s <= MAX_STOP_AFTER_S:
        raise ValidationError("stop_after_s", stop_after_s, f"1 <= stop_after_s <= {MAX_STOP_AFTER_S} s")
    if not isinstance(stop_file, str) or not stop_file.startswith("/") or any(c in stop_file for c in "\n\0"):
        raise ValidationError("stop_file", stop_file, "an absolute path without newlines")
    checked = check_ports(ports)
    check_port(server_port, "server_port")
    argv = [binary_path, "-i", str(interval_us), "-t", str(math.ceil(stop_after_s)), "-s", stop_file,
            "-d", str(server_port), "-p", ",".join(str(p) for p in checked)]
    if kind == "netlink":
        if family not in (4, 6) or isinstance(family, bool):
            raise ValidationError("family", family, "4 (IPv4) or 6 (IPv6)")
        return [*argv, "-f", str(family)]
    if kind == "bpf":
        if isinstance(batch_ms, bool) or not isinstance(batch_ms, int) or not 10 <= batch_ms <= 10_000:
            raise ValidationError("batch_ms", batch_ms, "a whole number of ms from 10 to 10000")
        return [*argv, "-b", str(batch_ms)]
    raise ValidationError("sampler", kind, "netlink or bpf")
