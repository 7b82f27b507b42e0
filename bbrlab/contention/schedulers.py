"""Two ways to talk to the scheduler about one thread: the syscalls on this machine (:class:`SyscallScheduler`,
over :mod:`bbrlab.contention.sched`) and ``chrt`` through a :class:`~bbrlab.core.hosts.Host`, local or remote
(:class:`ChrtScheduler`). Both check, when given the thread's pinned identity, that the thread id still names
that thread at the moment of the change."""

from __future__ import annotations

import errno
import os
import re
from typing import Literal

from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hosts import Host

from .sched import SchedError, SchedPolicy, ThreadReplacedError, explain_refusal
from .threadstat import ThreadIdentity, open_thread_dir, read_proc_files, read_stat_at

Method = Literal["auto", "syscall", "chrt"]
METHODS = ("auto", "syscall", "chrt")


class SyscallScheduler:
    """sched_getattr / sched_setattr on this machine."""

    name = "syscall"

    def get(self, tid: int) -> SchedPolicy:
        """The policy of thread ``tid`` read with ``sched_getattr``; a refusal raises an explained
        :class:`~bbrlab.contention.sched.SchedError`."""
        from .sched import sched_getattr

        return sched_getattr(tid)

    def set(self, tid: int, policy: SchedPolicy, identity: ThreadIdentity | None = None) -> None:
        """Give ``tid`` the ``policy``; with ``identity``, only while ``tid`` is still that thread.

        The thread's ``/proc/<pid>/task/<tid>`` directory is opened and checked first and read again after
        the call: a directory that still reads proves the thread lived through the call, so the id named
        it and no newcomer was changed."""
        from .sched import sched_setattr

        if identity is None:
            sched_setattr(tid, policy)
            return
        fd = open_thread_dir(identity)
        if fd is None:
            raise replaced_error(tid, identity, policy)
        try:
            sched_setattr(tid, policy)
            if read_stat_at(fd) is None:
                undo_on_newcomer(self, tid, policy)
                raise replaced_error(tid, identity, policy, during=True)
        finally:
            os.close(fd)


def replaced_error(tid: int, identity: ThreadIdentity, policy: SchedPolicy | None,
                   during: bool = False) -> ThreadReplacedError:
    """The error for a thread id that no longer names the thread ``identity`` pinned."""
    what = f"setting {policy.describe()}" if policy else "changing its policy"
    when = "ended while its policy was being set" if during else "exited"
    return ThreadReplacedError(
        f"thread {tid}: {what} refused: it is no longer {identity.describe()} (that thread {when}; its id "
        "may now name another thread, which bbrlab never changes)", tid=tid, err=errno.ESRCH)


def undo_on_newcomer(scheduler, tid: int, policy: SchedPolicy) -> None:
    """After a pinned thread ended during a change: if a newcomer now holds ``tid`` under the deadline
    ``policy`` just asked for, put it back to SCHED_OTHER (best effort; the pid space would have to wrap
    within one syscall for this to happen)."""
    if not policy.is_deadline:
        return
    try:
        if scheduler.get(tid).same_policy_as(policy):
            scheduler.set(tid, SchedPolicy("SCHED_OTHER"))
    except SchedError:
        pass


_CHRT_FLAGS = {"SCHED_OTHER": "-o", "SCHED_BATCH": "-b", "SCHED_IDLE": "-i", "SCHED_FIFO": "-f",
               "SCHED_RR": "-r", "SCHED_DEADLINE": "-d"}
_ERRNO_BY_TEXT = {
    "Device or resource busy": 16, "Operation not permitted": 1, "No such process": 3, "Invalid argument": 22,
}


def chrt_set_argv(tid: int, policy: SchedPolicy) -> list[str]:
    """The ``chrt`` command giving thread ``tid`` the ``policy`` (nice is not chrt's business)."""
    if policy.policy not in _CHRT_FLAGS:
        raise BbrlabError(f"chrt cannot set {policy.policy}")
    argv = ["chrt", _CHRT_FLAGS[policy.policy]]
    if policy.reset_on_fork:
        argv.append("-R")
    if policy.is_deadline:
        argv += ["-T", str(policy.runtime_ns), "-D", str(policy.deadline_ns), "-P", str(policy.period_ns)]
    prio = policy.priority if policy.policy in ("SCHED_FIFO", "SCHED_RR") else 0
    return argv + ["-p", str(prio), str(tid)]


def parse_chrt_show(text: str, nice: int) -> SchedPolicy:
    """A :class:`SchedPolicy` from what ``chrt -p TID`` prints (``nice`` comes from /proc)."""
    m = re.search(r"scheduling policy: (\S+)", text)
    if not m:
        raise BbrlabError(f"cannot read chrt output: {text!r}")
    names = m.group(1).split("|")
    prio = re.search(r"scheduling priority: (\d+)", text)
    dl = re.search(r"runtime/deadline/period parameters: (\d+)/(\d+)/(\d+)", text)
    runtime_ns, deadline_ns, period_ns = (int(x) for x in dl.groups()) if dl else (0, 0, 0)
    return SchedPolicy(policy=names[0], nice=nice, priority=int(prio.group(1)) if prio else 0,
                       runtime_ns=runtime_ns, deadline_ns=deadline_ns, period_ns=period_ns,
                       reset_on_fork="SCHED_RESET_ON_FORK" in names)


class ChrtScheduler:
    """The same operations through ``chrt`` (and ``renice``) on a :class:`Host`, local or remote."""

    name = "chrt"

    def __init__(self, host: Host):
        self.host = host

    def _refusal(self, res, tid: int, asked: SchedPolicy | None) -> SchedError:
        for text, err in _ERRNO_BY_TEXT.items():
            if text in res.stderr:
                return explain_refusal(err, tid, asked)
        return SchedError(f"[{self.host.name}] {' '.join(res.argv)} failed: {res.stderr.strip()}", tid=tid, err=0)

    def _nice(self, tid: int) -> int:
        stat = read_proc_files(self.host, [f"/proc/{tid}/stat"]).get(f"/proc/{tid}/stat")
        if stat is None:
            raise explain_refusal(3, tid, None)
        return int(stat[stat.rindex(")") + 2:].split()[19 - 3])

    def get(self, tid: int) -> SchedPolicy:
        """The policy of thread ``tid`` from ``chrt -p`` on the host (nice from its ``/proc`` stat); a refusal
        raises an explained :class:`~bbrlab.contention.sched.SchedError`."""
        res = self.host.run(["chrt", "-p", str(tid)], check=False)
        if not res.ok:
            raise self._refusal(res, tid, None)
        return parse_chrt_show(res.stdout, self._nice(tid))

    def set(self, tid: int, policy: SchedPolicy, identity: ThreadIdentity | None = None) -> None:
        """Give ``tid`` the ``policy`` with chrt (and renice); with ``identity``, only while ``tid`` is still
        that thread: one shell on the host checks it, runs the command, and checks again (its working
        directory holds the thread's ``/proc`` directory, which stops answering once the thread is gone)."""
        self._run(tid, chrt_set_argv(tid, policy), policy, identity)
        if policy.policy in ("SCHED_OTHER", "SCHED_BATCH") and self._nice(tid) != policy.nice:
            self._run(tid, ["renice", "-n", str(policy.nice), "-p", str(tid)], policy, identity)

    def _run(self, tid: int, argv: list[str], policy: SchedPolicy, identity: ThreadIdentity | None) -> None:
        if identity is not None:
            argv = ["sh", "-c", CHECKED_SCRIPT, "sh", str(identity.pid), str(tid), identity.comm,
                    str(identity.start_ticks), *argv]
        res = self.host.run(argv, check=False, sudo=True)
        if res.exit_code == CHECKED_GONE:
            raise replaced_error(tid, identity, policy)
        if res.exit_code == CHECKED_ENDED:
            undo_on_newcomer(self, tid, policy)
            raise replaced_error(tid, identity, policy, during=True)
        if not res.ok:
            raise self._refusal(res, tid, policy)


#: Exit codes of :data:`CHECKED_SCRIPT`: the thread was not the pinned one before the command, or ended
#: while it ran.
CHECKED_GONE, CHECKED_ENDED = 97, 98
#: ``sh -c CHECKED_SCRIPT sh PID TID COMM START_TICKS COMMAND...``: runs COMMAND only while TID is the
#: thread of process PID named COMM that started at START_TICKS (field 22 of its stat).
CHECKED_SCRIPT = r"""pid=$1 tid=$2 comm=$3 start=$4; shift 4
cd "/proc/$pid/task/$tid" 2>/dev/null && s=$(cat stat 2>/dev/null) || exit 97
c=${s#*\(}; c=${c%\)*}
field22() { shift 19; echo "$1"; }
set -f
st=$(field22 ${s##*\) })
[ "$c" = "$comm" ] && [ "$st" = "$start" ] || exit 97
"$@" || exit $?
cat stat >/dev/null 2>&1 || exit 98
"""


def scheduler_for(host: Host, method: Method = "auto") -> SyscallScheduler | ChrtScheduler:
    """``auto``: syscalls when ``host`` is this machine, chrt otherwise."""
    if method not in METHODS:
        raise ValidationError("contention.method", method, f"one of {', '.join(METHODS)}")
    if method == "syscall" and not host.is_local:
        raise ValidationError("contention.method", method, "chrt (or auto) for a remote hypervisor host")
    if method == "chrt" or (method == "auto" and not host.is_local):
        return ChrtScheduler(host)
    return SyscallScheduler()


def deadline_threads(host: Host) -> list[int]:
    """Every thread on ``host`` currently under SCHED_DEADLINE (policy 6 in /proc/<tid>/sched)."""
    script = "grep -lsE '^policy +: +6$' /proc/[0-9]*/task/[0-9]*/sched"
    res = host.run(["sh", "-c", script], check=False)
    return sorted(int(m) for m in re.findall(r"/task/(\d+)/sched", res.stdout))
