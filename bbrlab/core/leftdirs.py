"""Private directories a killed run left on a host, found by their owner stamp and removed.

Every per-run directory bbrlab makes on a host (:meth:`bbrlab.core.hosts.Host.private_dir`: ``mktemp -d``,
``bbrlab-<purpose>.XXXXXXXX`` in the host's temporary directory, mode 0700) holds, as its first file, ``owner``:
a stamp naming the process that made it (:class:`bbrlab.core.owners.Owner`: pid, start time, boot and machine).
A run ended by SIGKILL or a power cut cannot remove its directories, and some hold what must not linger (a
run's private SSH key, the data received, a trace of up to 256 MiB). :func:`sweep` (called by the recovery
before a campaign's first run) removes each such directory whose owner is gone, after killing the processes
still working in it (an sshd under ``timeout``, a progress poller, a trace reader).

Left alone: a directory whose owner still runs, or ran on another machine (its own recovery clears it); one
not owned by the connecting user, or that is a symbolic link; one without a stamp until it is a day old (an
older bbrlab made it, or its maker was killed between ``mktemp`` and the stamp, in the same shell command).
"""

from __future__ import annotations

import re

from bbrlab.core import owners
from bbrlab.core.hosts import Host

#: A private directory left without an owner stamp is removed once this old [s].
UNSTAMPED_STALE_S = 86400
#: "$@" the purposes (``sshd``, ``rsync``, ``iperf3``): each of our private directories of those purposes in the
#: temporary directory (``mktemp -d -t`` made them there), its age in seconds and the first line of its stamp.
_LIST_DIRS = r"""
now=$(date +%s)
for purpose in "$@"; do
    for d in "${TMPDIR:-/tmp}"/bbrlab-"$purpose".*; do
        [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] || continue
        printf '%s\t%s\t%s\n' "$d" "$((now - $(stat -c %Y "$d")))" "$(head -n 1 "$d/owner" 2>/dev/null | cut -c1-200)"
    done
done
"""
#: $1 a directory: SIGKILL every process whose command line names a file inside it (a run's sshd under
#: timeout, a progress poller), then remove it (never crossing into another file system).
_REMOVE_DIR = r"""
d=$1
for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    case "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" in *"$d/"*) kill -KILL "$pid" 2>/dev/null ;; esac
done
rm -rf --one-file-system -- "$d"
"""
_PURPOSE = re.compile(r"[a-z][a-z0-9]{0,15}")


def left_behind(age_s: int, stamp: str) -> bool:
    """Whether a directory of this age and stamp (its ``owner`` file's first line) was left by a gone owner."""
    owner = owners.Owner.parse(stamp)
    if owner is None:
        return not stamp and age_s > UNSTAMPED_STALE_S
    return owner.gone()


def sweep(host: Host, *purposes: str) -> list[str]:
    """Remove ``host``'s private directories of these ``purposes`` whose owner is gone, with the processes still
    working in them; return their paths. One command lists them all. See the module docstring for what is left
    alone."""
    bad = [p for p in purposes if not _PURPOSE.fullmatch(p)]
    if bad or not purposes:
        raise ValueError(f"purposes must be short lowercase words, not {bad or purposes!r}")
    listing = host.run(["sh", "-c", _LIST_DIRS, "bbrlab-sweep", *purposes], check=False, timeout=60).stdout
    names = "|".join(purposes)
    removed = []
    for line in listing.splitlines():
        path, _, rest = line.partition("\t")
        age, _, stamp = rest.partition("\t")
        if not re.fullmatch(rf"/[A-Za-z0-9._/-]*/bbrlab-(?:{names})\.[A-Za-z0-9]{{8}}", path) or not age.isdigit():
            continue
        if left_behind(int(age), stamp.strip()):
            host.run(["sh", "-c", _REMOVE_DIR, "bbrlab-sweep", path], check=False, timeout=60)
            removed.append(path)
    return removed
