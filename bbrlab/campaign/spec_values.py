"""The checks of a campaign spec's single values (its scalar keys, its testbed, a kernel's name), apart from
the spec itself (:mod:`bbrlab.campaign.spec`, which checks its lists and their combinations). Each check
names the spec's key in its error.
"""

from __future__ import annotations

import os
from pathlib import Path

from bbrlab.core.errors import ValidationError
from bbrlab.scenario.link import EMULATOR_OFFLOADS
from bbrlab.scenario.scenario import (
    DEFAULT_SAMPLER,
    Contention,
    Flow,
    IperfParams,
    Link,
    RsyncParams,
    Scenario,
    check_bottleneck_ms,
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


def check_testbed(value: object, base: Path | None) -> str | None:
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


def sampling(d: dict) -> dict:
    """``sample_ms`` and ``sampler``; the older ``sample_ss_ms: N`` means ``sample_ms: N, sampler: ss``."""
    out: dict = {}
    if d.get("sample_ss_ms") is not None:
        if d.get("sample_ms") is not None or "sampler" in d:
            raise ValidationError("sample_ss_ms", d["sample_ss_ms"], "absent when sample_ms or sampler is given "
                                  "(sample_ss_ms: N is the older form of sample_ms: N with sampler: ss)")
        d = {"sample_ms": d["sample_ss_ms"], "sampler": "ss"}
        key = "sample_ss_ms"
    else:
        key = "sample_ms"
    if d.get("sample_ms") is not None:
        out["sample_ms"] = number(key, d["sample_ms"], integer=True)
    if "sampler" in d:
        out["sampler"] = d["sampler"]
    try:
        Flow("cubic", sample_ms=out.get("sample_ms"), sampler=out.get("sampler", DEFAULT_SAMPLER))
    except ValidationError as e:
        raise rename_field(e, key if e.field.endswith("sample_ms") else e.field.split(".")[-1]) from None
    return out


def kernel_name(value: object) -> str:
    """A sender kernel as a spec names it: a Debian kernel's name, or the path of a kernel directory or
    .deb (checked for real, and downloaded if need be, by ``testbed.check_kernel`` when the campaign starts)."""
    from bbrlab.kernel.sender import KERNEL_NAMES

    if isinstance(value, str) and (value in KERNEL_NAMES or "/" in value or value.endswith(".deb")):
        Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow("cubic"), kernel=value)
        return value
    raise ValidationError("kernel", value, f"one of {', '.join(KERNEL_NAMES)}, or the path of a kernel directory "
                          "or linux-image .deb (with a '/')")


def check_scalars(d: dict) -> dict:
    """The spec's scalar keys present in ``d`` (a loaded spec), each checked and named in its error."""
    out: dict = {}
    if isinstance(d.get("repetitions"), dict):
        from .repetitions import RepetitionRule

        out["adaptive"] = RepetitionRule.from_value(d["repetitions"])
        out["repetitions"] = out["adaptive"].max_reps
    elif "repetitions" in d:
        out["repetitions"] = number("repetitions", d["repetitions"], integer=True)
        if not 1 <= out["repetitions"] <= 1000:
            raise ValidationError("repetitions", out["repetitions"], "1 <= repetitions <= 1000")
    if "duration_s" in d:
        out["duration_s"] = number("duration_s", d["duration_s"])
        try:
            IperfParams(duration_s=out["duration_s"])
        except ValidationError as e:
            raise rename_field(e, "duration_s") from None
    out.update(sampling(d))
    for key in ("file_mb", "transfer_timeout_s"):
        if key in d:
            out[key] = number(key, d[key])
            try:
                RsyncParams(**{key: out[key]})
            except ValidationError as e:
                raise rename_field(e, key) from None
    if "vcpu_trace" in d:
        try:
            out["vcpu_trace"] = Flow("cubic", vcpu_trace=d["vcpu_trace"]).vcpu_trace
        except ValidationError as e:
            raise rename_field(e, "vcpu_trace") from None
    if "bottleneck_ms" in d:
        check_bottleneck_ms(d["bottleneck_ms"], "bottleneck_ms")
        out["bottleneck_ms"] = d["bottleneck_ms"]
    if "order" in d:
        if d["order"] not in ORDERS:
            raise ValidationError("order", d["order"], f"one of {', '.join(ORDERS)}")
        out["order"] = d["order"]
    if "seed" in d:
        out["seed"] = number("seed", d["seed"], integer=True)
        if not 0 <= out["seed"] < 2**63:
            raise ValidationError("seed", out["seed"], "0 <= seed < 2**63")
    if "host_guard" in d:
        from .hostguard import HostGuard

        out["host_guard"] = HostGuard.from_value(d["host_guard"])
    if "max_attempts" in d:
        out["max_attempts"] = number("max_attempts", d["max_attempts"], integer=True)
        if not 1 <= out["max_attempts"] <= 10:
            raise ValidationError("max_attempts", out["max_attempts"], "1 <= max_attempts <= 10")
    if "delay_split" in d:
        if d["delay_split"] not in ("symmetric", "forward"):
            raise ValidationError("delay_split", d["delay_split"], "symmetric or forward")
        out["delay_split"] = d["delay_split"]
    if "emulator_offloads" in d:
        out["emulator_offloads"] = emulator_offloads(d["emulator_offloads"])
    if "description" in d:
        if not isinstance(d["description"], str) or len(d["description"]) > MAX_DESCRIPTION_CHARS:
            raise ValidationError("description", d["description"], f"text of at most {MAX_DESCRIPTION_CHARS} "
                                  "characters")
        out["description"] = d["description"]
    return out


def emulator_offloads(value: object) -> str:
    """``off`` or ``on``; YAML reads them unquoted as false and true, which mean the same."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value not in EMULATOR_OFFLOADS:
        raise ValidationError("emulator_offloads", value, "off or on (TSO, GSO and GRO on the emulator's ports; "
                              "unquoted in YAML they read as false and true, which are taken too)")
    return value
