"""The unprivileged account a run's receiving end runs as: the rsync receiver (behind the run's sshd) and
iperf3's server.

What a sender puts on the receiver then belongs to that account: it cannot own files as another user, make
device nodes or act as root there. :func:`receiver_user` makes the account when it is missing (a system user
with its own group, no home, no password: ``*``, which sshd without PAM takes as "no password" where ``!``
would be "locked"; its shell is ``/bin/sh`` because sshd runs a forced command through it). An account of
that name that exists is used as it is, but never one with uid 0. Where it cannot be had (no ``useradd``,
a read-only ``/etc``), the receiver runs as root and :attr:`RxUser.note` says why, for the run's record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bbrlab.core.hosts import Host

#: The account's name.
NAME = "bbrlab-rx"
ROOT = "root"

#: $1 the account: made when missing; prints ``uid=`` and ``group=``.
_ENSURE = r"""
u=$1
if ! id -u "$u" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /bin/sh --password '*' \
        --comment 'bbrlab run receiver' "$u" 2>&1 || exit 0
fi
echo "uid=$(id -u "$u")"; echo "group=$(id -gn "$u")"
"""


@dataclass(frozen=True)
class RxUser:
    """Who a receiving end runs as: ``name`` and ``group`` (``root`` for both where the account could not be
    had), and ``note``, why it is root (None otherwise)."""

    name: str
    group: str
    note: str | None = None

    @property
    def is_root(self) -> bool:
        """Whether the receiving end runs as root (the fallback)."""
        return self.name == ROOT

    def wrap(self, argv: list[str], caps: tuple[str, ...] = ()) -> list[str]:
        """``argv`` run as this account (``setpriv``: no supplementary groups, no new privileges through
        set-uid files) keeping only the capabilities ``caps`` (names such as ``net_admin``); as it is for
        root."""
        if self.is_root:
            return list(argv)
        wanted = ",".join(f"+{cap}" for cap in caps)
        keep = [f"--inh-caps={wanted}", f"--ambient-caps={wanted}"] if caps else []
        return ["setpriv", f"--reuid={self.name}", f"--regid={self.group}", "--clear-groups",
                "--no-new-privs", *keep, "--", *argv]


AS_ROOT = RxUser(ROOT, ROOT)


def receiver_user(host: Host, name: str = NAME) -> RxUser:
    """The account receiving ends run as on ``host``, made first when missing; root with a note where it
    cannot be made or has uid 0 (see the module docstring)."""
    res = host.run(["sh", "-c", _ENSURE, "bbrlab-rx-user", name], check=False, timeout=60)
    kv = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    uid, group = kv.get("uid", ""), kv.get("group", "")
    if uid.isdigit() and int(uid) > 0 and re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", group):
        return RxUser(name, group)
    why = (res.stdout + res.stderr).strip()[-200:] or f"exit {res.exit_code}"
    return RxUser(ROOT, ROOT, f"no unprivileged account {name} on {host.name} ({why}); it ran as root")
