"""The sender's knobs held for one run: the module parameters of its CCA (``Scenario.cca_params``) and its
sysctls (``Scenario.sender_sysctls``), issue #38.

:func:`held` checks every value against its bounds (:mod:`bbrlab.scenario.knobs`, and
:func:`bbrlab.kernel.params.param_limit` for the parameters bbrlab knows), then reads what each file holds in one
command on the sender: a parameter the module does not have, or a sysctl the kernel does not offer, stops the run
there, before anything changed. A second command writes each value and reads each back; a value that does not
read back as asked fails the run. Whatever happens in the block (the run failing, a signal), every file written
gets back the value it had before, in one more command, read back too; a restore that does not take fails a run
that succeeded, and is noted on the error of one that did not.

A CCA's module is ``tcp_<cca>`` for the kernel's own congestion controls (``tcp_cubic``, ``tcp_bbr``) and the
CCA's own name for a module bbrlab loads (``bbr2b``): :func:`module_of`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.kernel.params import param_limit
from bbrlab.scenario.knobs import SENDER_SYSCTLS
from bbrlab.scenario.scenario import Scenario

from .sender import STOCK_CCAS

#: bash, fixed text; the files arrive as "$@". Each file's value, or that it is missing, one line each.
_READ = r"""
for p in "$@"; do
    v=; if [[ -f $p && -r $p ]] && read -r v < "$p"; then echo "value:$p=$v"; else echo "missing:$p="; fi
done
"""
#: bash, fixed text; "$@" is file, value, file, value ... Writes each (stops at the first the kernel refuses),
#: then reads every file back. ``printf`` is bash's own: one write() of the value and its newline.
_WRITE = r"""
args=("$@")
for ((i = 0; i < $#; i += 2)); do
    if printf '%s\n' "${args[i+1]}" 2>/dev/null > "${args[i]}"; then echo "wrote:${args[i]}="
    else echo "refused:${args[i]}="; break; fi
done
for ((i = 0; i < $#; i += 2)); do
    v=; read -r v < "${args[i]}"; echo "value:${args[i]}=$v"
done
"""


class SenderKnobsError(TestbedError):
    """A module parameter or sysctl could not be set, read back or restored in the sender (the message says
    which)."""


@dataclass(frozen=True)
class KnobValue:
    """One value a run set in the sender: what it ``asked``, what the file held ``before`` (put back after the
    run) and what it read back once set (``read``), as the kernel printed them."""

    asked: int
    before: str
    read: str


@dataclass(frozen=True)
class SenderKnobs:
    """``metadata.knobs``: what the run set in the sender, written field for field. ``module`` is the module whose
    ``params`` were set (None without any); ``sysctls`` are by their dotted names."""

    module: str | None
    params: dict[str, KnobValue]
    sysctls: dict[str, KnobValue]


@dataclass(frozen=True)
class _Knob:
    """One file to set: its ``kind`` (params or sysctls), its ``name`` there, its ``path`` and the value."""

    kind: str
    name: str
    path: str
    value: int


def module_of(cca: str) -> str:
    """The module a CCA's parameters live in: ``tcp_<cca>`` for the kernel's own CCAs, else the CCA's name."""
    return f"tcp_{cca}" if cca in STOCK_CCAS else cca


def param_path(cca: str, name: str) -> str:
    """The file of module parameter ``name`` of ``cca``'s module."""
    return f"/sys/module/{module_of(cca)}/parameters/{name}"


def missing(host: Host, paths: list[str]) -> list[str]:
    """The files of ``paths`` that ``host`` does not have (or cannot read), in one command; changes nothing."""
    if not paths:
        return []
    status, _ = _values(host.output(["bash", "-c", _READ, "bbrlab-knobs", *paths], sudo=True, timeout=60))
    return [p for p in paths if status.get(p) != "value"]


def _knobs(scenario: Scenario) -> list[_Knob]:
    """The files ``scenario`` sets, each value checked against its bounds (nothing on a host yet)."""
    out = []
    for name, value in scenario.cca_params:
        if value > param_limit(name):
            raise ValidationError(f"cca_params.{name}", value, f"a whole number, 0 <= {name} <= {param_limit(name)}")
        out.append(_Knob("params", name, param_path(scenario.flow.cca, name), value))
    out += [_Knob("sysctls", name, SENDER_SYSCTLS[name].path, value) for name, value in scenario.sender_sysctls]
    return out


def _values(out: str) -> tuple[dict[str, str], dict[str, str]]:
    """``(status by file, value by file)`` of a script's ``status:file=value`` lines."""
    status, values = {}, {}
    for line in out.splitlines():
        head, sep, value = line.partition("=")
        kind, _, path = head.partition(":")
        if sep and path:
            status[path] = kind if kind != "value" else status.get(path, "value")
            if kind == "value":
                values[path] = value.strip()
    return status, values


def _reads_as(read: str, value: int) -> bool:
    """Whether the kernel's text ``read`` is ``value`` (a bool parameter prints Y or N)."""
    read = {"Y": "1", "N": "0"}.get(read, read)
    return read.lstrip("-").isdigit() and int(read) == value


def _write(host: Host, pairs: list[tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """Write ``(file, value)`` pairs in order and read every file back: ``(status, value)`` by file."""
    args = [x for pair in pairs for x in pair]
    return _values(host.output(["bash", "-c", _WRITE, "bbrlab-knobs", *args], sudo=True, timeout=60))


@contextmanager
def held(host: Host, scenario: Scenario) -> Iterator[SenderKnobs]:
    """The module parameters and sysctls of ``scenario`` set in ``host`` for the block and read back (their
    record), each file back to its value before on every exit (see the module docstring)."""
    knobs = _knobs(scenario)
    status, before = _values(host.output(["bash", "-c", _READ, "bbrlab-knobs", *(k.path for k in knobs)],
                                         sudo=True, timeout=60))
    missing = [k for k in knobs if status.get(k.path) != "value"]
    if missing:
        raise SenderKnobsError(f"{host.name}: " + "; ".join(
            f"{k.path} does not exist (module {module_of(scenario.flow.cca)} has no parameter {k.name}, or it is "
            "not loaded)" if k.kind == "params" else f"{k.path} does not exist (the kernel has no {k.name})"
            for k in missing))
    written: list[_Knob] | None = None  # None: not known (the write's command failed)
    try:
        status, read = _write(host, [(k.path, str(k.value)) for k in knobs])
        written = [k for k in knobs if status.get(k.path) == "wrote"]
        refused = [k for k in knobs if status.get(k.path) == "refused"]
        if refused:
            raise SenderKnobsError(f"{host.name}: the kernel refused {refused[0].value} for {refused[0].path}")
        wrong = [f"{k.path} asked {k.value}, read back {read.get(k.path)!r}" for k in knobs
                 if not _reads_as(read.get(k.path, ""), k.value)]
        if wrong:
            raise SenderKnobsError(f"{host.name}: " + "; ".join(wrong))
        yield _record(scenario, knobs, before, read)
    except BaseException as e:
        _restore(host, knobs if written is None else written, before, note_on=e)
        raise
    _restore(host, written, before)


def _record(scenario: Scenario, knobs: list[_Knob], before: dict[str, str], read: dict[str, str]) -> SenderKnobs:
    """The record of what was asked, what each file held before and what it read back."""
    parts: dict[str, dict[str, KnobValue]] = {"params": {}, "sysctls": {}}
    for k in knobs:
        parts[k.kind][k.name] = KnobValue(k.value, before[k.path], read[k.path])
    return SenderKnobs(module_of(scenario.flow.cca) if scenario.cca_params else None, parts["params"],
                       parts["sysctls"])


def _restore(host: Host, knobs: list[_Knob], before: dict[str, str], note_on: BaseException | None = None) -> None:
    """Each of ``knobs`` back to its value ``before``, read back; an error is raised, or noted on ``note_on``."""
    if not knobs:
        return
    try:
        status, read = _write(host, [(k.path, before[k.path]) for k in knobs])
        wrong = [f"{k.path} read {read.get(k.path)!r}, not {before[k.path]!r}" for k in knobs
                 if status.get(k.path) != "wrote" or read.get(k.path) != before[k.path]]
        if wrong:
            raise SenderKnobsError(f"{host.name}: restoring what the run set failed: " + "; ".join(wrong))
    except Exception as e:
        if note_on is None:
            raise
        note_on.add_note(f"restoring the sender's module parameters and sysctls failed too: {e}")
