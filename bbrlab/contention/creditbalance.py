"""The credit model's balance: :class:`CreditController` settles a credit balance from the CPU time some threads
use and switches a quota between none (``burst``) and the baseline when the balance runs out or is earned back;
:class:`CreditReport` (its :class:`CreditSwitch` es and :class:`CreditPhase` s) is what it did.

It needs only the threads' ids (their CPU time is read from ``/proc/<tid>/schedstat`` on this machine) and a
function that writes the quota, so it runs wherever those exist: under :class:`~bbrlab.contention.credit.CreditSession`
on a hypervisor host, and alone beside a cgroup v2 hierarchy in a guest (tests/system/test_cgroup_v2_guest.py).
Standard library, :mod:`bbrlab.scenario.contention_models` and :mod:`bbrlab.core.errors` only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bbrlab.core.errors import TestbedError
from bbrlab.scenario.contention_models import CREDIT_REARM_FRACTION


@dataclass(frozen=True)
class CreditSwitch:
    """The credit controller switched the quota ``to`` ``burst`` (no quota) or ``baseline`` (the share's quota),
    ``after_s`` seconds after the contention was applied (``at_unix_s``: the host's wall clock, to line it up
    with a transfer's intervals), the balance then being ``balance_s``; ``error`` when the kernel refused it."""

    to: str
    after_s: float
    at_unix_s: float
    balance_s: float
    error: str | None = None

    def to_dict(self) -> dict:
        """The record's JSON of this switch (``error`` only when it failed)."""
        return {k: v for k, v in asdict(self).items() if k != "error" or v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> CreditSwitch:
        """A switch read from a record."""
        return cls(d["to"], d["after_s"], d["at_unix_s"], d["balance_s"], d.get("error"))


@dataclass(frozen=True)
class CreditPhase:
    """One stretch of a credit run in one ``state`` (``burst`` or ``baseline``), from ``from_s`` to ``to_s``
    after the contention was applied: the CPU the vCPU threads used in it (``cpu_s``, summed) and the share of a
    CPU per thread that is (``achieved_share_pct``)."""

    state: str
    from_s: float
    to_s: float
    cpu_s: float
    achieved_share_pct: float

    def to_dict(self) -> dict:
        """The record's JSON of this phase."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CreditPhase:
        """A phase read from a record."""
        return cls(d["state"], d["from_s"], d["to_s"], d["cpu_s"], d["achieved_share_pct"])


@dataclass(frozen=True)
class CreditReport:
    """What the credit controller did over the body: ``ticks`` settlements of the balance, the balance at the
    end (``balance_end_s``, CPU-seconds; below 0 when the last tick overdrew it), each ``switch`` and each
    ``phase`` between them (``switches_dropped``: switches beyond the record's cap, counted only)."""

    ticks: int
    balance_end_s: float
    switches: list[CreditSwitch] = field(default_factory=list)
    phases: list[CreditPhase] = field(default_factory=list)
    switches_dropped: int = 0

    @property
    def ran_out_after_s(self) -> float | None:
        """When the balance was first spent (the first switch to baseline), None when it lasted."""
        return next((s.after_s for s in self.switches if s.to == "baseline" and s.error is None), None)

    def to_dict(self) -> dict:
        """The record's JSON (``evidence.credit``)."""
        return {"ticks": self.ticks, "balance_end_s": self.balance_end_s, "ran_out_after_s": self.ran_out_after_s,
                "switches": [s.to_dict() for s in self.switches], "phases": [p.to_dict() for p in self.phases],
                "switches_dropped": self.switches_dropped}

    @classmethod
    def from_dict(cls, d: dict) -> CreditReport:
        """A credit report read from a record."""
        return cls(d["ticks"], d["balance_end_s"], [CreditSwitch.from_dict(x) for x in d["switches"]],
                   [CreditPhase.from_dict(x) for x in d["phases"]], d.get("switches_dropped", 0))


#: A run records at most this many switches (the others are counted in ``switches_dropped``).
MAX_SWITCHES = 50


def _cpu_ns(thread_ids: list[int]) -> int:
    """The CPU time the threads have used so far, summed (``/proc/<tid>/schedstat``; a vanished thread: 0)."""
    total = 0
    for tid in thread_ids:
        try:
            total += int(Path(f"/proc/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


class CreditController(threading.Thread):
    """Settles the credit balance every ``tick_s`` and switches the cgroup's quota between none (``burst``) and
    ``baseline_quota_us`` (``baseline``) through ``write_quota`` (quota or None). ``lock`` is held while the
    state and the quota change together, so a watch reading both never sees them apart."""

    def __init__(self, thread_ids: list[int], *, credit_s: float, baseline_pct: float, tick_s: float,
                 write_quota, baseline_quota_us: int):
        super().__init__(name="bbrlab-credit", daemon=True)
        self.thread_ids, self.credit_s, self.tick_s = list(thread_ids), credit_s, tick_s
        self.earn_cpu_s_per_s = baseline_pct / 100.0 * len(self.thread_ids)
        self.rearm_s = CREDIT_REARM_FRACTION * credit_s
        self.write_quota, self.baseline_quota_us = write_quota, baseline_quota_us
        self.lock = threading.RLock()
        self.state, self.balance_s, self.ticks, self.dropped = "burst", float(credit_s), 0, 0
        self.switches: list[CreditSwitch] = []
        self.phases: list[CreditPhase] = []
        self._t0 = time.monotonic()
        self._last_t, self._last_ns = self._t0, _cpu_ns(self.thread_ids)
        self._phase_from, self._phase_ns = 0.0, 0
        self._stop_event = threading.Event()

    def quota_now(self) -> int | None:
        """The quota the cgroup must have in the current state (None: no limit)."""
        return None if self.state == "burst" else self.baseline_quota_us

    def run(self) -> None:
        """Settle every ``tick_s`` until :meth:`stop`."""
        while not self._stop_event.wait(self.tick_s):
            self.tick()

    def tick(self) -> None:
        """Earn and spend since the last tick, then switch if the balance says so."""
        now, cpu_ns = time.monotonic(), _cpu_ns(self.thread_ids)
        used_ns = max(0, cpu_ns - self._last_ns)
        earned_s = self.earn_cpu_s_per_s * (now - self._last_t)
        with self.lock:
            self.ticks += 1
            self.balance_s = min(self.credit_s, self.balance_s + earned_s - used_ns / 1e9)
            self._phase_ns += used_ns
            self._last_t, self._last_ns = now, cpu_ns
            if self.state == "burst" and self.balance_s <= 0:
                self._switch("baseline", now)
            elif self.state == "baseline" and self.balance_s >= self.rearm_s:
                self._switch("burst", now)

    def _switch(self, to: str, now: float) -> None:
        quota = None if to == "burst" else self.baseline_quota_us
        error = None
        try:
            self.write_quota(quota)
        except TestbedError as e:
            error = str(e)
        switch = CreditSwitch(to, round(now - self._t0, 3), round(time.time(), 3), round(self.balance_s, 4), error)
        if len(self.switches) < MAX_SWITCHES:
            self.switches.append(switch)
        else:
            self.dropped += 1
        if error is None:
            self._close_phase(now)
            self.state = to

    def _close_phase(self, now: float) -> None:
        start, end = self._phase_from, now - self._t0
        wall = end - start
        share = 100.0 * self._phase_ns / 1e9 / (wall * len(self.thread_ids)) if wall > 0 else 0.0
        self.phases.append(CreditPhase(self.state, round(start, 3), round(end, 3), round(self._phase_ns / 1e9, 4),
                                       round(share, 2)))
        self._phase_from, self._phase_ns = end, 0

    def stop(self) -> CreditReport:
        """Stop, settle once more, close the last phase and report."""
        self._stop_event.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=2 * self.tick_s + 1)  # a signal's restore may interrupt a holder of the lock
        self.tick()
        with self.lock:
            self._close_phase(time.monotonic())
            return CreditReport(self.ticks, round(self.balance_s, 4), list(self.switches), list(self.phases),
                                self.dropped)
