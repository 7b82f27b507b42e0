"""The credit model: CPU as burstable cloud instances sell it. The vCPU threads get full CPU while a credit
balance lasts; the balance earns credit at the baseline share and spends the CPU they use, so a busy vCPU drains
(100 - baseline) % of a CPU-second each second; once it is spent, the quota drops to the baseline (the share's
CFS quota), and full CPU comes back when :data:`~bbrlab.core.contention_models.CREDIT_REARM_FRACTION` of the
starting balance is earned again.

:class:`CreditSession` is :class:`~bbrlab.contention.cfs.CfsSession` with the cgroup made without a quota and a
:class:`CreditController`: a thread of the bbrlab process, for the length of the run, that every
:data:`~bbrlab.core.contention_models.CREDIT_TICK_S` reads the threads' CPU time (``/proc/<tid>/schedstat``),
settles the balance and writes the quota when the state changes. Every switch (when, and the balance then) and
the CPU the threads got in each phase go into the evidence (``evidence.credit``), so a run shows its flow crossing
from burst to baseline. The parameters (``credit_s``, the baseline, the earn rate, the re-arm point, the tick)
are recorded in ``applied_model``. Restoring stops the controller before the cgroup is removed; a controller
killed with its process (SIGKILL) leaves a ``bbrlab-cfs-`` cgroup that recovery clears as cfs-quota's.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from bbrlab.core.contention_models import CREDIT_REARM_FRACTION, CREDIT_TICK_S
from bbrlab.core.errors import TestbedError

from .cfs import CfsSession
from .evidence import ContentionEvidence, CreditPhase, CreditReport, CreditSwitch

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


class CreditSession(CfsSession):
    """The credit model on ``thread_ids`` of ``host`` (this machine): a cfs session whose cgroup starts without
    a quota and whose :class:`CreditController` moves it between none and the baseline."""

    MODELS = ("credit",)
    controller: CreditController | None = None
    report: CreditReport | None = None

    def initial_quota_us(self) -> int | None:
        """Full CPU at the start: the balance is full."""
        return None

    def expected_limit(self) -> tuple[int | None, int]:
        """The quota of the controller's state now (call with its lock held)."""
        return (self.controller.quota_now() if self.controller else None), self.period_us

    def started(self) -> None:
        """Start the controller once the threads are in the cgroup."""
        if self.own is None:
            return
        own, hierarchy = self.own, self.hierarchy
        self.controller = CreditController(
            self.thread_ids, credit_s=self.contention.credit_s, baseline_pct=self.contention.cpu_share_pct,
            tick_s=CREDIT_TICK_S, baseline_quota_us=self.quota_us,
            write_quota=lambda quota: hierarchy.set_limit(own.path, quota, self.period_us))
        self.read_back = {**self.read_back, **self.parameters()}
        self.controller.start()

    def parameters(self) -> dict:
        """The model's parameters as the record keeps them (``applied_model``)."""
        c = self.controller
        return {"credit_s": self.contention.credit_s, "baseline_pct": self.contention.cpu_share_pct,
                "baseline_quota_us": self.quota_us, "earn_cpu_s_per_s": round(c.earn_cpu_s_per_s, 6),
                "spend": "CPU time used by the vCPU threads", "rearm_s": round(c.rearm_s, 6),
                "tick_s": c.tick_s, "start_state": "burst"}

    def deviations(self) -> list[tuple[int, str]]:
        """The cfs check against the quota of the controller's state, read under its lock."""
        if self.controller is None:
            return super().deviations()
        with self.controller.lock:
            return super().deviations()

    def stop_controller(self) -> None:
        """Stop the controller (if it runs) and keep its report."""
        controller, self.controller = self.controller, None
        if controller is not None:
            self.report = controller.stop()

    def finish(self) -> ContentionEvidence:
        """cfs's evidence, checked against the quota of the state the controller ended in, with the watch's
        report and the controller's (a switch the kernel refused: the contention did not hold)."""
        watch = self.stop_watch()
        with self.controller.lock if self.controller is not None else nullcontext():
            evidence = super().finish()
        self.stop_controller()
        held = evidence.policy_held and not (watch and watch.deviations)
        if self.report is not None:
            held = held and not any(s.error for s in self.report.switches)
        self.evidence = replace(evidence, watch=watch, policy_held=held, credit=self.report)
        return self.evidence

    def restore(self) -> None:
        """Stop the controller first (it must not write to a cgroup being removed), then cfs's restore."""
        self.stop_controller()
        super().restore()
