"""What a run sets in the sender before it starts and restores after it: the module parameters of its congestion
control (``cca_params``) and named sysctls (``sender_sysctls``), issue #38.

A scenario holds each as an *assignment*: a tuple of ``(name, value)`` pairs in name order, every value a whole
number; empty (the default) sets nothing and is left out of the record and the run id, so runs planned before
these existed keep their ids. Which sysctls may be set is :data:`SENDER_SYSCTLS` (TCP's pacing, TSQ and
segmentation knobs, each with the range the kernel takes); a module parameter is any name of the CCA's module
(:data:`PARAM_NAME`), a whole number from 0 to :data:`MAX_PARAM` (``bbrlab.kernel.params`` narrows the ones
bbrlab knows). bbrlab.run.senderknobs sets them, reads them back and restores the values they had.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from bbrlab.core.errors import ValidationError

#: A module parameter's name (a C identifier, as ``module_param`` makes it).
PARAM_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: The largest value of a module parameter bbrlab does not know (an ``int``'s).
MAX_PARAM = 2**31 - 1
#: The longest run-id fragment the knobs of one kind add (the id's hash tells apart what it cuts off).
MAX_ID_FRAGMENT = 64

Assignment = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class SysctlRange:
    """A sysctl a scenario may set in the sender: its ``name``, the whole numbers it takes (``low`` to ``high``,
    as the kernel's handler bounds it) and what it does."""

    name: str
    low: int
    high: int
    meaning: str

    @property
    def path(self) -> str:
        """Its file under ``/proc/sys``."""
        return "/proc/sys/" + self.name.replace(".", "/")


#: The sysctls a scenario may set (each per network namespace), with the ranges Linux 6.1 takes.
SENDER_SYSCTLS: dict[str, SysctlRange] = {s.name: s for s in (
    SysctlRange("net.ipv4.tcp_limit_output_bytes", 0, 2**31 - 1, "TSQ: bytes a socket may have in the qdisc and "
                "device queues"),
    SysctlRange("net.ipv4.tcp_pacing_ss_ratio", 0, 1000, "pacing rate in slow start, % of cwnd/RTT"),
    SysctlRange("net.ipv4.tcp_pacing_ca_ratio", 0, 1000, "pacing rate in congestion avoidance, % of cwnd/RTT"),
    SysctlRange("net.ipv4.tcp_min_tso_segs", 1, 255, "the fewest segments a TSO frame is sized for"),
    SysctlRange("net.ipv4.tcp_tso_win_divisor", 0, 255, "a TSO frame may take 1/N of the congestion window"),
    SysctlRange("net.ipv4.tcp_notsent_lowat", 0, 2**32 - 1, "unsent bytes a socket holds before it stops being "
                "writable"),
    SysctlRange("net.ipv4.tcp_autocorking", 0, 1, "coalesce small writes while the device queue is busy"),
    SysctlRange("net.ipv4.tcp_slow_start_after_idle", 0, 1, "restart from the initial window after an idle RTO"),
)}
#: Sysctls refused with a pointer to what sets them instead.
_ELSEWHERE = {"net.core.default_qdisc": "sender_qdiscs sets the sender's root qdisc",
              "net.ipv4.tcp_congestion_control": "ccas sets each run's congestion control",
              "net.ipv4.tcp_no_metrics_save": "every run sets it to 1 (bbrlab.run.sender)"}


def _whole(field_name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is a whole number (not a bool) from ``low`` to ``high``; else an error naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(field_name, value, f"a whole number, {low} <= {field_name.rsplit('.', 1)[-1]} <= {high}")
    return value


def check_sysctl(name: object, value: object, field_name: str = "sender_sysctls") -> int:
    """``value`` if ``name`` is one of :data:`SENDER_SYSCTLS` and the value is in its range; else a
    :class:`ValidationError` naming ``field_name.name`` and what is allowed."""
    if not isinstance(name, str) or name not in SENDER_SYSCTLS:
        why = _ELSEWHERE.get(name) if isinstance(name, str) else None
        raise ValidationError(f"{field_name}.{name}", value, f"one of {', '.join(SENDER_SYSCTLS)}"
                              + (f" ({why})" if why else ""))
    s = SENDER_SYSCTLS[name]
    return _whole(f"{field_name}.{name}", value, s.low, s.high)


def check_param(name: object, value: object, field_name: str = "cca_params") -> int:
    """``value`` if ``name`` is a module parameter's name (:data:`PARAM_NAME`) and the value a whole number from 0
    to :data:`MAX_PARAM`; else a :class:`ValidationError` naming ``field_name.name``."""
    if not isinstance(name, str) or not PARAM_NAME.fullmatch(name):
        raise ValidationError(f"{field_name}.{name}", value, "a module parameter's name: [a-z][a-z0-9_]{0,63}")
    return _whole(f"{field_name}.{name}", value, 0, MAX_PARAM)


def assignment(value: object, field_name: str, check) -> Assignment:
    """An assignment from a mapping of names to values (or the pairs themselves), each checked by
    ``check(name, value, field_name)``; the pairs in name order."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list | tuple) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
        pairs = [tuple(p) for p in value]
    else:
        raise ValidationError(field_name, value, "a mapping of names to whole numbers")
    if len({n for n, _ in pairs}) != len(pairs):
        raise ValidationError(field_name, value, "each name once")
    return tuple(sorted((n, check(n, v, field_name)) for n, v in pairs))


def as_dict(pairs: Assignment) -> dict[str, int]:
    """An assignment as a record holds it: a mapping in name order."""
    return dict(pairs)


def _short(name: str) -> str:
    """A sysctl's name in a run id: without ``net.ipv4.tcp_`` (``limit_output_bytes``)."""
    for prefix in ("net.ipv4.tcp_", "net.ipv4.", "net.core."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def params_tag(pairs: Assignment) -> str:
    """The module parameters in a run id, after the CCA: ``deficit_gain512-`` (at most :data:`MAX_ID_FRAGMENT`
    characters); empty without any."""
    return "".join(f"{n}{v}-" for n, v in pairs)[:MAX_ID_FRAGMENT]


def sysctls_tag(pairs: Assignment) -> str:
    """The sysctls in a run id, at its end: ``-limit_output_bytes262144`` (at most :data:`MAX_ID_FRAGMENT`
    characters); empty without any."""
    return "".join(f"-{_short(n)}{v}" for n, v in pairs)[:MAX_ID_FRAGMENT]


def as_text(pairs: Assignment) -> str | None:
    """An assignment as one canonical text, ``name=value`` in name order joined by ``,`` (the ``runs`` table's
    cell); None for an empty one."""
    return ",".join(f"{n}={v}" for n, v in pairs) or None
