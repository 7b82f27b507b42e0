"""The contention ledger (:mod:`bbrlab.contention.ledger`) believes only its own private files: an entry
round-trips; one that is too large, not JSON, not an entry or named for another kind is refused; a state
directory others can write is refused; an entry whose owner runs is not left over, one whose owner's start time
differs (a reused pid) is."""

from __future__ import annotations

import json
import os

import pytest

from bbrlab.contention import ledger
from bbrlab.core import errors
from bbrlab.core.owners import Owner


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(tmp_path / "locks"))
    return ledger.state_dir()


def test_an_entry_round_trips_and_is_private(state):
    entry = ledger.write("load", {"token": "ab", "threads": []})
    assert oct(os.stat(entry.path).st_mode & 0o777) == "0o600" and entry.path.parent == state
    assert ledger.read(entry.path) == entry
    assert ledger.left("load").entries == []  # its owner (this process) runs
    assert ledger.left("load", include_live_owners=True).entries == [entry]
    ledger.drop(entry)
    assert not entry.path.exists()


def test_an_entry_whose_owners_start_time_differs_is_left_over(state):
    me = Owner.current()
    entry = ledger.write("cgroup", {})
    ledger.update(ledger.Entry(entry.path, "cgroup", Owner(me.machine, me.boot, me.pid, me.ticks + 1), {}), {})
    assert [e.path for e in ledger.left("cgroup").entries] == [entry.path]


@pytest.mark.parametrize("content", ["x" * (ledger.MAX_ENTRY_BYTES + 1), "not json", json.dumps({"kind": "load"}),
                                     json.dumps({"owner": "bbrlab-owner m b 1 2", "kind": "other", "data": {}}),
                                     json.dumps({"owner": "someone", "kind": "load", "data": {}}),
                                     json.dumps({"owner": Owner.current().stamp(), "kind": "cgroup", "data": {}})])
def test_anything_but_an_entry_of_its_kind_is_refused(state, content):
    path = state / "load-1-1-1.json"
    path.write_text(content)
    path.chmod(0o600)
    found = ledger.left("load", include_live_owners=True)
    assert found.entries == [] and len(found.refused) == 1 and "refused" in found.refused[0]


def test_a_state_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("BBRLAB_LOCK_DIR", str(tmp_path / "locks"))
    (tmp_path / "locks" / "contention").mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "locks" / "contention", 0o777)
    with pytest.raises(errors.TestbedError, match="not a private directory"):
        ledger.state_dir()
