"""CPU contention for the sender VM: SCHED_DEADLINE on its vCPU threads, as in the paper (section 4.2).

Every vCPU thread gets runtime = timeslice and period = timeslice / share, so the vCPU runs at most
``timeslice`` out of every ``period``; its deadline is the runtime (``deadline_mode`` constrained, the paper's
setting: the timeslice must run at the period's start) or the period (implicit: anywhere in the period). The
policy read back from the kernel (runtime, deadline and period) is in the record. A share of 100 % means no
policy at all.

The usual way in is the context manager::

    with contended(hypervisor_host, vcpu_tids, Contention(timeslice_ms=1, cpu_share_pct=25)) as c:
        run_iperf(...)
    meta.contention = c.record()           # a ContentionRecord: requested, applied (read back), evidence

What it does, in order:

1. check everything it can *before* changing anything: the thread ids, each one's identity (process, name,
   start time: pinned now, or checked against the pins of hand-given vCPU threads), the contention against
   the target host's live limits (``sched_deadline_period_{min,max}_us``, ``sched_rt_runtime_us`` x CPUs),
   and each thread's current policy (read and kept for restoring);
2. apply the policy thread by thread, each change made only while the thread id still names the pinned
   thread (checked at the syscall), and read it back from the kernel; if the kernel refuses one
   (admission control, permissions, a thread that vanished or was replaced) the threads already changed
   are restored and the refusal is explained;
3. while the body runs, optionally check the policy every ``watch_interval_s``; at the end read the
   policy back again and the CPU time each thread used (``/proc/<tid>/schedstat``) against wall time;
4. restore the previous policies on normal exit, on exceptions, on Ctrl-C (SIGINT), SIGTERM and SIGHUP;
   a thread stays listed until it is restored, and one failing thread does not stop the others.

Where the VM runs on this machine the syscalls are used directly (:mod:`bbrlab.contention.sched`); on another
hypervisor host the same is done with ``chrt`` through :class:`~bbrlab.core.hosts.Host` (``method="chrt"``).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from bbrlab.core import recordjson
from bbrlab.core.errors import BbrlabError, TestbedError, ValidationError
from bbrlab.core.hosts import Host
from bbrlab.core.signals import restore_on_signals
from bbrlab.scenario.cpumodels import deadline as deadline_model
from bbrlab.scenario.cpumodels import none as no_contention
from bbrlab.scenario.scenario import Contention

from . import cgroups
from .accounting import drift_note
from .evidence import (
    AchievedShare,
    ContentionEvidence,
    ContentionRecord,
    EvidenceMissing,
    ThreadEvidence,
    steal_note,
)
from .limits import KernelLimits, check_fits, read_kernel_limits
from .sched import (
    DeadlineAdmissionError,
    SchedError,
    SchedPolicy,
    ThreadGoneError,
    ThreadReplacedError,
    explain_refusal,
)
from .schedulers import Method, deadline_threads, scheduler_for
from .threadstat import ThreadIdentity, ThreadUsage, read_identities, sample_threads, usage_between
from .vcpu import explicit_vcpu_threads
from .watch import PolicyWatch


class ContentionRestoreError(BbrlabError):
    """Restoring the previous policy failed on at least one thread (the message lists them)."""


# -- one application of contention ------------------------------------------------------------------

def _validate_thread_ids(thread_ids: Sequence[object]) -> list[int]:
    tids = explicit_vcpu_threads(list(thread_ids), field="thread_ids")
    if len(set(tids)) != len(tids):
        raise ValidationError("thread_ids", tids, "distinct thread ids (each listed once)")
    return tids


@dataclass
class ContentionSession:
    """Contention applied to some threads of one host; knows how to prove it held and how to undo it.

    Use :func:`contended` rather than calling the steps yourself, unless the policy is meant to
    outlive the Python process (``bbrlab contention set``).

    Each thread id is pinned to the thread holding it: ``expected`` (the pins of hand-given vCPU thread
    ids, :func:`bbrlab.contention.vcpu.pin_given_threads`) or, without it, the identity read by :meth:`prepare`.
    A thread id that names another thread is refused before anything changes, and every policy change
    re-checks the pin at the moment of the syscall (or of ``chrt`` on the host), restoring included.
    """

    host: Host
    thread_ids: list[int]
    contention: Contention
    method: Method = "auto"
    limits: KernelLimits | None = None
    previous: dict[int, SchedPolicy] = field(default_factory=dict)
    applied: dict[int, SchedPolicy] = field(default_factory=dict)
    evidence: ContentionEvidence | EvidenceMissing | None = None
    expected: dict[int, ThreadIdentity] | None = None
    identities: dict[int, ThreadIdentity] = field(default_factory=dict)
    accelerator: str | None = None
    _changed: list[int] = field(default_factory=list)
    _start: dict = field(default_factory=dict)
    _watch: PolicyWatch | None = None

    #: The models this session applies: deadline, and none (nothing applied at 100 %, the usage measured all
    #: the same); :data:`bbrlab.contention.models.SESSIONS` is filled from it, :func:`contended` opens it.
    MODELS = (deadline_model.MODEL.name, no_contention.MODEL.name)

    def __post_init__(self):
        if not isinstance(self.contention, Contention):
            raise ValidationError("contention", self.contention, "a bbrlab.scenario.scenario.Contention")
        self.thread_ids = _validate_thread_ids(self.thread_ids)
        self.scheduler = scheduler_for(self.host, self.method)

    @property
    def wanted(self) -> SchedPolicy:
        """The deadline policy the contention asks for on every thread."""
        c = self.contention
        return SchedPolicy.deadline(c.runtime_ns, c.deadline_ns, c.period_ns)

    def prepare(self) -> None:
        """Read limits and current policies and check everything; changes nothing."""
        self.limits = read_kernel_limits(self.host)
        check_fits(self.contention, self.limits, len(self.thread_ids))
        self.identities = self._identify()
        self.previous = {tid: self.scheduler.get(tid) for tid in self.thread_ids}
        if self.contention.unlimited:
            self.refuse_leftover_deadline("a 100 % share run would not be uncontended")

    def _identify(self) -> dict[int, ThreadIdentity]:
        """Each thread's identity now, checked against ``expected``: the pins every change re-checks."""
        now = read_identities(self.host, self.thread_ids)
        pins = {}
        for tid in self.thread_ids:
            if tid not in now:
                raise explain_refusal(errno.ESRCH, tid, None)
            pinned = (self.expected or {}).get(tid)
            differences = pinned.differences(now[tid]) if pinned else []
            if differences:
                raise ThreadReplacedError(
                    f"{self.host.name}: thread id {tid} no longer names the pinned {pinned.describe()}: now "
                    f"{'; '.join(differences)}. Nothing was changed", tid=tid, err=errno.ESRCH)
            pins[tid] = pinned or now[tid]
        return pins

    def refuse_leftover_deadline(self, why: str) -> None:
        """Raise if a thread was already under SCHED_DEADLINE before this session (read by :meth:`prepare`)."""
        leftover = [tid for tid, p in self.previous.items() if p.is_deadline]
        if leftover:
            raise TestbedError(
                f"{self.host.name}: thread(s) {leftover} are still under SCHED_DEADLINE (left by "
                f"`bbrlab contention set`, or by hand?), so {why}; "
                f"run `bbrlab contention clear --threads {','.join(map(str, leftover))}` first")

    def apply(self) -> None:
        """Apply to every thread and read back; on any failure restore what changed and re-raise."""
        if self.limits is None:
            self.prepare()
        try:
            if not self.contention.unlimited:
                for tid in self.thread_ids:
                    self._apply_one(tid)
            self.applied = {tid: self.scheduler.get(tid) for tid in self.thread_ids}
        except DeadlineAdmissionError as e:
            context = self._admission_context(e.tid)
            self._restore_after(e)
            raise explain_refusal(e.errno, e.tid, self.wanted, context) from e
        except BaseException as e:
            self._restore_after(e)
            raise
        self._start = sample_threads(self.host, self.thread_ids)

    def _restore_after(self, error: BaseException) -> None:
        """Restore after a failed apply without hiding the failure that caused it."""
        try:
            self.restore()
        except ContentionRestoreError as e:
            error.add_note(str(e))

    def _apply_one(self, tid: int) -> None:
        # Noted as changed before the call, so a signal arriving during it still restores this thread.
        self._changed.append(tid)
        self.scheduler.set(tid, self.wanted, self.identities.get(tid))
        got = self.scheduler.get(tid)
        if not got.same_policy_as(self.wanted):
            raise TestbedError(f"{self.host.name}: thread {tid} reads back {got.describe()} "
                               f"after setting {self.wanted.describe()}")

    def _admission_context(self, refused_tid: int) -> str:
        """The admission arithmetic, measured on the host, for an EBUSY on ``refused_tid``."""
        asked = self.contention.bandwidth
        done = [t for t in self._changed if t != refused_tid]
        others = [t for t in deadline_threads(self.host) if t not in self.thread_ids]
        other_bw = 0.0
        for tid in others:
            try:
                other_bw += self.scheduler.get(tid).bandwidth
            except SchedError:
                pass
        lim = self.limits
        cap = lim.capacity_cpus
        cap_text = ("no limit (sched_rt_runtime_us = -1)" if cap is None else
                    f"{100 * cap:.0f} % = {lim.online_cpus} CPU(s) x sched_rt_runtime_us {lim.rt_runtime_us} / "
                    f"sched_rt_period_us {lim.rt_period_us}")
        visible = other_bw + asked * len(done) + lim.fair_server_cpus
        return (f"Asked {100 * asked:.1f} % per thread for {len(self.thread_ids)} thread(s) "
                f"({100 * asked * len(self.thread_ids):.1f} % in all; {len(done)} already admitted when "
                f"thread {refused_tid} was refused). The host allows {cap_text}. Other SCHED_DEADLINE "
                f"threads hold {100 * other_bw:.1f} % ({len(others)} thread(s): {others[:8]}). Linux >= 6.12 "
                f"(this host: {lim.kernel_release}) also reserves the fair server's bandwidth, by default "
                f"5 % per CPU. {drift_note(self.host, visible)}. The threads changed so far were restored")

    def start_watch(self, interval_s: float | None) -> None:
        """Check the policy of every thread every ``interval_s`` until :meth:`finish` (None: don't)."""
        if interval_s is None or self.contention.unlimited:
            return
        self._watch = PolicyWatch(self.scheduler, dict(self.applied), interval_s, self.host, dict(self.identities))
        self._watch.start()

    def finish(self) -> ContentionEvidence:
        """Read the policy back and the CPU each thread used since :meth:`apply`; store and return it."""
        watch = None
        if self._watch is not None:
            watch = self._watch.stop()
            self._watch = None
        end = sample_threads(self.host, self.thread_ids)
        threads = [self._thread_evidence(tid, end) for tid in self.thread_ids]
        held = all(t.held for t in threads) and not (watch and (watch.deviations or watch.stalls))
        foreign = cgroups.foreign_limits(self.thread_ids) if self.host.is_local else None
        self.evidence = ContentionEvidence(self.scheduler.name, held, 100.0 if self.contention.unlimited else
                                           self.contention.cpu_share_pct, threads, watch,
                                           AchievedShare.of(threads, steal_note(self.accelerator)),
                                           foreign_limits=foreign)
        return self.evidence

    def _thread_evidence(self, tid: int, end: dict) -> ThreadEvidence:
        """Thread ``tid``'s policy read back now and the CPU it used between :meth:`apply` and ``end``."""
        try:
            after, gone = self.scheduler.get(tid), False
            held = after.same_policy_as(self.applied.get(tid, after))
        except ThreadGoneError:
            after, held, gone = None, False, True
        if tid not in self._start or tid not in end:
            return ThreadEvidence(tid, after, held, gone)
        usage = usage_between(self._start[tid], end[tid])
        return ThreadEvidence(tid, after, held and usage.same_thread, gone, usage,
                              got_cpu=usage.same_thread and usage.cpu_s > 0)

    def restore(self) -> None:
        """Give every changed thread its previous policy back. Safe to call more than once.

        A thread leaves the list of changed threads only once it is restored (or gone: a thread that
        exited, or whose id names another thread now, has nothing to restore). A failure on one thread
        does not stop the others; the threads that failed stay listed and one
        :class:`ContentionRestoreError` names them all at the end."""
        problems = []
        for tid in reversed(list(self._changed)):
            try:
                self._restore_one(tid)
            except ThreadGoneError:
                pass  # nothing left to restore
            except Exception as e:  # noqa: BLE001 - any failure is reported below; the other threads go on
                problems.append(f"thread {tid}: {e}")
                continue
            if tid in self._changed:
                self._changed.remove(tid)
        if problems:
            raise ContentionRestoreError(f"{self.host.name}: could not restore the previous policy of "
                                         f"{len(problems)} thread(s), still under the run's policy: "
                                         + "; ".join(problems))

    def _restore_one(self, tid: int) -> None:
        self.scheduler.set(tid, self.previous[tid], self.identities.get(tid))
        got = self.scheduler.get(tid)
        if not got.same_policy_as(self.previous[tid]):
            raise TestbedError(f"reads back {got.describe()} after restoring {self.previous[tid].describe()}")

    @property
    def unrestored(self) -> list[int]:
        """Threads changed and not (yet) restored."""
        return list(self._changed)

    def record(self) -> ContentionRecord:
        """The ``metadata.contention`` part of a run record (docs/run-record.md; ``to_dict()`` for its JSON)."""
        return ContentionRecord(self.contention, self.host.name, self.scheduler.name, self.limits,
                                dict(self.previous), dict(self.applied), self.evidence)

@contextmanager
def contended(
    host: Host,
    thread_ids: Sequence[int],
    contention: Contention,
    *,
    method: Method = "auto",
    handle_signals: bool = True,
    watch_interval_s: float | None = 1.0,
    expected: dict[int, ThreadIdentity] | None = None,
    accelerator: str | None = None,
) -> Iterator[ContentionSession]:
    """Run the ``with`` body with ``contention`` on ``thread_ids`` of ``host``; restore afterwards.

    Raises before changing anything if the input or the host's limits rule the request out, or a thread id
    no longer names the thread ``expected`` pins it to (hand-given vCPU thread ids).
    The yielded :class:`ContentionSession` has ``applied`` (read back) during the body, and after
    it ``evidence`` and :meth:`~ContentionSession.record` for the run record. ``accelerator`` (the sender
    VM's: ``kvm``, ``tcg``) says in the evidence why the guest's steal time is not a number.
    """
    session = ContentionSession(host, list(thread_ids), contention, method=method, expected=expected,
                                accelerator=accelerator)
    session.prepare()
    # Restoring means giving back the policy found; a deadline policy found is a leftover, not a baseline.
    session.refuse_leftover_deadline("the run would hand it back that policy afterwards")
    with held(session, handle_signals=handle_signals, start=lambda: session.start_watch(watch_interval_s)):
        yield session


@contextmanager
def held(session, *, handle_signals: bool = True, start: Callable[[], None] | None = None) -> Iterator:
    """Apply a prepared contention ``session`` (any model: ``apply``, ``finish``, ``restore``), run the ``with``
    body (after ``start``, e.g. a watch), then collect its evidence and restore on every exit, signals included
    when ``handle_signals``. Evidence that cannot be collected is recorded as missing; a restore that fails
    after the body failed names that failure too."""
    with restore_on_signals(session.restore) if handle_signals else nullcontext():
        session.apply()
        failure: BaseException | None = None
        try:
            if start is not None:
                start()
            yield session
        except BaseException as e:
            failure = e
            raise
        finally:
            try:
                session.finish()
            except BbrlabError as e:
                session.evidence = EvidenceMissing(f"could not collect evidence: {e}")
            finally:
                _restore_after_body(session, failure)


def _restore_after_body(session: ContentionSession, failure: BaseException | None) -> None:
    """Restore; a restore that fails after the body failed names that failure too (it would be lost)."""
    try:
        session.restore()
    except ContentionRestoreError as e:
        if failure is None:
            raise
        raise ContentionRestoreError(f"{e} (after the run failed: {type(failure).__name__}: {failure})") from failure


# -- one-shot operations (the CLI) -------------------------------------------------------------------

def show_policies(host: Host, thread_ids: Sequence[int], method: Method = "auto") -> dict[int, SchedPolicy]:
    """Current policy of each thread."""
    scheduler = scheduler_for(host, method)
    return {tid: scheduler.get(tid) for tid in _validate_thread_ids(thread_ids)}


@dataclass(frozen=True)
class DeadlineCleared:
    """What clearing the deadline policy after a failed run did (``metadata.contention.after_failure`` of its
    record, ``RunMetadata.deadline_after_failure``): the thread ids put back to SCHED_OTHER, or the ``error``
    that kept them from being cleared; the other key is left out."""

    deadline_cleared_tids: list[int] | None = recordjson.left_out_when_none()
    error: str | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The key that was measured, the other left out (:func:`bbrlab.core.recordjson.record_layout`)."""
        return recordjson.record_layout(source, handler)


def clear_deadline(host: Host, thread_ids: Sequence[int], method: Method = "auto") -> list[int]:
    """Put every listed thread that is under SCHED_DEADLINE back to SCHED_OTHER; return those changed."""
    scheduler = scheduler_for(host, method)
    cleared = []
    for tid in _validate_thread_ids(thread_ids):
        current = scheduler.get(tid)
        if current.is_deadline:
            scheduler.set(tid, SchedPolicy("SCHED_OTHER", nice=current.nice))
            cleared.append(tid)
    return cleared


def measure_usage(host: Host, thread_ids: Sequence[int], duration_s: float) -> list[ThreadUsage]:
    """CPU each thread used over the next ``duration_s`` (a measurement interval, not a wait for readiness)."""
    tids = _validate_thread_ids(thread_ids)
    first = sample_threads(host, tids)
    time.sleep(duration_s)
    last = sample_threads(host, tids)
    return [usage_between(first[t], last[t]) for t in tids if t in first and t in last]
