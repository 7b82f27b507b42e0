"""``metadata.flow`` and ``metadata.flows``: where the run's own flow (flow 0) went, as the run recipe
(:mod:`bbrlab.run.runner`) set it up, and what became of the flows beside it (:mod:`bbrlab.run.flows`).

The client's ports and the receiver's address are known before the traffic; the server's port and the account
the receiving end ran as once its server is up (:meth:`FlowRecord.served_by`), so a run that failed before
that has the first three alone. Records made before the receiving end ran as its own account lack the account.
"""

from __future__ import annotations

from dataclasses import dataclass

from bbrlab.core import recordjson


@dataclass
class FlowRecord:
    """The run's flow: its ``workload`` (iperf3, rsync), the sender's ``client_ports``, the receiver's
    ``server_ip`` and ``server_port``, and who the receiving end ran as: ``receiver_user``, the account's
    ``receiver_user_note`` (None for an unprivileged account of its own) and ``receiver_caps`` (the
    capabilities it kept). The three receiver keys are written together, the note null included."""

    workload: str
    client_ports: list[int]
    server_ip: str
    server_port: int | None = recordjson.left_out_when_none()
    receiver_user: str | None = recordjson.left_out_when_none()
    receiver_user_note: str | None = None
    receiver_caps: list[str] | None = recordjson.left_out_when_none()

    def served_by(self, port: int, user: str, note: str | None, caps) -> None:
        """The server's ``port`` and the account its receiving end ran as (``user``, ``note``, ``caps``)."""
        self.server_port, self.receiver_user, self.receiver_user_note = port, user, note
        self.receiver_caps = list(caps)

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The fields in their order; the server's port and the receiver's account only once known (the
        account's note, null included, exactly when its user is written)."""
        return recordjson.record_layout(source, handler, read=dict, write=_note_with_user)


def _note_with_user(d: dict) -> dict:
    return d if "receiver_user" in d else {k: v for k, v in d.items() if k != "receiver_user_note"}


@dataclass(frozen=True)
class FlowOutcome:
    """One flow beside flow 0 as the run record's ``metadata.flows`` lists it: its ``index`` (1 first), the
    flow as asked (:class:`~bbrlab.scenario.competition.ExtraFlow`'s fields in their order, ``start_s``
    there being the measured start after flow 0's [s]), the start asked (``asked_start_s``), its iperf3 JSON
    (``file``), the server's and the client's ports, the CCA iperf3 reported (``iperf_sender``) and its
    receiver throughput [Mbit/s]."""

    index: int
    cca: str
    streams: int
    start_s: float | None
    duration_s: int | float
    origin: str
    asked_start_s: int | float
    file: str
    server_port: int
    client_ports: list[int]
    iperf_sender: str | None
    throughput_mbit: float
