"""What the vCPU threads really got (``evidence.achieved``): made from the threads' schedstat deltas, written as
added keys only, read back typed; old records (no ``achieved``) keep their JSON; the runs table has the column."""

from __future__ import annotations

from bbrlab.analysis.tables import achieved_share
from bbrlab.contention.evidence import (
    STEAL_NOT_READ,
    STEAL_UNDER_TCG,
    AchievedShare,
    ContentionEvidence,
    ContentionRecord,
    EvidenceMissing,
    ThreadEvidence,
    steal_note,
)
from bbrlab.contention.threadstat import ThreadUsage
from bbrlab.run.runmeta import RunMetadata
from bbrlab.scenario.scenario import Contention


def _thread(tid: int, cpu_s: float, wall_s: float = 4.0, same: bool = True) -> ThreadEvidence:
    return ThreadEvidence(tid, None, True, usage=ThreadUsage(tid, "CPU 0/TCG", wall_s, cpu_s, 0.5, 40, same))


def test_the_achieved_share_is_the_mean_of_the_threads_run_time_over_wall_time():
    got = AchievedShare.of([_thread(1, 1.0), _thread(2, 3.0), _thread(3, 4.0, same=False)], STEAL_UNDER_TCG)
    assert got == AchievedShare(50.0, 1.0, 80, 4.0, 2, "not provided under tcg")
    assert AchievedShare.of([ThreadEvidence(1, None, False, gone=True)]) is None


def test_steal_is_a_sentence_where_the_guest_gives_no_number():
    assert steal_note("tcg") == STEAL_UNDER_TCG and steal_note("kvm") == steal_note(None) == STEAL_NOT_READ


def test_evidence_adds_the_achieved_key_and_reads_it_back():
    threads = [_thread(1, 1.0)]
    old = ContentionEvidence("sched_setattr", True, 25.0, threads)
    assert "achieved" not in old.to_dict() and ContentionEvidence.from_dict(old.to_dict()) == old
    new = ContentionEvidence("sched_setattr", True, 25.0, threads, None, AchievedShare.of(threads, STEAL_UNDER_TCG))
    d = new.to_dict()
    assert list(d)[:5] == list(old.to_dict()) and d["achieved"]["achieved_share_pct"] == 25.0
    assert d["achieved"]["steal"] == "not provided under tcg"
    assert ContentionEvidence.from_dict(d) == new


def _meta(evidence: ContentionEvidence | EvidenceMissing) -> RunMetadata:
    """A run's typed metadata whose contention has ``evidence`` (as the runs table reads it)."""
    return RunMetadata(contention=ContentionRecord(Contention(1, 25), "localhost", "sched_setattr", None, {}, {},
                                                   evidence))


def test_the_table_reads_achieved_else_the_threads_shares():
    threads = [_thread(1, 1.0), _thread(2, 2.0)]
    assert achieved_share(_meta(ContentionEvidence("sched_setattr", True, 25.0, threads))) == 37.5
    achieved = AchievedShare(9.0, 0.0, 0, 4.0, 2)
    assert achieved_share(_meta(ContentionEvidence("sched_setattr", True, 25.0, threads, None, achieved))) == 9.0
    assert achieved_share(_meta(EvidenceMissing("x"))) is None
    assert achieved_share(RunMetadata()) is None
