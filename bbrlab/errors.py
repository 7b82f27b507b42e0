"""Exceptions shared by every bbrlab module.

Every error a researcher can cause by input is a :class:`ValidationError` that names the
field, the value given and what is allowed, and is raised before anything on the testbed
changes.
"""

from __future__ import annotations


class BbrlabError(Exception):
    """Base class: something bbrlab cannot do, with a message meant for a person."""


class ValidationError(BbrlabError, ValueError):
    """A parameter is out of range or malformed.

    ``field`` is the dotted name of the parameter (``link.rtt_ms``, ``ccas[2]``), ``allowed``
    describes the accepted range or form.
    """

    def __init__(self, field: str, value: object, allowed: str, hint: str = ""):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.hint = hint
        msg = f"{field} = {value!r} is not allowed: {allowed}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)

    def __reduce__(self):
        """Pickled with its fields, so it crosses process boundaries intact (a Dask worker's check)."""
        return type(self), (self.field, self.value, self.allowed, self.hint)


def key_name(key: object) -> str:
    """A mapping key as a field name: the key itself when it is plain text, else its repr (``''``, ``1``)."""
    return key if isinstance(key, str) and key.strip() and key.isprintable() else repr(key)


class TestbedError(BbrlabError):
    """The testbed is missing, not reachable, or not in the state an operation needs."""


class RunFailed(BbrlabError):
    """Something that must hold for a valid measurement did not; the message is the run record's reason."""
