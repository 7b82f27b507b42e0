"""The scheduler syscalls ``sched_setattr(2)`` and ``sched_getattr(2)`` through ctypes.

glibc has no wrapper for these two, so they are called by number (x86_64: 314 and 315) with
the kernel's ``struct sched_attr``. They act on one *thread* (a tid), which is what a VM's
vCPU is; ``tid = 0`` means the calling thread.

A kernel refusal is turned into an exception that says what happened and why, in the terms a
researcher can act on:

* ``EBUSY``: deadline admission control found too little free SCHED_DEADLINE bandwidth
  (:class:`DeadlineAdmissionError`),
* ``EPERM``: no privilege, or the thread's CPU affinity is narrower than its root domain
  (:class:`SchedPermissionError`),
* ``ESRCH``: the thread no longer exists (:class:`ThreadGoneError`; :class:`ThreadReplacedError` when its
  id now names another thread than the one pinned),
* ``EINVAL``: parameters the kernel does not accept (:class:`SchedParamsError`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import asdict, dataclass

from bbrlab.core.errors import BbrlabError

# Syscall numbers per architecture (include/uapi/asm-generic/unistd.h and arch tables).
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}

SCHED_OTHER = 0
SCHED_FIFO = 1
SCHED_RR = 2
SCHED_BATCH = 3
SCHED_IDLE = 5
SCHED_DEADLINE = 6

POLICY_NAMES = {
    SCHED_OTHER: "SCHED_OTHER", SCHED_FIFO: "SCHED_FIFO", SCHED_RR: "SCHED_RR",
    SCHED_BATCH: "SCHED_BATCH", SCHED_IDLE: "SCHED_IDLE", SCHED_DEADLINE: "SCHED_DEADLINE",
}
POLICY_IDS = {name: pid for pid, name in POLICY_NAMES.items()}

SCHED_FLAG_RESET_ON_FORK = 0x01

#: Size of the first version of struct sched_attr (kernel 3.14); every kernel since accepts it.
SCHED_ATTR_SIZE_VER0 = 48


class _SchedAttr(ctypes.Structure):
    """``struct sched_attr`` (include/uapi/linux/sched/types.h), with the util-clamp tail."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


@dataclass(frozen=True)
class SchedPolicy:
    """A thread's scheduling policy as the kernel reports it (or as we ask for it).

    ``runtime_ns``, ``deadline_ns`` and ``period_ns`` matter only for SCHED_DEADLINE; ``nice``
    only for SCHED_OTHER / SCHED_BATCH; ``priority`` only for SCHED_FIFO / SCHED_RR.
    """

    policy: str = "SCHED_OTHER"
    nice: int = 0
    priority: int = 0
    runtime_ns: int = 0
    deadline_ns: int = 0
    period_ns: int = 0
    reset_on_fork: bool = False

    @property
    def is_deadline(self) -> bool:
        """Whether this is SCHED_DEADLINE (the only policy whose runtime, deadline and period count)."""
        return self.policy == "SCHED_DEADLINE"

    @property
    def bandwidth(self) -> float:
        """runtime / period for SCHED_DEADLINE (what admission control counts), else 0."""
        if not self.is_deadline or not self.period_ns:
            return 0.0
        return self.runtime_ns / self.period_ns

    @property
    def deadline_mode(self) -> str | None:
        """For SCHED_DEADLINE the kind of deadline: ``implicit`` (deadline = period) or ``constrained`` (deadline
        shorter than the period); None for the other policies."""
        if not self.is_deadline:
            return None
        return "implicit" if self.deadline_ns == self.period_ns else "constrained"

    @classmethod
    def deadline(cls, runtime_ns: int, deadline_ns: int, period_ns: int) -> SchedPolicy:
        """A SCHED_DEADLINE policy with the given runtime, deadline and period (all in ns)."""
        return cls("SCHED_DEADLINE", 0, 0, int(runtime_ns), int(deadline_ns), int(period_ns))

    def to_dict(self) -> dict:
        """Every field by name: the JSON of a policy in a run record (``metadata.contention`` rows and
        ``policy_after``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SchedPolicy:
        """The policy :meth:`to_dict` wrote (an unknown key raises ``TypeError``)."""
        return cls(**d)

    def same_policy_as(self, other: SchedPolicy) -> bool:
        """Equal in everything the policy's class uses (nice is ignored for RT and DL)."""
        if self.policy != other.policy or self.reset_on_fork != other.reset_on_fork:
            return False
        if self.is_deadline:
            return (self.runtime_ns, self.deadline_ns, self.period_ns) == (
                other.runtime_ns, other.deadline_ns, other.period_ns)
        if self.policy in ("SCHED_FIFO", "SCHED_RR"):
            return self.priority == other.priority
        if self.policy == "SCHED_IDLE":
            return True
        return self.nice == other.nice

    def describe(self) -> str:
        """One line for messages: the policy and the parameters it uses (for SCHED_DEADLINE the times in ns
        and the CPU share in %)."""
        if self.is_deadline:
            return (f"SCHED_DEADLINE runtime={self.runtime_ns} ns deadline={self.deadline_ns} ns "
                    f"period={self.period_ns} ns ({100 * self.bandwidth:.1f} % CPU)")
        if self.policy in ("SCHED_FIFO", "SCHED_RR"):
            return f"{self.policy} priority={self.priority}"
        return f"{self.policy} nice={self.nice}"


# -- errors -------------------------------------------------------------------------------------

class SchedError(BbrlabError):
    """The kernel refused a scheduling change; ``errno`` and ``tid`` say which and where."""

    def __init__(self, message: str, *, tid: int, err: int):
        self.tid = tid
        self.errno = err
        super().__init__(message)


class DeadlineAdmissionError(SchedError):
    """EBUSY: the SCHED_DEADLINE bandwidth asked for does not fit what the kernel allows."""


class SchedPermissionError(SchedError):
    """EPERM: not privileged, or the thread's affinity excludes CPUs of its root domain."""


class ThreadGoneError(SchedError):
    """ESRCH: the thread exited (e.g. the VM was shut down)."""


class ThreadReplacedError(ThreadGoneError):
    """The thread id no longer names the thread it was pinned to (it exited; a new thread may hold its id).
    Nothing was changed on the thread that holds the id now."""


class SchedParamsError(SchedError):
    """EINVAL / E2BIG: parameters the kernel does not accept."""


_ERROR_CLASSES = {
    errno.EBUSY: DeadlineAdmissionError,
    errno.EPERM: SchedPermissionError,
    errno.ESRCH: ThreadGoneError,
    errno.EINVAL: SchedParamsError,
    errno.E2BIG: SchedParamsError,
}


def explain_refusal(err: int, tid: int, asked: SchedPolicy | None, context: str = "") -> SchedError:
    """Build the exception for a refused ``sched_setattr`` / ``sched_getattr`` on ``tid``.

    ``context`` is extra text the caller measured (e.g. the admission arithmetic for EBUSY).
    """
    what = f"setting {asked.describe()}" if asked else "reading the policy"
    if err == errno.EBUSY:
        why = ("SCHED_DEADLINE admission control refused it: the bandwidth (runtime / period) of all "
               "deadline tasks in the root domain would exceed what sched_rt_runtime_us / "
               "sched_rt_period_us allows per CPU")
    elif err == errno.EPERM:
        why = ("permission denied: SCHED_DEADLINE needs root (CAP_SYS_NICE), and the thread must be "
               "allowed to run on every CPU of its root domain (a vCPU pinned with taskset/cpuset "
               "is refused; unpin it or give it an exclusive cpuset)")
    elif err == errno.ESRCH:
        why = "no such thread: it exited (was the VM shut down or restarted?)"
    elif err in (errno.EINVAL, errno.E2BIG):
        why = ("the kernel rejected the parameters: it needs 1024 ns <= runtime <= deadline <= period, "
               "a period within /proc/sys/kernel/sched_deadline_period_{min,max}_us, and a valid policy")
    else:
        why = os.strerror(err)
    message = f"thread {tid}: {what} failed with {errno.errorcode.get(err, err)}: {why}"
    if context:
        message += f". {context}"
    return _ERROR_CLASSES.get(err, SchedError)(message, tid=tid, err=err)


# -- the syscalls -------------------------------------------------------------------------------

def _syscall_numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in _SYSCALLS:
        raise BbrlabError(f"sched_setattr syscall number unknown for {machine}; use the chrt method")
    return _SYSCALLS[machine]


_libc = ctypes.CDLL(None, use_errno=True)


def sched_getattr(tid: int) -> SchedPolicy:
    """The policy of thread ``tid`` as the kernel holds it."""
    _set_nr, get_nr = _syscall_numbers()
    attr = _SchedAttr()
    rc = _libc.syscall(get_nr, ctypes.c_long(tid), ctypes.byref(attr),
                       ctypes.c_uint(ctypes.sizeof(attr)), ctypes.c_uint(0))
    if rc != 0:
        raise explain_refusal(ctypes.get_errno(), tid, None)
    return SchedPolicy(
        policy=POLICY_NAMES.get(attr.sched_policy, f"policy-{attr.sched_policy}"),
        nice=attr.sched_nice,
        priority=attr.sched_priority,
        runtime_ns=attr.sched_runtime,
        deadline_ns=attr.sched_deadline,
        period_ns=attr.sched_period,
        reset_on_fork=bool(attr.sched_flags & SCHED_FLAG_RESET_ON_FORK),
    )


def sched_setattr(tid: int, policy: SchedPolicy) -> None:
    """Give thread ``tid`` the scheduling ``policy``; raise an explained :class:`SchedError` if refused."""
    set_nr, _get_nr = _syscall_numbers()
    if policy.policy not in POLICY_IDS:
        raise BbrlabError(f"unknown scheduling policy {policy.policy!r}; known: {', '.join(POLICY_IDS)}")
    # For the fair classes sched_getattr reports the slice in sched_runtime; passing it back would pin a
    # custom slice, so non-deadline policies are set with zeros (the kernel's default slice).
    dl = policy.is_deadline
    attr = _SchedAttr(
        size=SCHED_ATTR_SIZE_VER0,
        sched_policy=POLICY_IDS[policy.policy],
        sched_flags=SCHED_FLAG_RESET_ON_FORK if policy.reset_on_fork else 0,
        sched_nice=policy.nice,
        sched_priority=policy.priority,
        sched_runtime=policy.runtime_ns if dl else 0,
        sched_deadline=policy.deadline_ns if dl else 0,
        sched_period=policy.period_ns if dl else 0,
    )
    rc = _libc.syscall(set_nr, ctypes.c_long(tid), ctypes.byref(attr), ctypes.c_uint(0))
    if rc != 0:
        raise explain_refusal(ctypes.get_errno(), tid, policy)
