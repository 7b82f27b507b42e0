"""Parse the human forms of quantities used on the command line and in specs.

Each parser returns a plain number in the unit its name says (``parse_time_ms`` returns
milliseconds) and raises :class:`~bbrlab.core.errors.ValidationError` naming the field otherwise.
Bare numbers are taken in the function's unit.
"""

from __future__ import annotations

import math
import re

from .errors import ValidationError

_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"

_TIME_TO_MS = {"": 1.0, "ms": 1.0, "s": 1000.0, "sec": 1000.0, "us": 1e-3, "usec": 1e-3, "ns": 1e-6}
_RATE_TO_MBIT = {
    "": 1.0, "mbit": 1.0, "mbps": 1.0, "mbit/s": 1.0,
    "kbit": 1e-3, "kbps": 1e-3, "kbit/s": 1e-3,
    "gbit": 1e3, "gbps": 1e3, "gbit/s": 1e3,
    "bit": 1e-6, "bps": 1e-6,
}
_SIZE_TO_BYTES = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
                  "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def _split(field: str, text: object, units: dict, allowed: str) -> float:
    if isinstance(text, bool):
        raise ValidationError(field, text, allowed)
    if isinstance(text, int | float):
        value, unit = float(text), ""
    else:
        m = re.fullmatch(_NUMBER + r"\s*([a-zA-Z/%]*)", str(text).strip())
        if not m or m.group(2).lower() not in units:
            raise ValidationError(field, text, allowed)
        value, unit = float(m.group(1)), m.group(2).lower()
    if not math.isfinite(value):
        raise ValidationError(field, text, allowed)
    return value * units[unit]


def parse_time_ms(text: object, field: str = "time") -> float:
    """``"20ms"``, ``"0.5s"``, ``"500us"`` or a number of ms -> milliseconds."""
    return _split(field, text, _TIME_TO_MS, "a duration such as 20ms, 0.5s or 500us")


def parse_rate_mbit(text: object, field: str = "rate") -> float:
    """``"50mbit"``, ``"1gbit"``, ``"500kbit"`` or a number of Mbit/s -> Mbit/s."""
    return _split(field, text, _RATE_TO_MBIT, "a rate such as 50mbit, 1gbit or 500kbit")


def parse_size_bytes(text: object, field: str = "size") -> int:
    """``"64k"``/``"64KiB"`` (1024), ``"64kb"`` (1000), or a number of bytes -> bytes."""
    return int(round(_split(field, text, _SIZE_TO_BYTES, "a size such as 1500, 64k or 1MiB")))


def parse_percent(text: object, field: str = "percent") -> float:
    """``"25%"``, ``"25"`` -> 25.0 (percent)."""
    return _split(field, text, {"": 1.0, "%": 1.0}, "a percentage such as 25% or 0.1")


def parse_buffer(text: object, field: str = "buffer") -> tuple[float | None, int | None]:
    """``"1bdp"`` -> (1.0, None); ``"64k"`` -> (None, 65536). Returns (buffer_bdp, buffer_bytes)."""
    s = str(text).strip().lower()
    if s.endswith("bdp"):
        return _split(field, s[:-3], {"": 1.0}, "a buffer such as 1bdp, 0.5bdp or 256k"), None
    return None, parse_size_bytes(text, field)
