"""The inflight-deficit module parameters: names, defaults, allowed ranges.

They mirror ``kernels/bbr1/inflight-deficit.patch`` (the kernel checks the same bounds on every
write to ``/sys/module/<name>/parameters/*``); bbrlab checks them first so a bad value is refused
with a message naming the parameter before anything on a host changes. Gains are in BBR's fixed
point, 1/256 (``BBR_UNIT``): 739 = 2.89, BBR's high gain; the kernel's ``pacing_gain`` field has
10 bits, so 1023 (~4.0) is the most it can hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core.errors import ValidationError

BBR_UNIT = 256


@dataclass(frozen=True)
class ParamSpec:
    """One module parameter of the patched BBR: its default, its largest allowed value, and what it means."""

    name: str
    default: int
    max: int
    meaning: str


DEFICIT_PARAMS: dict[str, ParamSpec] = {p.name: p for p in (
    ParamSpec("deficit_enable", 1, 1, "raise pacing_gain while smoothed inflight < BDP (0 = stock bbr)"),
    ParamSpec("deficit_gain", 739, 1023, "pacing_gain during a deficit, in 1/256 (739 = 2.89)"),
    ParamSpec("deficit_probe_bw_only", 1, 1, "act only in PROBE_BW"),
    ParamSpec("deficit_skip_app_limited", 1, 1, "never act while the flow is app-limited"),
    ParamSpec("deficit_probe_rtt_holdoff_rtts", 3, 15, "rounds after PROBE_RTT before acting"),
    ParamSpec("deficit_ewma_shift", 2, 4, "inflight EWMA weight 1/2^shift (0 = no smoothing)"),
    ParamSpec("deficit_exclude_retrans", 1, 1, "inflight without retransmitted bytes (0 = paper's literal formula)"),
)}


def param_limit(name: str) -> int:
    """The largest value bbrlab lets module parameter ``name`` take: its :data:`DEFICIT_PARAMS` bound, else
    ``2**31 - 1`` (a researcher's own parameter: any non-negative ``int``)."""
    spec = DEFICIT_PARAMS.get(name)
    return spec.max if spec else 2**31 - 1


def validate_params(available: list[str], params: dict[str, object]) -> dict[str, int]:
    """Check names against what the module offers and values against the known bounds.

    ``available`` is the list of parameter files of the loaded module. Parameters bbrlab does not
    know (a researcher's own) must be non-negative integers.
    """
    out: dict[str, int] = {}
    for name, value in params.items():
        if name not in available:
            raise ValidationError(f"params.{name}", value, f"one of the module's parameters: {sorted(available)}")
        upper = param_limit(name)
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                value = int(str(value), 0)
            except ValueError:
                raise ValidationError(f"params.{name}", value, f"an integer 0..{upper}") from None
        if not 0 <= value <= upper:
            raise ValidationError(f"params.{name}", value, f"an integer 0..{upper}")
        out[name] = value
    return out
