"""The checks of a campaign spec's single values (a number, its testbed, a kernel's name, the emulator's
offloads), apart from the tables that use them (:mod:`bbrlab.campaign.dimensions`,
:mod:`bbrlab.campaign.settings`). Each check names the spec's key in its error.
"""

from __future__ import annotations

import os
from pathlib import Path

from bbrlab.core.errors import ValidationError
from bbrlab.scenario.link import EMULATOR_OFFLOADS
from bbrlab.scenario.scenario import (
    Contention,
    Flow,
    Link,
    Scenario,
)

ORDERS = ("blocked-random", "sequential", "random")
#: The longest ``description`` a spec may give, in characters (a paragraph; it travels with the spec everywhere).
MAX_DESCRIPTION_CHARS = 4000


def number(key: str, value: object, *, integer: bool = False) -> float | int:
    """``value`` when it is a number (a whole one with ``integer``), else an error naming ``key``."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValidationError(key, value, "a whole number" if integer else "a number")
    return value


def rename_field(e: ValidationError, key: str) -> ValidationError:
    """``e`` naming the spec's ``key`` instead of the dataclass field that refused the value."""
    return ValidationError(key, e.value, e.allowed)


def check_testbed(value: object, base: Path | None = None) -> str | None:
    """``None`` (the default testbed), a local testbed's name, or a testbed file relative to ``base``."""
    from bbrlab.testbed.local.state import NAME_RE

    if value is None:
        return None
    allowed = ("a local testbed's name (a-z first, then a-z, 0-9 or -; at most 12) or a testbed file "
               "(a path containing / or ending in .yaml, relative to the spec's folder)")
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\n\r\0"):
        raise ValidationError("testbed", value, allowed)
    if "/" not in value and not value.endswith((".yaml", ".yml")):
        if not NAME_RE.match(value):
            raise ValidationError("testbed", value, allowed)
        return value
    path = Path(os.path.expanduser(value))
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return os.path.normpath(path)


def kernel_name(value: object) -> str:
    """A sender kernel as a spec names it: a Debian kernel's name, or the path of a kernel directory or
    .deb (checked for real, and downloaded if need be, by ``testbed.check_kernel`` when the campaign starts)."""
    from bbrlab.kernel.sender import KERNEL_NAMES

    if isinstance(value, str) and (value in KERNEL_NAMES or "/" in value or value.endswith(".deb")):
        Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow("cubic"), kernel=value)
        return value
    raise ValidationError("kernel", value, f"one of {', '.join(KERNEL_NAMES)}, or the path of a kernel directory "
                          "or linux-image .deb (with a '/')")


def emulator_offloads(value: object) -> str:
    """``off`` or ``on``; YAML reads them unquoted as false and true, which mean the same."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value not in EMULATOR_OFFLOADS:
        raise ValidationError("emulator_offloads", value, "off or on (TSO, GSO and GRO on the emulator's ports; "
                              "unquoted in YAML they read as false and true, which are taken too)")
    return value
