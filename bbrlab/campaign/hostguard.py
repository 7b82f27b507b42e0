"""The host guard: a run during which this machine was busy with work outside the testbed is not recorded
as ok, but as a failed attempt "host busy", and the campaign tries it again after the runs queued behind it.

Every run on a testbed whose sender's QEMU runs on this machine records the CPU used outside the testbed
during its transfer (``metadata.host_other``, :mod:`bbrlab.contention.outside`). The spec key::

    host_guard: {max_other_busy_pct: 25}   # the default; or off

fails a run whose ``other_busy_pct`` (share of all the host's CPUs) exceeded the limit. Its record (in
``failed/``) keeps the measured value and the busiest processes outside the testbed; ``metadata.host_guard``
says what was checked. A host-busy attempt is an attempt like any other: a run gets at most ``max_attempts``
of them, and after a few runs in a row fail every attempt the campaign stops with the reason (the campaign's
failure streak), so a host that stays busy ends the campaign instead of burning its plan.

Why 25 % (measured on the 2-core development machine, 2026-11-28; the table in docs/run-record.md, "Host load
outside the testbed"): 8 testbed runs of 2 s on a quiet host read 0.0-0.48 %; the same 8 runs beside one
busy loop outside the testbed read 37.0-62.4 %. See :data:`DEFAULT_MAX_OTHER_BUSY_PCT`.

A spec that leaves the key out gets the default, unless the environment variable ``BBRLAB_HOST_GUARD`` says
otherwise (``off``, or a number: the limit); the test suite sets it to ``off``: its ordinary tests check
mechanisms, and its shared 2-core machine was busy outside the testbed most of the time (median 97.5 % in 2 s
samples while other developers' suites ran). A spec's own ``host_guard`` always wins over the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from bbrlab.contention import outside
from bbrlab.core import recordjson
from bbrlab.core.errors import ValidationError
from bbrlab.run.campaignadded import HostGuardVerdict

#: The default limit, % of all the host's CPUs used outside the testbed during a transfer: far above a quiet
#: host's 0.0-0.48 % (and the measure's own error, up to 5 % low), below the 37.0-62.4 % of one busy loop.
DEFAULT_MAX_OTHER_BUSY_PCT = 25.0
#: The environment variable that replaces the default for specs that leave ``host_guard`` out.
ENV = "BBRLAB_HOST_GUARD"
#: The reason a host-busy attempt is recorded with starts so (:func:`is_host_busy`).
REASON_PREFIX = "host busy"


@dataclass(frozen=True)
class HostGuard:
    """The guard's setting: a run fails when more than ``max_other_busy_pct`` % of the host's CPUs went to
    processes outside the testbed during its transfer; None: off."""

    max_other_busy_pct: float | None = DEFAULT_MAX_OTHER_BUSY_PCT

    @classmethod
    def from_value(cls, value: object, field_name: str = "host_guard") -> HostGuard:
        """``off`` or ``{max_other_busy_pct: N}`` (0 < N <= 100); anything else is a :class:`ValidationError`
        naming the field and what is allowed."""
        if value == "off" or value is False:
            return cls(None)
        if not isinstance(value, dict):
            raise ValidationError(field_name, value, "off, or {max_other_busy_pct: N} with 0 < N <= 100")
        unknown = sorted(set(value) - {"max_other_busy_pct"})
        if unknown:
            raise ValidationError(f"{field_name}.{unknown[0]}", value[unknown[0]],
                                  "a known key: max_other_busy_pct")
        limit = value.get("max_other_busy_pct", DEFAULT_MAX_OTHER_BUSY_PCT)
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit <= 100:
            raise ValidationError(f"{field_name}.max_other_busy_pct", limit,
                                  "a number, 0 < max_other_busy_pct <= 100 (% of all the host's CPUs)")
        return cls(float(limit))

    def to_value(self) -> object:
        """The spec's form: ``off`` or the mapping."""
        return "off" if self.max_other_busy_pct is None else {"max_other_busy_pct": self.max_other_busy_pct}


def effective(guard: HostGuard | None) -> HostGuard:
    """The guard a campaign runs with: the spec's own, else ``BBRLAB_HOST_GUARD`` (``off`` or a number),
    else the default."""
    if guard is not None:
        return guard
    env = os.environ.get(ENV, "").strip()
    if not env:
        return HostGuard()
    if env == "off":
        return HostGuard(None)
    try:
        number = float(env)
    except ValueError:
        raise ValidationError(ENV, env, "off, or a number 0 < N <= 100") from None
    return HostGuard.from_value({"max_other_busy_pct": number}, ENV)


def verdict(metadata: dict, guard: HostGuard) -> dict | None:
    """What the guard says of an ok run's ``metadata`` (``metadata.host_guard``, a
    :class:`~bbrlab.run.campaignadded.HostGuardVerdict` as JSON); None when it does not apply
    (off, or nothing was measured: a lab whose sender's hypervisor is another machine)."""
    measured = (metadata.get("host_other") or {}).get("other_busy_pct")
    if guard.max_other_busy_pct is None or measured is None:
        return None
    return recordjson.to_json(HostGuardVerdict(max_other_busy_pct=guard.max_other_busy_pct, other_busy_pct=measured,
                                               busy=measured > guard.max_other_busy_pct))


def busy_reason(metadata: dict, guard: HostGuard) -> str:
    """The failed attempt's reason: the value, the limit, the busiest processes outside the testbed."""
    other = metadata["host_other"]
    top = ", ".join(f"{p['comm']} (pid {p['pid']}) {p['cpu_pct']} %" for p in other.get("top", [])[:3])
    return (f"{REASON_PREFIX}: {other['other_busy_pct']} % of the host's {other.get('cpus')} CPUs went to "
            f"processes outside the testbed during the transfer, above host_guard.max_other_busy_pct "
            f"{guard.max_other_busy_pct:g} %; busiest: {top or 'none named (short-lived processes)'}. "
            "The run is tried again after the runs queued behind it (at most max_attempts attempts); "
            "host_guard: off records such runs as ok")


def is_host_busy(reason: str | None) -> bool:
    """Whether a failed attempt's reason is the guard's."""
    return bool(reason) and reason.startswith(REASON_PREFIX + ":")


def _local_testbed_processes():
    """The processes of the local testbed ``$BBRLAB_TESTBED`` (default ``local``) when it is up, so that its
    own QEMUs are not taken for other work; else only this process's tree."""
    name = os.environ.get("BBRLAB_TESTBED") or "local"
    if os.path.sep not in name and not name.endswith((".yaml", ".yml")):
        try:
            from bbrlab import testbed

            return outside.of_testbed(testbed.load(name))
        except Exception:  # noqa: BLE001 - not up, or no such testbed: nothing of it runs here
            pass
    return outside.Ours()


def host_load_check(seconds: float = 1.5):
    """``bbrlab doctor``'s check of how busy this machine's CPUs are right now outside the testbed
    (``seconds`` of /proc): a :class:`~bbrlab.testbed.doctor.Check` that warns above the default limit,
    where a campaign's runs would fail as "host busy"."""
    from bbrlab.testbed.doctor import Check

    found = outside.sample_now(_local_testbed_processes(), seconds)
    line = busy_now_line(found, HostGuard())
    if line:
        return Check("host load", "warn", line, "wait for that work to end, or stop it, before a campaign")
    return Check("host load", "ok", f"{found['other_busy_pct']} % of the {found['cpus']} CPUs went to work "
                                    f"outside the testbed over {found['window_s']} s")


def busy_now_line(found: dict, guard: HostGuard) -> str | None:
    """A warning for ``bbrlab doctor`` and a campaign's start when a sample of the host right now
    (:func:`bbrlab.contention.outside.sample_now`) is above the guard's limit (or above the default when the
    guard is off); None when the host is quiet enough."""
    limit = guard.max_other_busy_pct or DEFAULT_MAX_OTHER_BUSY_PCT
    pct = found.get("other_busy_pct")
    if pct is None or pct <= limit:
        return None
    top = ", ".join(f"{p['comm']} (pid {p['pid']}) {p['cpu_pct']} %" for p in found.get("top", [])[:3])
    return (f"the host is busy now: {pct} % of its {found.get('cpus')} CPUs went to processes outside the "
            f"testbed over {found.get('window_s')} s (limit {limit:g} %); "
            f"busiest: {top or 'short-lived processes'}")


def judged(finished, guard: HostGuard):
    """An ok :class:`~bbrlab.campaign.attempt.Finished` as the guard sees it: with ``metadata.host_guard`` when
    it applies, and failed "host busy" when the host was above the limit (the same object when it does not
    apply)."""
    said = verdict(finished.metadata, guard)
    if said is None:
        return finished
    metadata = {**finished.metadata, "host_guard": said}
    if not said["busy"]:
        return replace(finished, metadata=metadata)
    return replace(finished, status="failed", reason=busy_reason(metadata, guard), metadata=metadata)
