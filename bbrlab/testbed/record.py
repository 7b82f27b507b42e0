"""``metadata.testbed`` of a run record: the testbed as :meth:`bbrlab.testbed.roles.Testbed.record` measured it,
typed (:class:`TestbedRecord`).

Which keys a record holds depends on the testbed and on the record's age: a local testbed adds its details
(``image`` ... ``qemu_pids``), a lab does not; ``machine`` and ``emulator_boot_id`` came in 2026-11-28 (the
latter null when the emulator's boot id could not be read); ``sender_kernel_identity`` later than the local
details; the host-netns records of ``bbrlab.run/1`` have a ``note`` and their own key order. So a key is null in
some records and absent in others, and no one order fits all: :class:`TestbedRecord` remembers which keys its
JSON held, in their order (``keys``), and writes exactly those back. A record made now holds the keys in the
order they were measured (:meth:`TestbedRecord.of`, :meth:`TestbedRecord.update`).

``machine`` is the sender's hypervisor host (:class:`bbrlab.core.machine.Machine`), or
:class:`MachineUnreachable` when that host could not be read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from bbrlab.core.machine import Machine
from bbrlab.kernel.sender import SenderKernel


@dataclass(frozen=True)
class MachineUnreachable:
    """``metadata.testbed.machine`` when the sender's hypervisor host could not be read: why (``error``).
    It names no machine: its ``label``, ``machine_id`` and ``boot_id`` are None, as a record without one."""

    error: str
    label = None
    machine_id = None
    boot_id = None

    def to_dict(self) -> dict:
        """The record's JSON: ``{"error": ...}``."""
        return {"error": self.error}


@dataclass
class TestbedRecord:
    """The testbed a run ran on (``metadata.testbed``); every field None where the record lacks its key.

    Attributes
    ----------
    name, kind, accelerator, hypervisor : str or None
        The testbed's name, ``local``/``lab``/``host-netns``, kvm/tcg/unknown, what runs the sender VM.
    host_kernel : str or None
        ``uname -r`` of the machine that drives the testbed.
    image, guest_kernel, sender_vcpus, boot_to_ssh_s, sender_kernel_identity, qemu_pids
        A local testbed's details (:class:`bbrlab.testbed.roles.LocalDetails`): its guest image, the image's
        kernel, the sender's vCPUs, each VM's seconds from QEMU's start to SSH, the sender's kernel as booted,
        each role's QEMU pid.
    machine : Machine or MachineUnreachable or None
        The sender's hypervisor host (:mod:`bbrlab.core.machine`).
    sender_kernel, emulator_kernel, receiver_kernel : str or None
        Each role's ``uname -r`` (or ``"unreachable: ..."``); the sender's read again before each run.
    emulator_boot_id, sender_boot_id : str or None
        The emulator's boot id when the testbed was described, the sender's before the run.
    note : str or None
        What a ``bbrlab.run/1`` host-netns record says about its setup.
    keys : tuple of str
        The keys the JSON holds, in its order (see the module's text); not compared.
    """

    __test__ = False  # not a pytest test class, despite its name

    name: str | None = None
    kind: str | None = None
    accelerator: str | None = None
    hypervisor: str | None = None
    host_kernel: str | None = None
    image: str | None = None
    guest_kernel: str | None = None
    sender_vcpus: int | None = None
    boot_to_ssh_s: dict | None = None
    sender_kernel_identity: SenderKernel | None = None
    qemu_pids: dict | None = None
    machine: Machine | MachineUnreachable | None = None
    sender_kernel: str | None = None
    emulator_kernel: str | None = None
    receiver_kernel: str | None = None
    emulator_boot_id: str | None = None
    sender_boot_id: str | None = None
    note: str | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, **values: Any) -> TestbedRecord:
        """A record holding ``values``' keys, in the order given (None written as null)."""
        out = cls()
        out.update(**values)
        return out

    def update(self, **values: Any) -> None:
        """Set the fields ``values`` names; a key the record did not hold yet goes at its end, as a dict's would."""
        unknown = sorted(set(values) - _KEYS)
        if unknown:
            raise TypeError(f"metadata.testbed has no keys {unknown}")
        for key, value in values.items():
            setattr(self, key, value)
        self.keys = (*self.keys, *(k for k in values if k not in self.keys))

    def to_dict(self) -> dict:
        """The record's JSON: the keys it holds (``keys``), in their order."""
        return {k: _json_of(getattr(self, k)) for k in self.keys}

    @classmethod
    def from_dict(cls, d: dict) -> TestbedRecord:
        """Read ``metadata.testbed`` back, remembering its keys and their order; ValueError for a key it does
        not know."""
        unknown = sorted(set(d) - _KEYS)
        if unknown:
            raise ValueError(f"metadata.testbed keys {unknown} are not those of a run record")
        values = dict(d)
        identity, found = values.get("sender_kernel_identity"), values.get("machine")
        if isinstance(identity, dict):
            values["sender_kernel_identity"] = SenderKernel(**identity)
        if isinstance(found, dict):
            values["machine"] = MachineUnreachable(**found) if "error" in found else Machine(**found)
        return cls.of(**values)

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Where nested in a typed record, read and written by :meth:`from_dict` and :meth:`to_dict`
        (:func:`bbrlab.core.recordjson.own_layout`)."""
        from bbrlab.core.recordjson import own_layout

        return own_layout(cls)


#: The keys a record's ``metadata.testbed`` may hold.
_KEYS = frozenset(f.name for f in fields(TestbedRecord)) - {"keys"}


def _json_of(value: Any) -> Any:
    return value.to_dict() if isinstance(value, (Machine, MachineUnreachable, SenderKernel)) else value
