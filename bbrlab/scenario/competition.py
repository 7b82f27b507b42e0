"""What shares the sender's side of the bottleneck with the contended flow: the sender's qdisc, and the
flows beside the scenario's own (the fairness runs of issue #29).

``sender_qdisc`` is the root qdisc of the sender's experiment interface during the run: ``default`` (what
the sender's kernel puts there: ``net.core.default_qdisc`` under ``mq`` or alone) or ``fq`` (Linux's fair
queue, which paces each socket at its pacing rate: pacing for Cubic, and BBR's classic companion). bbrlab
sets it before the run, reads it back and restores the default after the run (bbrlab.run.senderqdisc).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from bbrlab.core.errors import ValidationError

#: As :data:`bbrlab.scenario.scenario.CCA_NAME` (which imports this module).
CCA_NAME = re.compile(r"[a-z][a-z0-9_]{0,14}")

#: The sender qdiscs a scenario can ask for.
SENDER_QDISCS = ("default", "fq")
DEFAULT_SENDER_QDISC = "default"


def check_sender_qdisc(value: object, field_name: str = "sender_qdisc") -> str:
    """``value`` if it is one of :data:`SENDER_QDISCS`; else a :class:`ValidationError` naming the field."""
    if not isinstance(value, str) or value not in SENDER_QDISCS:
        raise ValidationError(field_name, value, "one of default (the sender kernel's own root qdisc) or fq "
                              "(fair queueing with per-socket pacing, set as the root qdisc of the sender's "
                              "experiment interface)")
    return value


#: Where an extra flow is sent from: the contended sender VM, or an uncontended competitor sender on the
#: sender's side of the bottleneck (on the local testbed a network namespace: docs/competition.md).
ORIGINS = ("sender", "competitor")
#: At most this many flows beside the scenario's own (each is an iperf3 client and server of its own).
MAX_EXTRA_FLOWS = 8


@dataclass(frozen=True)
class ExtraFlow:
    """An iperf3 flow beside the scenario's own (which is flow 0, from the sender, at 0 s).

    ``cca`` its congestion control, ``streams`` its parallel connections, ``start_s`` its start after flow 0
    started [s], ``duration_s`` its transfer time [s, whole seconds as iperf3 counts], ``origin`` one of
    :data:`ORIGINS`. Errors name the field as ``flows[i].<name>`` (``i`` counts from 1, flow 0 being the
    scenario's own)."""

    cca: str
    streams: int = 1
    start_s: float = 0.0
    duration_s: float = 20.0
    origin: str = "competitor"

    def validate(self, index: int) -> None:
        """Check each field; ``index`` names the flow in an error."""
        name = f"flows[{index}]"
        if not isinstance(self.cca, str) or not CCA_NAME.fullmatch(self.cca):
            raise ValidationError(f"{name}.cca", self.cca, "a congestion control name: [a-z][a-z0-9_]{0,14}")
        if isinstance(self.streams, bool) or not isinstance(self.streams, int) or not 1 <= self.streams <= 128:
            raise ValidationError(f"{name}.streams", self.streams, "a whole number from 1 to 128")
        if isinstance(self.start_s, bool) or not isinstance(self.start_s, int | float) or not 0 <= self.start_s <= 3600:
            raise ValidationError(f"{name}.start_s", self.start_s, "0 <= start_s <= 3600 s after flow 0 started")
        if (isinstance(self.duration_s, bool) or not isinstance(self.duration_s, int | float)
                or not 1 <= self.duration_s <= 3600 or self.duration_s != int(self.duration_s)):
            raise ValidationError(f"{name}.duration_s", self.duration_s, "a whole number of seconds from 1 to 3600")
        if self.origin not in ORIGINS:
            raise ValidationError(f"{name}.origin", self.origin, "sender (the contended sender VM) or competitor "
                                  "(an uncontended sender on the sender's side of the bottleneck)")

    def to_dict(self) -> dict:
        """The flow as recorded (and hashed into the run id)."""
        return asdict(self)

    @property
    def id_tag(self) -> str:
        """The flow in a run id: ``-and-cubic-comp3s`` (``snd`` from the sender)."""
        return f"-and-{self.cca}-{'comp' if self.origin == 'competitor' else 'snd'}{self.start_s:g}s"


def extra_flows(value: object, field_name: str = "flows") -> tuple[ExtraFlow, ...]:
    """Extra flows from a scenario's or spec's ``flows`` (a list of mappings or :class:`ExtraFlow`), each checked."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > MAX_EXTRA_FLOWS:
        raise ValidationError(field_name, value, f"a list of at most {MAX_EXTRA_FLOWS} flows, each a mapping of "
                              "cca, streams, start_s, duration_s, origin")
    out = []
    for i, f in enumerate(value, start=1):
        if isinstance(f, dict):
            unknown = set(f) - {x.name for x in fields(ExtraFlow)}
            if unknown or "cca" not in f:
                raise ValidationError(f"{field_name}[{i}]", f, "a mapping with cca and optionally streams, start_s, "
                                      "duration_s, origin")
            f = ExtraFlow(**f)
        if not isinstance(f, ExtraFlow):
            raise ValidationError(f"{field_name}[{i}]", f, "a mapping of cca, streams, start_s, duration_s, origin")
        f.validate(i)
        out.append(f)
    return tuple(out)


def scenario_extras(sender_qdisc: str, flows: tuple[ExtraFlow, ...], main_flow) -> None:
    """Check a scenario's sender qdisc and extra flows together with its own flow (an iperf3 transfer: the
    extra flows are iperf3's, and each must start before flow 0 ends)."""
    check_sender_qdisc(sender_qdisc)
    extra_flows(list(flows))
    if flows and not main_flow.params.competes:
        raise ValidationError("flows", [f.to_dict() for f in flows], f"none beside an {main_flow.workload} flow "
                              "(extra flows are iperf3 transfers next to an iperf3 flow 0)")
    for i, f in enumerate(flows, start=1):
        if f.start_s >= main_flow.params.duration_s:
            raise ValidationError(f"flows[{i}].start_s", f.start_s, f"0 <= start_s < flow 0's duration_s "
                                  f"({main_flow.params.duration_s:g} s): a flow that starts later never competes")


def scenario_dict(sender_qdisc: str, flows: tuple[ExtraFlow, ...]) -> dict:
    """The keys a scenario records for these (none at their defaults, so earlier run ids do not change)."""
    out: dict = {}
    if sender_qdisc != DEFAULT_SENDER_QDISC:
        out["sender_qdisc"] = sender_qdisc
    if flows:
        out["flows"] = [f.to_dict() for f in flows]
    return out


def id_tags(sender_qdisc: str, flows: tuple[ExtraFlow, ...]) -> str:
    """The run id's part for these: ``-fq`` for the fq qdisc, then each extra flow's tag."""
    return ("-fq" if sender_qdisc == "fq" else "") + "".join(f.id_tag for f in flows)
