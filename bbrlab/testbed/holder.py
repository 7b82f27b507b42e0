"""Who holds a testbed's lock, when it is another process, said in one line (for refusals and waits).

May import: ``bbrlab.core`` and ``bbrlab.testbed.lock``.
"""

from __future__ import annotations

import datetime as dt

from bbrlab.core.errors import TestbedError

from .lock import held_by_us, holder, lock_path


def describe_holder(info: dict) -> str:
    """One line about who holds a testbed's lock and what it said it is doing."""
    pids = info.get("pids") or []
    text = f"pid {info.get('pid') or ', '.join(map(str, pids))}"
    argv = info.get("argv")
    if argv:
        text += f" ({' '.join(str(a) for a in argv)[:160]})"
    activity = info.get("activity")
    if activity:
        text += f": {activity}"
        if info.get("campaign"):
            text += f" {info['campaign']}"
        if info.get("run_id"):
            where = f", run {info['index']}/{info['planned']}" if info.get("planned") else ", run"
            text += f"{where} {info['run_id']}"
            if info.get("attempt"):
                text += f" (attempt {info['attempt']})"
        if info.get("out"):
            text += f" into {info['out']}"
    else:
        text += ": activity not stated"
    if info.get("since"):
        since = dt.datetime.fromtimestamp(float(info["since"])).strftime("%H:%M:%S")
        text += f", since {since}"
    return text


def busy_elsewhere(name: str) -> dict | None:
    """Who holds testbed ``name``'s lock, when it is another process (not ours or an ancestor's)."""
    try:
        info = holder(name)
        if info is None or held_by_us(lock_path(name)):
            return None
    except TestbedError:  # no lock can exist under this name here (e.g. a lab named with spaces)
        return None
    return info
