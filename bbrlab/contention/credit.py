"""The credit model: CPU as burstable cloud instances sell it. The vCPU threads get full CPU while a credit
balance lasts; the balance earns credit at the baseline share and spends the CPU they use, so a busy vCPU drains
(100 - baseline) % of a CPU-second each second; once it is spent, the quota drops to the baseline (the share's
CFS quota), and full CPU comes back when :data:`~bbrlab.scenario.contention_models.CREDIT_REARM_FRACTION` of the
starting balance is earned again.

:class:`CreditSession` is :class:`~bbrlab.contention.cfs.CfsSession` with the cgroup made without a quota and a
:class:`~bbrlab.contention.creditbalance.CreditController` (its own module): a thread of the bbrlab process, for
the length of the run, that every :data:`~bbrlab.scenario.contention_models.CREDIT_TICK_S` reads the threads' CPU time
(``/proc/<tid>/schedstat``), settles the balance and writes the quota when the state changes. Every switch (when,
and the balance then) and the CPU the threads got in each phase go into the evidence (``evidence.credit``), so a
run shows its flow crossing from burst to baseline. The parameters (``credit_s``, the baseline, the earn rate, the
re-arm point, the tick) are recorded in ``applied_model``. Restoring stops the controller before the cgroup is
removed; a controller killed with its process (SIGKILL) leaves a ``bbrlab-cfs-`` cgroup that recovery clears as
cfs-quota's.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from bbrlab.scenario.contention_models import CREDIT_TICK_S
from bbrlab.scenario.cpumodels import credit

from .cfs import CfsSession
from .creditbalance import CreditController, CreditReport
from .evidence import ContentionEvidence


class CreditSession(CfsSession):
    """The credit model on ``thread_ids`` of ``host`` (this machine): a cfs session whose cgroup starts without
    a quota and whose :class:`CreditController` moves it between none and the baseline."""

    MODELS = (credit.MODEL.name,)
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
            self.thread_ids, credit_s=self.contention.params.credit_s, baseline_pct=self.contention.cpu_share_pct,
            tick_s=CREDIT_TICK_S, baseline_quota_us=self.quota_us,
            write_quota=lambda quota: hierarchy.set_limit(own.path, quota, self.period_us))
        self.read_back = {**self.read_back, **self.parameters()}
        self.controller.start()

    def parameters(self) -> dict:
        """The model's parameters as the record keeps them (``applied_model``)."""
        c = self.controller
        return {"credit_s": self.contention.params.credit_s, "baseline_pct": self.contention.cpu_share_pct,
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
