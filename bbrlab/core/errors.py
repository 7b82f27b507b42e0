"""Exceptions shared by every bbrlab module.

Every error a researcher can cause by input is a :class:`ValidationError` that names the
field, the value given and what is allowed, and is raised before anything on the testbed
changes.
"""

from __future__ import annotations

import reprlib

#: At most this many characters of a value appear in an error message; longer ones end in :data:`ELISION`.
#: (A spec of a few hundred bytes can nest YAML aliases into a value whose full repr is hundreds of MB.)
MAX_VALUE_CHARS = 300
ELISION = "...[cut]"


def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset, r.maxfrozenset, r.maxdeque, r.maxarray = (
        4, 8, 8, 8, 8, 8, 8, 8)
    r.maxstring, r.maxother, r.maxlong = MAX_VALUE_CHARS, MAX_VALUE_CHARS, 80
    return r


_REPR = _bounded_repr()


def short_repr(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """``repr(value)`` for a message: never longer than ``limit`` characters (plus :data:`ELISION`), and built
    without ever making the full repr (nesting and long containers are cut while it is made)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails still gets a message
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[:limit] + ELISION


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
        msg = f"{short_repr(field, 200) if not isinstance(field, str) else _cut(field)} = {short_repr(value)} is not allowed: {_cut(allowed)}"
        if hint:
            msg += f" ({_cut(hint)})"
        super().__init__(msg)

    def __reduce__(self):
        """Pickled with its fields, so it crosses process boundaries intact (a Dask worker's check)."""
        return type(self), (self.field, self.value, self.allowed, self.hint)


def _cut(text: str, limit: int = 4 * MAX_VALUE_CHARS) -> str:
    """Text for a message, cut to ``limit`` characters (field names and descriptions may quote input too)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + ELISION


def key_name(key: object) -> str:
    """A mapping key as a field name: the key itself when it is plain text, else its repr (``''``, ``1``)."""
    return key if isinstance(key, str) and key.strip() and key.isprintable() else short_repr(key, 80)


class TestbedError(BbrlabError):
    """The testbed is missing, not reachable, or not in the state an operation needs."""


class RunFailed(BbrlabError):
    """Something that must hold for a valid measurement did not; the message is the run record's reason."""


class NotARunFailure(BbrlabError):
    """An error about the campaign, not about the run it was raised in (a campaign mixing testbeds): a run's
    failure boundary (:meth:`bbrlab.run.runmeta.RunMetadata.carried_by_errors`) lets it through as itself, and
    no failed attempt is recorded for it."""
