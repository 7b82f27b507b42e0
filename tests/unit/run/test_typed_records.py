"""Typed records where data crosses modules (issue #25): the contention evidence, the link's counters and the
sampler's summary are dataclasses whose JSON is, byte for byte, what ``record.json`` has always held; the run
checks read their attributes; a failed run's exception carries its metadata as a field."""

from __future__ import annotations

import gzip
import json
import pickle
import signal
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from bbrlab.campaign.sameness import MixedTestbed
from bbrlab.contention.deadline import DeadlineCleared
from bbrlab.contention.evidence import (
    ContentionEvidence,
    ContentionRecord,
    EvidenceMissing,
    Stall,
    ThreadEvidence,
    WatchReport,
    evidence_from_dict,
)
from bbrlab.contention.sched import SchedPolicy
from bbrlab.contention.threadstat import ThreadUsage
from bbrlab.core import recordjson
from bbrlab.core.errors import RunFailed
from bbrlab.core.signals import Interrupted
from bbrlab.kernel import ModuleIdentity
from bbrlab.link.counters import LinkRecord, NetemLoss, QdiscCounters
from bbrlab.run import checks, runmeta
from bbrlab.run.flowrecord import FlowOutcome, FlowRecord
from bbrlab.run.iperf import IperfSummary
from bbrlab.run.runmeta import FailedRun, RunMetadata
from bbrlab.run.runner import Runner, run_once
from bbrlab.run.sender import SenderOffloads, SenderSysctls, ToolVersions
from bbrlab.sampling import sockdiag
from bbrlab.sampling.sampler import parse_sampler_footer
from bbrlab.sampling.sockdiag import Deployed
from bbrlab.sampling.summary import KEYS, SamplingSummary, summarize
from bbrlab.scenario.cpumodels import CreditParams
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario

ROOT = Path(__file__).resolve().parents[3]
RECORDS = sorted(ROOT.glob("data/**/record.json"))
SAMPLED = sorted(p.parent for p in ROOT.glob("data/*/runs/*/samples.log"))
FIX = ROOT / "tests" / "fixtures" / "sockdiag"


def _record(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_committed_data_is_there_to_compare_with():
    metas = [_record(p)["metadata"] for p in RECORDS]
    assert len(metas) > 100
    assert sum("sampling" in m for m in metas) >= 10 and sum("link" in m for m in metas) > 100
    assert any(m["contention"]["evidence"]["watch"] for m in metas)  # watched runs (share < 100 %)
    assert any(m["contention"]["evidence"]["watch"] is None for m in metas)  # unwatched ones (100 %)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(ROOT / "data")))
def test_every_committed_record_reads_typed_and_writes_back_byte_for_byte(path):
    record = _record(path)
    meta = RunMetadata.from_dict(record["metadata"])
    assert isinstance(meta.contention, ContentionRecord) and isinstance(meta.cca, runmeta.CcaUse)
    assert isinstance(meta.contention.evidence, ContentionEvidence)
    assert all(isinstance(t, ThreadEvidence) and isinstance(t.usage, ThreadUsage)
               for t in meta.contention.evidence.threads)
    assert all(isinstance(p, SchedPolicy) for p in meta.contention.applied.values())
    if "link" in record["metadata"]:
        assert isinstance(meta.link, LinkRecord) and isinstance(meta.link.loss, NetemLoss)
        assert all(isinstance(c, QdiscCounters) for c in meta.link.counters.data.values())
    if "sampling" in record["metadata"]:
        assert isinstance(meta.sampling, SamplingSummary) and isinstance(meta.sampling.binary, Deployed)
    written = json.dumps({**record, "metadata": meta.to_dict()}, indent=2) + "\n"  # as bbrlab.run.record.commit
    assert written == path.read_text()


@pytest.mark.parametrize("run", SAMPLED, ids=lambda p: p.name)
def test_the_sampling_summary_made_from_a_committed_log_is_the_committed_one(run):
    """checks.samples on a run's own samples.log gives back its record's ``metadata.sampling`` and ``ss_seen``."""
    meta = _record(run / "record.json")["metadata"]
    kind = meta["sampling"]["kind"]
    sampled = SimpleNamespace(kind=kind, log_file=run / "samples.log", complete=True, exit_code=0, capped=False,
                              binary=Deployed.from_dict(meta["sampling"]["binary"]))
    summary, seen = checks.samples(sampled, meta["flow"]["client_ports"], meta["cca"]["requested"],
                                   meta["sampling"]["asked_interval_ms"])
    assert json.dumps(summary.to_dict()) == json.dumps(meta["sampling"])
    assert seen == meta["cca"]["ss_seen"]


def test_the_ss_loop_and_netlink_summaries_write_their_own_keys_in_their_order():
    ss_text = (FIX / "live-bbr.ss.log").read_text()
    ss = summarize("ss", ss_text, rows=7, asked_interval_ms=10)
    assert list(ss.to_dict()) == list(KEYS["ss"]) and ss.to_dict()["binary"] is None
    footer = parse_sampler_footer(ss_text)
    assert (ss.samples, ss.cpu_s, ss.ended, ss.missed_ticks) == (footer["samples"], footer["cpu_s"], "stop_file", None)

    nl_text = gzip.decompress((FIX / "live-bbr.sockdiag.log.gz").read_bytes()).decode()
    nl = summarize("netlink", nl_text, rows=3, asked_interval_ms=10).to_dict()
    assert list(nl) == list(KEYS["netlink"]) and nl["rows"] == 3 and nl["asked_interval_ms"] == 10
    raw = sockdiag.summary(nl_text)
    assert {k: nl[k] for k in KEYS["netlink"] if k not in ("kind", "binary", "asked_interval_ms", "rows")} == \
        {k: raw[k] for k in KEYS["netlink"] if k not in ("kind", "binary", "asked_interval_ms", "rows")}
    assert SamplingSummary.from_dict(nl) == summarize("netlink", nl_text, rows=3, asked_interval_ms=10)


def test_a_log_of_another_sampler_or_a_summary_of_unknown_shape_is_refused(tmp_path):
    nl_text = gzip.decompress((FIX / "live-bbr.sockdiag.log.gz").read_bytes()).decode()
    (tmp_path / "samples.log").write_text(nl_text)
    with pytest.raises(RunFailed, match="a netlink sampler's, not a bpf sampler's"):
        checks.samples(SimpleNamespace(kind="bpf", log_file=tmp_path / "samples.log", binary=None), [5201], "bbr", 10)
    legacy = {"rows": 3, "footer": {"samples": 3}, "interval": {"median_ms": 10.0}}  # before the sampler choice
    with pytest.raises(ValueError, match="no kind"):
        SamplingSummary.from_dict(legacy)
    with pytest.raises(ValueError, match="differ from what that sampler writes"):
        SamplingSummary.from_dict({**summarize("netlink", nl_text, rows=3, asked_interval_ms=10).to_dict(),
                                   "extra": 1})


# -- the contention record ----------------------------------------------------------------------------------

DEADLINE = SchedPolicy.deadline(10_000_000, 10_000_000, 40_000_000)
OTHER = SchedPolicy("SCHED_OTHER")


def _usage(tid: int, cpu_s: float) -> ThreadUsage:
    return ThreadUsage(tid, "CPU 0/TCG", 10.0, cpu_s, 5.0, 7910, True)


def _contention(*threads: ThreadEvidence, share: float = 25, watch: WatchReport | None = None,
                held: bool = True) -> ContentionRecord:
    evidence = ContentionEvidence("syscall", held, share, list(threads), watch or WatchReport(1.0, 11))
    return ContentionRecord(Contention(10, share), "localhost", "syscall", None, {7: OTHER}, {7: DEADLINE}, evidence)


def test_a_thread_writes_gone_and_got_cpu_only_when_known_in_the_order_records_have():
    gone = ThreadEvidence(7, None, held=False, gone=True, usage=_usage(7, 1.25), got_cpu=True).to_dict()
    assert list(gone) == ["tid", "policy_after", "held", "gone", "comm", "wall_s", "cpu_s", "wait_s", "timeslices",
                          "same_thread", "cpu_share_pct", "got_cpu"]
    assert gone["cpu_share_pct"] == 12.5 and gone["policy_after"] is None
    unsampled = ThreadEvidence(7, DEADLINE, held=True).to_dict()
    assert unsampled == {"tid": 7, "policy_after": DEADLINE.to_dict(), "held": True}
    for thread in (gone, unsampled):
        assert ThreadEvidence.from_dict(thread).to_dict() == thread


def test_a_stall_that_could_not_be_restarted_and_missing_evidence_read_back_as_themselves():
    stall = Stall(7, 3.5, 140.2, restarted=False, error="EPERM")
    watch = WatchReport(1.0, 4, stalls=[stall])
    assert recordjson.to_json(watch)["stalls"] == [{"tid": 7, "at_monotonic_s": 3.5, "stalled_s": 140.2,
                                                    "restarted": False, "error": "EPERM"}]
    assert recordjson.from_json(WatchReport, recordjson.to_json(watch)) == watch
    missing = EvidenceMissing("could not collect evidence: host gone")
    assert evidence_from_dict(missing.to_dict()) == missing and evidence_from_dict(None) is None
    record = replace(_contention(), evidence=missing)
    assert ContentionRecord.from_dict(record.to_dict()) == record


def test_the_contention_check_passes_a_committed_run_and_reads_attributes():
    meta = RunMetadata.from_dict(_record(next(p for p in RECORDS if "/runs/" in str(p)
                                              and "sh25" in p.parent.name))["metadata"])
    scenario = SimpleNamespace(contention=meta.contention.requested)
    checks.contention_held(meta.contention, scenario)  # the committed run held


@pytest.mark.parametrize("change,match", [
    ({"got_cpu": False}, r"vCPU thread\(s\) \[7\] got no CPU time"),
    ({"policy_after": OTHER}, "ran under SCHED_OTHER for a 25 % share"),
])
def test_the_contention_check_fails_a_thread_that_did_not_hold(change, match):
    thread = replace(ThreadEvidence(7, DEADLINE, True, usage=_usage(7, 2.5), got_cpu=True), **change)
    with pytest.raises(RunFailed, match=match):
        checks.contention_held(_contention(thread), SimpleNamespace(contention=Contention(10, 25)))
    checks.contention_held(_contention(replace(thread, policy_after=DEADLINE, got_cpu=True)),
                           SimpleNamespace(contention=Contention(10, 25)))  # the same thread, held: passes


def test_the_contention_check_fails_missing_evidence_a_policy_not_held_and_a_deadline_at_full_share():
    scenario = SimpleNamespace(contention=Contention(10, 25))
    with pytest.raises(RunFailed, match="contention evidence missing: host gone"):
        checks.contention_held(replace(_contention(), evidence=EvidenceMissing("host gone")), scenario)
    with pytest.raises(RunFailed, match="did not hold.*no evidence"):
        checks.contention_held(replace(_contention(), evidence=None), scenario)
    with pytest.raises(RunFailed, match="did not hold on the vCPU threads"):
        checks.contention_held(_contention(ThreadEvidence(7, DEADLINE, False), held=False), scenario)
    with pytest.raises(RunFailed, match="ran under SCHED_DEADLINE for a 100 % share"):
        checks.contention_held(_contention(ThreadEvidence(7, DEADLINE, True), share=100),
                               SimpleNamespace(contention=Contention(10, 100)))


def test_the_contention_check_wants_sched_other_under_the_other_models():
    """A cfs-quota, credit or competing-load run's vCPU stays under the fair scheduler: SCHED_OTHER passes (the
    runner refused every such run before #28's credit work), SCHED_DEADLINE is a leftover that fails it."""
    thread = ThreadEvidence(7, OTHER, True, usage=_usage(7, 2.5), got_cpu=True)
    for c in (Contention(25, 25, "cfs-quota"), Contention(5, 5, "credit", CreditParams(credit_s=1)), Contention(1, 50, "competing-load")):
        checks.contention_held(_contention(thread), SimpleNamespace(contention=c))
        with pytest.raises(RunFailed, match=f"ran under SCHED_DEADLINE for a {c.cpu_share_pct:g} % share .model {c.model}"):
            checks.contention_held(_contention(replace(thread, policy_after=DEADLINE)), SimpleNamespace(contention=c))


# -- a failed run's exception ------------------------------------------------------------------------------

def _fail_inside(meta: RunMetadata, error: BaseException) -> None:
    with meta.carried_by_errors():
        meta.sysctls = SenderSysctls({"net.ipv4.tcp_no_metrics_save": "1"})
        raise error


def test_a_failed_run_raises_failed_run_carrying_its_metadata_from_the_original_error():
    meta = RunMetadata()
    with pytest.raises(FailedRun) as caught:
        _fail_inside(meta, RunFailed("iperf3 client exit code 1"))
    e = caught.value
    assert e.metadata is meta and isinstance(e.error, RunFailed) and e.__cause__ is e.error
    assert str(e) == "RunFailed: iperf3 client exit code 1"
    assert runmeta.of_error(e) == meta.to_dict() and runmeta.of_error(e)["timing"]["run_wall_s"] >= 0
    assert runmeta.of_error(e.error) == {}  # only the FailedRun carries it: nothing set on the original
    reason = runmeta.failure_reason(e)
    assert reason.startswith("RunFailed: iperf3 client exit code 1 (at test_typed_records.py:")
    assert reason.endswith(" in _fail_inside)")
    again = pickle.loads(pickle.dumps(e))  # crosses a process boundary with its metadata
    assert again.metadata == meta and str(again.error) == "iperf3 client exit code 1"


@pytest.mark.parametrize("error", [Interrupted(signal.SIGTERM), KeyboardInterrupt(),
                                   MixedTestbed("--testbed", "lab", "the testbed this campaign ran on")])
def test_interruptions_and_a_mixed_testbed_leave_as_themselves(error):
    meta = RunMetadata()
    with pytest.raises(type(error)) as caught:
        _fail_inside(meta, error)
    assert caught.value is error and not isinstance(caught.value, FailedRun)
    assert "run_wall_s" in meta.timing  # the wall time is kept however the block ends


def test_a_failed_run_is_not_wrapped_twice():
    inner = RunMetadata()
    with pytest.raises(FailedRun) as caught:
        with RunMetadata().carried_by_errors():
            _fail_inside(inner, OSError("ssh channel closed"))
    assert caught.value.metadata is inner and isinstance(caught.value.error, OSError)


def _testbed() -> SimpleNamespace:
    host = SimpleNamespace(name="nowhere")
    return SimpleNamespace(kind="local", emulator=SimpleNamespace(host=host, ports=("eth1", "eth2")))


def test_a_runner_failure_before_the_contention_records_what_clearing_the_policy_did(monkeypatch, tmp_path):
    runner = Runner(_testbed())

    def fail(scenario, out, meta, *, ports):
        meta.flow = FlowRecord("iperf3", ports, "10.0.0.3")
        raise RunFailed("the sender offers ['cubic'], not 'bbr'")

    monkeypatch.setattr(runner, "run", fail)
    monkeypatch.setattr(runner.session, "clear_deadline", lambda: DeadlineCleared([]))
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(10, 50), Flow("bbr", IperfParams(5)))
    with pytest.raises(FailedRun) as caught:
        runner(scenario, tmp_path, run_id="r", attempt=1)
    carried = runmeta.of_error(caught.value)
    assert carried["contention"] == {"after_failure": {"deadline_cleared_tids": []}}  # as records have it
    assert carried["flow"]["workload"] == "iperf3" and caught.value.metadata.contention is None
    assert RunMetadata.from_dict(carried).to_dict() == carried


def test_run_once_records_a_failure_with_the_original_reason_and_the_metadata(monkeypatch, tmp_path):
    def fail(self, scenario, out, meta, *, ports):
        meta.flow = FlowRecord("iperf3", ports, "10.0.0.3")
        raise EOFError

    monkeypatch.setattr(Runner, "run", fail)
    monkeypatch.setattr("bbrlab.run.session.TestbedSession.clear_deadline", lambda self: DeadlineCleared(error="no host"))
    record = run_once(_testbed(), Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(10, 50), Flow("bbr", IperfParams(5))),
                      tmp_path, run_id="r")
    assert record["status"] == "failed" and record["campaign"] == "adhoc"
    assert record["reason"].startswith("EOFError:  (at test_typed_records.py:") and record["reason"].endswith("in fail)")
    assert record["metadata"]["contention"] == {"after_failure": {"error": "no host"}}
    assert record["metadata"]["flow"]["workload"] == "iperf3"


def test_metadata_keys_the_campaign_adds_are_kept_and_unknown_keys_refused():
    meta = RunMetadata.from_dict(_record(RECORDS[0])["metadata"]).to_dict()
    added = {**meta, "worker": {"testbed": "a", "host": "h", "cpus": None}, "mixed": {"allowed": True, "differences": []}}
    assert json.dumps(RunMetadata.from_dict(added).to_dict()) == json.dumps(added)
    with pytest.raises(ValueError, match="not those of a bbrlab.run/2 record"):
        RunMetadata.from_dict({**meta, "surprise": 1})


def test_a_key_written_only_when_known_reads_as_none_and_is_left_out_while_none():
    """The alignment check's ``outside_window``: older records lack it (None, not written back); a run writes
    it, 0 included; ``fraction_inside`` is computed, dropped when read and written after the fields."""
    from bbrlab.sampling.alignment import AlignmentCheck
    old = {"aligned": True, "samples": 4, "inside": 3, "inside_within_uncertainty": 4, "offset_ns": 5,
           "uncertainty_ns": 6, "sample_interval_ms": 10, "warning": None, "fraction_inside": 0.75}
    check = recordjson.from_json(AlignmentCheck, old)
    assert check.outside_window is None and check.sample_interval_ms == 10
    assert json.dumps(check.to_dict()) == json.dumps(old)
    new = AlignmentCheck(False, 0, warning=None, outside_window=0).to_dict()
    assert list(new)[-2:] == ["outside_window", "fraction_inside"] and new["outside_window"] == 0
    meta = RunMetadata.from_dict({"alignment": old})
    assert isinstance(meta.alignment, AlignmentCheck) and meta.to_dict()["alignment"] == old


def test_the_kernel_reads_as_the_sender_kernel_or_only_its_origin_and_writes_back_as_it_was():
    """``metadata.kernel``: a local testbed names the kernel (SenderKernel, ``path`` null for a Debian one); a lab's
    says only where it came from (KernelOrigin, whose name is None); a kernel with keys of neither is refused."""
    from bbrlab.kernel.sender import KernelOrigin, SenderKernel
    named = {"name": "debian-6.1", "release": "6.1.0-1", "origin": "debian", "sha256": "ab", "package": "p",
             "package_version": "1", "suite": "bookworm", "path": None}
    for kernel, kind in ((named, SenderKernel), ({"origin": "lab"}, KernelOrigin)):
        meta = RunMetadata.from_dict({"kernel": kernel})
        assert type(meta.kernel) is kind and json.dumps(meta.to_dict()["kernel"]) == json.dumps(kernel)
    assert RunMetadata.from_dict({"kernel": {"origin": "lab"}}).kernel.name is None
    with pytest.raises(ValueError, match="kernel"):
        RunMetadata.from_dict({"kernel": {"origin": "lab", "name": "x"}})


def test_the_host_cpu_load_a_run_measures_reads_typed_and_writes_back_as_measured():
    """``metadata.cpu_load``: each watched host's :func:`~bbrlab.contention.hostcpu.busy_between`, typed by the
    run (:class:`~bbrlab.contention.hostcpu.CpuLoad`) and written back key for key."""
    from bbrlab.contention import hostcpu

    def stat(busy: int, idle: int) -> hostcpu.CpuTimes:
        line = f" {busy} 0 0 {idle} 0 0 0 0 0 0"
        return hostcpu.parse_proc_stat(f"cpu{line}\ncpu0{line}\n")

    measured = {name: hostcpu.busy_between(stat(10, 10), stat(20 + i, 30)) for i, name in
                enumerate(("emulator", "sender_hypervisor"))}
    load = recordjson.from_json(hostcpu.CpuLoad, measured)
    assert load.sender_hypervisor.cpus == 1 and load.emulator.busy_pct == measured["emulator"]["busy_pct"]
    assert json.dumps(RunMetadata(cpu_load=load).to_dict()["cpu_load"]) == json.dumps(measured)


# -- the run side's own parts: flow, versions, sysctls, module, offloads, iperf, flows ----------------------

def _meta_of(rel: str) -> tuple[dict, RunMetadata]:
    stored = _record(ROOT / rel)["metadata"]
    return stored, RunMetadata.from_dict(stored)


def test_a_module_runs_record_reads_its_flow_module_tools_sysctls_offloads_and_iperf_as_attributes():
    stored, meta = _meta_of("data/demo/runs/bbr2b-ts10ms-sh10-rtt20ms-100mbit-r00-210bc3847a/record.json")
    assert isinstance(meta.flow, FlowRecord) and meta.flow.workload == "iperf3"
    assert meta.flow.server_port == stored["flow"]["server_port"] and meta.flow.receiver_user is not None
    assert isinstance(meta.module, ModuleIdentity) and meta.module.name == "bbr2b" and meta.module.error is None
    assert meta.module.params["deficit_enable"] in (0, 1)
    assert isinstance(meta.versions, ToolVersions) and meta.versions.bbrlab == stored["versions"]["bbrlab"]
    assert isinstance(meta.sysctls, SenderSysctls) and meta.sysctls.sender_value("net.ipv4.tcp_no_metrics_save") == "1"
    assert meta.sysctls.sender_value("net.no.such") is None
    assert isinstance(meta.offloads, SenderOffloads) and meta.offloads.sender["interface"]
    assert isinstance(meta.iperf, IperfSummary) and meta.iperf.receiver_mbit == stored["iperf"]["receiver_mbit"]
    assert type(meta.iperf.start_unix_s) is int  # iperf3's whole number stays one, as written
    assert meta.flows is None and meta.to_dict() == stored


def test_a_record_made_before_the_receiving_account_reads_it_as_none_and_writes_it_left_out():
    stored, meta = _meta_of("data/buffer-queue-local/runs/bbr-ts10ms-sh100-rtt20ms-100mbit-qauthors-r00-"
                            "63fb3eefc3/record.json")
    assert meta.flow.receiver_user is None and meta.flow.receiver_caps is None and meta.module is None
    assert list(meta.to_dict()["flow"]) == list(stored["flow"])  # no receiver_user_note: null of its own


def test_a_several_flow_records_flows_read_as_flow_outcomes():
    stored, meta = _meta_of("data/fairness-local/runs/bbr-ts10ms-sh100-rtt20ms-20mbit-and-cubic-comp3s-r00-"
                            "8ee5667edc/record.json")
    (other,) = meta.flows
    assert isinstance(other, FlowOutcome) and other.index == 1 and other.cca == "cubic"
    assert other.origin == "competitor" and other.file == "iperf-flow1.json"
    assert meta.to_dict()["flows"] == stored["flows"]


def test_parts_not_measured_before_a_failure_are_none_and_written_as_empty_objects():
    meta = RunMetadata()
    assert meta.flow is meta.versions is meta.sysctls is meta.offloads is None
    written = meta.to_dict()
    assert all(written[k] == {} for k in ("versions", "sysctls", "offloads", "flow"))
    assert RunMetadata.from_dict(written) == meta


def test_a_flow_with_its_server_writes_the_receivers_note_null_included():
    flow = FlowRecord("iperf3", [5301], "10.0.0.3")
    assert recordjson.to_json(flow) == {"workload": "iperf3", "client_ports": [5301], "server_ip": "10.0.0.3"}
    flow.served_by(5201, "bbrlab-rx", None, ("cap_net_admin",))
    assert list(recordjson.to_json(flow)) == ["workload", "client_ports", "server_ip", "server_port",
                                              "receiver_user", "receiver_user_note", "receiver_caps"]
    assert recordjson.to_json(flow)["receiver_user_note"] is None


def test_an_unidentified_module_is_its_name_and_error_alone():
    module = ModuleIdentity("bbr9", error="module bbr9 is not loaded on sender")
    written = recordjson.to_json(module)
    assert written == {"name": "bbr9", "error": "module bbr9 is not loaded on sender"}
    assert recordjson.from_json(ModuleIdentity, written) == module


def _typed_meta(rel: str) -> RunMetadata:
    return RunMetadata.from_dict(_record(ROOT / "data" / rel / "record.json")["metadata"])


def test_a_sampled_runs_clocks_read_as_drifts_and_an_unsampled_run_has_none():
    from bbrlab.run.clocks import ClockDrift, RunClocks

    meta = _typed_meta("demo-sampled/runs/cubic-ts10ms-sh25-rtt20ms-100mbit-r00-eeb9b1c4e7")
    assert isinstance(meta.clocks, RunClocks) and list(meta.clocks.measured()) == ["sender", "emulator"]
    assert isinstance(meta.clocks.sender, ClockDrift) and meta.clocks.sender.end.measured_at > meta.clocks.sender.start.measured_at
    assert 0 < meta.clocks.emulator.start.uncertainty_s < 0.01
    assert _typed_meta("loss-transfer-local/runs/cubic-ts10ms-sh100-rtt40ms-20mbit-r00-50b4edb229").clocks is None
    assert recordjson.to_json(RunClocks(emulator=meta.clocks.emulator)) == {"emulator": meta.clocks.emulator.to_dict()}


def test_a_runs_bottleneck_sampler_reads_typed_with_its_binary():
    from bbrlab.sampling.bottleneck import BottleneckSummary

    meta = _typed_meta("demo-sampled/runs/cubic-ts10ms-sh25-rtt20ms-100mbit-r00-eeb9b1c4e7")
    assert isinstance(meta.bottleneck, BottleneckSummary) and meta.bottleneck.reason == "stop_file"
    assert isinstance(meta.bottleneck.binary, Deployed) and meta.bottleneck.binary.kind == "qdisc"
    assert meta.bottleneck.samples > 0 and isinstance(meta.bottleneck.interval_ms, int) and meta.bottleneck.qdiscs
    assert _typed_meta("loss-transfer-local/runs/cubic-ts10ms-sh100-rtt40ms-20mbit-r00-50b4edb229").bottleneck is None


def test_where_the_qemu_threads_ran_reads_typed_and_older_records_have_none():
    from bbrlab.contention.placement import QemuCpus, ThreadPlace

    meta = _typed_meta("demo-sampled/runs/cubic-ts10ms-sh25-rtt20ms-100mbit-r00-eeb9b1c4e7")
    assert isinstance(meta.qemu_cpus, QemuCpus) and meta.qemu_cpus.error is None and meta.qemu_cpus.receiver is None
    assert meta.qemu_cpus.emulator.pid > 0 and meta.qemu_cpus.emulator.vcpu_threads is None
    assert all(isinstance(t, ThreadPlace) and t.cpus_allowed for t in meta.qemu_cpus.sender.vcpu_threads.values())
    older = [m for m in map(_record, RECORDS) if "qemu_cpus" not in m["metadata"] and m.get("schema") == "bbrlab.run/2"]
    assert older and RunMetadata.from_dict(older[0]["metadata"]).qemu_cpus is None


def test_what_clearing_the_deadline_did_after_a_failure_reads_typed():
    meta = _typed_meta("demo/failed/cubic-ts1ms-sh50-rtt20ms-100mbit-r01-6b261c4943.a1")
    assert isinstance(meta.deadline_after_failure, DeadlineCleared) and meta.deadline_after_failure.error is None
    assert isinstance(meta.deadline_after_failure.deadline_cleared_tids, list)
    assert _typed_meta("loss-transfer-local/runs/cubic-ts10ms-sh100-rtt40ms-20mbit-r00-50b4edb229").deadline_after_failure is None


def _with_key(key: str) -> list[dict]:
    """The metadata of the committed current-schema records that hold ``key``."""
    return [r["metadata"] for r in map(_record, RECORDS) if key in r["metadata"] and r.get("schema") == "bbrlab.run/2"]


def test_what_the_recovery_cleared_reads_typed_the_keys_older_records_lack_as_none():
    from bbrlab.run.recoveryrecord import IperfKilled, Recovered, RunDirsRemoved

    found = _with_key("recovered")
    assert found and all(isinstance(RunMetadata.from_dict(m).recovered, Recovered) for m in found)
    meta = _typed_meta("demo/calibration/local-tcg-6.1.0-56-amd64-e95031f894/runs/"
                       "cubic-ts1ms-sh10-rtt20ms-unshaped-r00-c6224d6e46")
    assert meta.recovered.ledger_refused == [] and meta.recovered.private_dirs_removed is None
    assert meta.recovered.iperf3_killed == IperfKilled(sender=[], receiver=[]) and meta.recovered.samplers_stopped == 0
    assert meta.recovered.run_dirs_removed == RunDirsRemoved(receiver=[], sender=[])
    older = _typed_meta("loss-transfer-local/runs/cubic-ts10ms-sh100-rtt40ms-20mbit-r00-50b4edb229").recovered
    assert older.run_dirs_removed is None and older.partitions_removed is None and older.ledger_refused is None
    assert _typed_meta("demo-sampled/runs/cubic-ts10ms-sh25-rtt20ms-100mbit-r00-eeb9b1c4e7").recovered is None
    for m in found:
        assert json.dumps(RunMetadata.from_dict(m).to_dict()["recovered"]) == json.dumps(m["recovered"])


def test_a_recovery_writes_every_key_in_the_records_order_and_pickles():
    from bbrlab.run.recoveryrecord import IperfKilled, PrivateDirsRemoved, Recovered, RunDirsRemoved

    made = Recovered(trace_instances_removed=["i"], private_dirs_removed=PrivateDirsRemoved([], ["/s"], [], []),
                     deadline_cleared_tids=[7], cfs_cgroups_removed=[], load_loops_killed=[], ledger_refused=[],
                     partitions_removed=[], iperf3_killed=IperfKilled([1], [2]), samplers_stopped=1,
                     sshd_killed=[], ssh_clients_killed=[], run_dirs_removed=RunDirsRemoved([], []))
    written = RunMetadata(recovered=made).to_dict()["recovered"]
    assert list(written) == ["trace_instances_removed", "private_dirs_removed", "deadline_cleared_tids",
                             "cfs_cgroups_removed", "load_loops_killed", "ledger_refused", "partitions_removed",
                             "iperf3_killed", "samplers_stopped", "sshd_killed", "ssh_clients_killed",
                             "run_dirs_removed"]
    assert list(written["private_dirs_removed"]) == ["receiver", "sender", "emulator", "hypervisor"]
    assert RunMetadata.from_dict({"recovered": written}).recovered == made == pickle.loads(pickle.dumps(made))
    with pytest.raises(ValueError, match="recovered"):
        RunMetadata.from_dict({"recovered": {**written, "samplers_stopped": "many"}})


def test_what_the_campaign_added_reads_typed_and_a_run_without_it_reads_none():
    from bbrlab.run.campaignadded import CampaignAdded, HostGuardVerdict, SearchPlace

    guarded, searched = _with_key("host_guard"), _with_key("search")
    assert len(guarded) > 100 and len(searched) > 100
    for m in guarded + searched:
        meta = RunMetadata.from_dict(m)
        assert isinstance(meta.added, CampaignAdded) and meta.added.hang is meta.added.mixed is None
        if "host_guard" in m:
            assert isinstance(meta.added.host_guard, HostGuardVerdict)
            assert meta.added.host_guard.busy is (m["host_guard"]["other_busy_pct"] > m["host_guard"]["max_other_busy_pct"])
        if "search" in m:
            assert meta.added.search == SearchPlace(m["search"]["position"], m["search"]["round"])
        assert json.dumps(meta.to_dict()) == json.dumps(m)
    plain = _typed_meta("loss-transfer-local/runs/cubic-ts10ms-sh100-rtt40ms-20mbit-r00-50b4edb229")
    assert plain.added == CampaignAdded() and plain.added.host_guard is None and plain.added.search is None


def test_the_campaign_writes_its_keys_from_the_typed_parts_as_records_hold_them():
    from bbrlab.campaign import hostguard, sameness
    from bbrlab.campaign.attempt import Attempt, Finished
    from bbrlab.campaign.distributed import finished_of
    from bbrlab.run.campaignadded import MixedMark, WorkerPlace

    said = hostguard.verdict({"host_other": {"other_busy_pct": 30.5}}, hostguard.HostGuard(25.0))
    assert said == {"max_other_busy_pct": 25.0, "other_busy_pct": 30.5, "busy": True}
    assert sameness.mixed_marker({"allowed": 1, "differences": ["kernel"]}) == {"allowed": True, "differences": ["kernel"]}
    attempt = Attempt("r", 1, None, 0)
    done = Finished(attempt, "ok", None, {"timing": {}}, "t0", "t1", testbed="tb", worker_host="h", cpus=[2, 3])
    assert finished_of(done, attempt).metadata["worker"] == {"testbed": "tb", "host": "h", "cpus": [2, 3]}
    worker = finished_of(done, attempt, "tls").metadata["worker"]
    assert list(worker) == ["testbed", "host", "cpus", "transport"]
    meta = RunMetadata.from_dict({"worker": worker, "mixed": {"allowed": True, "differences": []}})
    assert meta.added.worker == WorkerPlace("tb", "h", [2, 3], "tls") and meta.added.mixed == MixedMark(True, [])
    assert RunMetadata.from_dict({"worker": {**worker, "transport": None}}).added.worker.transport is None
    with pytest.raises(ValueError, match="search"):
        RunMetadata.from_dict({"search": {"position": "first", "round": 0}})
