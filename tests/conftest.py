"""Shared pytest fixtures.

``testbed``: the suite's local testbed (sender VM, emulator VM, receiver namespace), named
:data:`TEST_TESTBED` (``bbrlab-test``), brought up or attached to ONCE per pytest session. The session holds that testbed's lock (bbrlab.testbed.lock)
from the first test that asks for it until the end, so two sessions never boot or tear down the
same testbed under each other. At the end it is brought down,
unless ``BBRLAB_KEEP_TESTBED=1`` (then the next session attaches to it in seconds).
``BBRLAB_TESTBED`` names another local testbed, or a lab's testbed file (then nothing is
brought up or down: the lab is used as it is). Unless it is set, :func:`pytest_configure` sets it to
:data:`TEST_TESTBED`, so the ``bbrlab`` commands the tests start act on the suite's testbed too.

The suite's testbed has a name of its own, not ``local``: a testbed's lock file (``/run/bbrlab``),
its network namespaces (``bbrlab-<name>-link``/``-rx``) and its QEMU processes (``-name
bbrlab-<name>-sender``) are named after it machine-wide, whatever the state directory, so a suite
that drove ``local`` would wait on, stop or tear down a user's own ``local`` testbed.

Tests keep their testbeds' state (``state.json``, SSH keys, overlays) out of the user's own
``~/.local/state/bbrlab``: :func:`pytest_configure` points ``BBRLAB_STATE_DIR`` at a directory of the
test suite's (``/var/tmp/bbrlab-tests-<uid>/state``, kept between sessions so that
``BBRLAB_KEEP_TESTBED=1`` works; a value set beforehand wins). The guest image cache stays shared per
machine (``~/.cache/bbrlab``): building it is expensive. Commands run by hand against a kept test
testbed need the same ``BBRLAB_STATE_DIR``.

Tests that use it are marked ``system`` and ``testbed``::

    pytestmark = [pytest.mark.system, pytest.mark.testbed]

    def test_something(testbed):
        testbed.sender.host.run(["uname", "-r"])
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Where test testbeds keep their state unless BBRLAB_STATE_DIR is set (see the module docstring).
TEST_STATE_DIR = Path(f"/var/tmp/bbrlab-tests-{os.geteuid()}") / "state"
#: The suite's local testbed (unless BBRLAB_TESTBED names another): never a user's ``local``.
TEST_TESTBED = "bbrlab-test"


def suite_testbed() -> str:
    """The testbed the suite drives: ``$BBRLAB_TESTBED`` (a name or a testbed file), else :data:`TEST_TESTBED`."""
    return os.environ.get("BBRLAB_TESTBED") or TEST_TESTBED


def _private_dir(path: Path) -> Path:
    """``path`` created 0700 and owned by us (refused if another user made it or it is a symlink)."""
    for p in (path.parent, path):
        p.mkdir(mode=0o700, exist_ok=True)
    for p in (path.parent, path):
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise pytest.UsageError(f"{p} is not a private directory of ours: set BBRLAB_STATE_DIR elsewhere")
    return path


def pytest_configure(config):
    from bbrlab.testbed.local.state import STATE_DIR_ENV
    from tests import timebudget

    timebudget.pytest_configure(config)

    # A suite started in the background of a non-interactive shell (`make test &`, nohup, some CI runners)
    # inherits SIGINT ignored, and so would every command it starts: the Ctrl-C tests would then test
    # nothing. Python's own handler here makes the commands the tests start inherit the default action.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # nohup ignores SIGHUP likewise: a handler that does nothing keeps the suite alive through a hangup and
    # still lets the commands it starts (and the tests of bbrlab's own handlers) see SIGHUP act.
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
    if not os.environ.get(STATE_DIR_ENV):
        os.environ[STATE_DIR_ENV] = str(_private_dir(TEST_STATE_DIR))
    os.environ["BBRLAB_TESTBED"] = suite_testbed()  # commands the tests start: never the user's `local`
    # The host guard (bbrlab.campaign.hostguard) is off for specs that leave host_guard out: the suite's
    # ordinary tests check mechanisms on a 2-core machine shared by several developers, whose work outside the
    # testbed kept its CPUs busy most of the time (median 97.5 % of 2 s samples; docs/run-record.md). Its own
    # tests (test_host_guard*.py) set host_guard in their specs. A value set beforehand wins.
    os.environ.setdefault("BBRLAB_HOST_GUARD", "off")


def _recount_deadline_bandwidth() -> None:
    """Start the testbed's session with this host's count of admitted deadline bandwidth true to the threads
    that exist: it drifts on this kernel (bbrlab.contention.accounting), and a count left full by earlier work
    would refuse the contended runs. Where it cannot be recounted (cgroup v2, no root) the suite runs as is."""
    from bbrlab.contention.accounting import recount
    from bbrlab.core.errors import BbrlabError
    from bbrlab.core.hosts import LocalHost

    try:
        recount(LocalHost())
    except (BbrlabError, OSError) as e:
        print(f"the deadline bandwidth count was not recounted: {e}", file=sys.stderr)


@pytest.fixture(scope="session")
def testbed():
    """A running local testbed (:class:`bbrlab.testbed.Testbed`), shared by the whole session."""
    import bbrlab.testbed as tbmod
    from bbrlab.testbed.lock import set_activity

    name = suite_testbed()
    _recount_deadline_bandwidth()
    if os.path.isfile(name):
        from bbrlab.testbed import hostlock

        tb = tbmod.load(name)
        # A run checks that its process holds the lab hosts' locks (a lost lock fails it), so the session holds
        # them as a campaign does; a test's second driver on the same lab waits for the session.
        with hostlock.holding(tb, activity="pytest session"):
            yield tb
        tb.close()
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(tbmod.testbed_lock(name))
        set_activity(name, "pytest session")
        tb = tbmod.up(name, progress=True)
        yield tb
        tb.close()
        if os.environ.get("BBRLAB_KEEP_TESTBED") != "1":
            tbmod.down(name, progress=False)


#: The experiment path's watch (tests/testbed_path.py): the module last checked, whether a test on the testbed
#: failed since, and every time the path was found dead.
_PATH_WATCH: dict = {"module": None, "failed": False, "events": [], "testbed": None}


@pytest.fixture(autouse=True)
def _experiment_path_alive(request):
    """Before the first testbed test of each module, and after a testbed test failed: the sender reaches the
    receiver, or the path is brought back and the event listed in the session's summary (tests/testbed_path.py)."""
    if "testbed" in request.fixturenames:
        _PATH_WATCH["testbed"] = testbed = request.getfixturevalue("testbed")
        module = request.node.module.__name__
        if module != _PATH_WATCH["module"] or _PATH_WATCH["failed"]:
            _PATH_WATCH.update(module=module, failed=False)
            _path_event(testbed, request.node.nodeid)
    yield


def _path_event(testbed, before: str):
    """None when the path is alive (or cannot be checked); else the event, with the path revived if it could be."""
    from bbrlab.core.errors import BbrlabError
    from tests.testbed_path import PathEvent, alive, revive
    from tests.testbed_snapshot import snapshot

    try:
        if alive(testbed):
            return None
    except (BbrlabError, OSError) as e:  # the sender does not answer SSH: nothing to say about its path
        print(f"experiment path not checked before {before}: {e}", file=sys.stderr)
        return None
    event = PathEvent(before, snapshot(testbed))
    _PATH_WATCH["events"].append(event)
    revive(testbed, event)
    return event


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A real-system test runs once more, the event with its first failure in the session's summary, when it
    failed with the experiment path dead afterwards (tests/testbed_path.py; once the path is revived), or after
    one of its runs met the host's lost deadline replenishment (tests/stalls.py). Any other failure stands."""
    if "testbed" not in getattr(item, "fixturenames", ()) and item.get_closest_marker("system") is None:
        return None
    import time

    from _pytest.runner import runtestprotocol

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    started_s = time.time()
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    failed = [r for r in reports if r.failed]
    again = None
    if failed and _PATH_WATCH.get("testbed") is not None and "testbed" in item.fixturenames:
        event = _path_event(_PATH_WATCH["testbed"], f"{item.nodeid} (after it failed)")
        if event is not None and event.revived:
            event.steps.append(f"the test ran again; its first run failed: {failed[0].longreprtext[-1500:]}")
            _PATH_WATCH["failed"] = False
            again = event
    if failed and again is None:
        again = _lost_replenishment(item, started_s, failed[0])
    if again is not None:
        item._initrequest()
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        if isinstance(again, StallEvent):
            again.passed_again = not any(r.failed for r in reports)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@dataclass
class StallEvent:
    """A real-system test that failed after one of its runs met the host's lost SCHED_DEADLINE replenishment
    (tests/stalls.py): its records of that, the first run's failure, and whether it passed when run again."""

    test: str
    records: list[str]
    first_failure: str
    passed_again: bool | None = None


_STALLS: list[StallEvent] = []


def _lost_replenishment(item, started_s: float, failure) -> StallEvent | None:
    """The event when a run made during the failed test met the lost replenishment, else None."""
    from tests.stalls import met_during

    try:
        root = item.config._tmp_path_factory.getbasetemp()
    except (AttributeError, OSError):
        return None
    records = met_during(root, started_s)
    if not records:
        return None
    event = StallEvent(item.nodeid, records, failure.longreprtext[-1500:])
    _STALLS.append(event)
    return event


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A system test that fails while holding the suite's testbed carries the testbed's network state in its
    report (tests/testbed_snapshot.py): what a stalled path looked like, read when it failed."""
    outcome = yield
    report = outcome.get_result()
    testbed = getattr(item, "funcargs", {}).get("testbed")
    if report.failed and report.when == "call" and testbed is not None:
        from tests.testbed_snapshot import snapshot

        _PATH_WATCH["failed"] = True
        report.sections.append(("testbed network state at the failure", snapshot(testbed)))


def pytest_terminal_summary(terminalreporter):
    """Every time the experiment path was found dead, what it looked like and what brought it back; every test
    run again after one of its runs met the host's lost deadline replenishment."""
    for stall in _STALLS:
        outcome = {True: "passed", False: "FAILED again", None: "not run again"}[stall.passed_again]
        terminalreporter.section(f"lost SCHED_DEADLINE replenishment in {stall.test}: run again, {outcome}",
                                 sep="!")
        for line in stall.records:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"its first run failed: {stall.first_failure}")
    for event in _PATH_WATCH["events"]:
        terminalreporter.section(f"experiment path found dead before {event.before}", sep="!")
        terminalreporter.write_line("; ".join(event.steps) + ("" if event.revived else " -- NOT revived"))
        terminalreporter.write_line(event.snapshot)
