"""The vCPU trace's parsing, intervals, schedstat comparison and alignment check, from real trace text.

Both fixtures were captured on this project's host (kernel 6.18, trace clock mono) by
:func:`bbrlab.sampling.vcputrace.traced`, the reader's raw output kept as it came:

- ``deadline-1ms-4ms.txt``: a busy Python process under SCHED_DEADLINE runtime 1 ms / period 4 ms, traced 1 s;
- ``sleeper-2ms-on-5ms-off.txt``: a process that spins 2 ms and sleeps 5 ms in a loop, traced 0.1 s;
- ``testbed-sender-vcpu-other.txt.gz``: the shared testbed's sender vCPU thread (TCG, SCHED_OTHER, tid 9726) while
  the test suite used it, observed for 3 s: 119 of its switch-ins are missing from the kernel's trace (switches
  out of the idle task, on this host), which the timeline infers;
- ``deadline-qemu-vcpu-1ms-25pct.txt.gz``: the vCPU thread of a QEMU whose guest spins (tid 2653) under
  SCHED_DEADLINE 1 ms / 25 %, traced 2 s with ``sched_stat_runtime``: the deadline timer moves the thread between
  the two CPUs, and none of its switch-ins on CPU 1 is in the trace (no event of CPU 1's idle task ever is).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from bbrlab.core import recordjson
from bbrlab.core.errors import ValidationError
from bbrlab.sampling import alignment, vcpuparse, vcputrace
from bbrlab.sampling.vcputrace import TraceSummary

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "vcputrace"
DEADLINE_TID, SLEEPER_TID = 24769, 24855


def _trace(name: str, tid: int) -> vcputrace.VcpuTrace:
    text = gzip.open(DATA / name, "rt").read() if name.endswith(".gz") else (DATA / name).read_text()
    return vcputrace.build("fixture", [tid], iter(text.splitlines()), bytes_read=len(text), capped=False,
                           lost_events=0, reader_cpu_s=vcpuparse.parse_times(text))


def test_a_switch_line_with_a_comm_holding_spaces_parses():
    line = ("       CPU 0/TCG-18830   [000] d..2. 13608.834649: sched_switch: prev_comm=CPU 0/TCG prev_pid=18830 "
            "prev_prio=120 prev_state=R+ ==> next_comm=python next_pid=22518 next_prio=-1")
    e = vcpuparse.parse_line(line)
    assert (e.kind, e.cpu, e.mono_ns, e.prev_tid, e.prev_state, e.next_tid) == \
        ("switch", 0, 13608_834649_000, 18830, "R+", 22518)


def test_wakeups_markers_and_other_lines():
    wake = vcpuparse.parse_line("       CPU 0/TCG-18830   [001] dNh3. 13616.142686: sched_wakeup: comm=python "
                                "pid=22735 prio=120 target_cpu=001")
    assert (wake.kind, wake.tid, wake.mono_ns) == ("wakeup", 22735, 13616_142686_000)
    mark = vcpuparse.parse_line("            bash-24798   [000] ...1. 13698.781454: tracing_mark_write: "
                                "bbrlab-rt start 1795686955.867897")
    assert (mark.kind, mark.text) == ("marker", "bbrlab-rt start 1795686955.867897")
    for other in ("# tracer: nop", "0m0.003s 0m0.000s", "", "bbrlab-capped 123"):
        assert vcpuparse.parse_line(other) is None


def test_the_exchanges_give_the_clock_offset_within_its_bracket():
    text = (DATA / "deadline-1ms-4ms.txt").read_text()
    found = vcpuparse.exchanges(vcpuparse.parse_line(s) for s in text.splitlines() if vcpuparse.parse_line(s))
    start = found["start"]
    # realtime 1795686955.867897 read between the b marker (13698.781430) and its own (13698.781454)
    low, high = 1795686955_867897_000 - 13698_781454_000, 1795686955_867897_000 - 13698_781430_000
    offset, unc = start.realtime_offset_ns
    assert low <= offset <= high and unc == 12_000
    assert start.schedstat[DEADLINE_TID] == (13698_781516_000, 325737719)
    assert (start.steal_ticks, found["end"].steal_ticks) == (2113, 2118)


def test_deadline_trace_intervals_alternate_and_tile_the_window():
    trace = _trace("deadline-1ms-4ms.txt", DEADLINE_TID)
    ivs = trace.intervals
    assert ivs[0].start_ns == trace.window_ns[0] and ivs[-1].end_ns == trace.window_ns[1]
    assert all(a.end_ns == b.start_ns and a.on != b.on for a, b in zip(ivs, ivs[1:], strict=False))
    assert not any(iv.inferred for iv in ivs)
    assert all(iv.left_state.startswith("R") for iv in ivs if not iv.on and not iv.clipped)  # throttled
    s = trace.summary()
    assert 0.22 < s["on_cpu_share"] < 0.28  # runtime 1 ms of every 4 ms
    assert s["gaps"]["count"] > 100 and s["gaps"]["p50_ms"] >= 2.5  # period - runtime = 3 ms, or longer
    assert s["reader_cpu_s"] == pytest.approx(0.006 + 0.016 + 0.001)  # bash's times: shell, children
    recorded = {"file": "vcpu.csv", **s}  # metadata.vcpu_trace, as the run records it: typed and written back as it was
    typed = recordjson.from_json(TraceSummary, recorded)
    assert typed.gaps.count == s["gaps"]["count"] and json.dumps(recordjson.to_json(typed)) == json.dumps(recorded)


def test_deadline_trace_agrees_with_schedstat_within_two_percent():
    trace = _trace("deadline-1ms-4ms.txt", DEADLINE_TID)
    [cmp] = trace.schedstat
    assert cmp["schedstat_run_ns"] == 584399255 - 325737719
    assert abs(cmp["relative_diff"]) <= 0.02 and trace.schedstat_agrees() is True
    assert trace.host_steal_s == pytest.approx(0.05)


def test_sleeper_gaps_start_asleep_and_carry_their_wakeup():
    trace = _trace("sleeper-2ms-on-5ms-off.txt", SLEEPER_TID)
    slept = [iv for iv in trace.intervals if not iv.on and iv.left_state == "S" and not iv.clipped]
    assert len(slept) >= 10
    assert all(iv.woken_ns is not None and iv.start_ns < iv.woken_ns <= iv.end_ns for iv in slept)
    assert all(4.5e6 < iv.woken_ns - iv.start_ns < 12e6 for iv in slept)  # time.sleep(0.005)
    assert trace.schedstat_agrees() is True


def test_missing_switch_ins_are_inferred_from_wakeups_and_then_agree_with_schedstat():
    trace = _trace("testbed-sender-vcpu-other.txt.gz", 9726)
    inferred = [iv for iv in trace.intervals if iv.inferred]
    assert trace.summary()["inferred_switch_ins"] == {"runtime": 0, "idle-exit": 0, "wakeup": 113, "bound": 6}
    assert all(iv.on for iv in inferred)
    # an interval inferred from a wakeup starts at that wakeup, which ended the gap before it
    for iv in (iv for iv in inferred if iv.inferred == "wakeup"):
        before = trace.intervals[trace.intervals.index(iv) - 1]
        assert not before.on and before.end_ns == iv.start_ns == before.woken_ns
    [cmp] = trace.schedstat  # without the inference the trace's on-CPU time was 20 % short of schedstat's
    assert abs(cmp["relative_diff"]) <= 0.02 and cmp["schedstat_run_ns"] == 1700439498


def test_csv_rows_are_realtime(tmp_path):
    trace = _trace("deadline-1ms-4ms.txt", DEADLINE_TID)
    rows = trace.write_csv(tmp_path / "vcpu.csv")
    lines = (tmp_path / "vcpu.csv").read_text().splitlines()
    assert rows == len(lines) - 1 == len(trace.intervals)
    first = lines[1].split(",")
    assert int(first[2]) == trace.intervals[0].start_ns + trace.realtime_offset_ns
    assert 1795686955 < int(first[2]) / 1e9 < 1795686957


def test_a_trace_without_its_end_markers_is_refused_unless_capped():
    lines = [s for s in (DATA / "deadline-1ms-4ms.txt").read_text().splitlines() if "bbrlab-b end" not in s]
    with pytest.raises(vcputrace.VcpuTraceError, match="end"):
        vcputrace.build("x", [DEADLINE_TID], iter(lines), bytes_read=0, capped=False, lost_events=0, reader_cpu_s=None)
    capped = vcputrace.build("x", [DEADLINE_TID], iter(lines), bytes_read=0, capped=True, lost_events=0,
                             reader_cpu_s=None)
    assert capped.capped and capped.schedstat_agrees() is None


def test_gap_percentiles_nearest_rank():
    ivs = [vcpuparse.Interval(1, False, 0, n * 1_000_000) for n in range(1, 101)]
    assert vcpuparse.gap_stats_ms(ivs) == {"count": 100, "p50_ms": 50.0, "p90_ms": 90.0, "p99_ms": 99.0,
                                           "max_ms": 100.0}
    assert vcpuparse.gap_stats_ms([])["count"] == 0


def test_alignment_counts_samples_inside_on_intervals(capsys):
    trace = _trace("deadline-1ms-4ms.txt", DEADLINE_TID)
    on = trace.on_intervals_realtime()
    guest_offset = 7_000_000_000  # the guest's clock runs 7 s behind the host's
    inside = [(s + e) // 2 - guest_offset for s, e in on[:50]]
    result = alignment.check(inside, on, alignment.ClockOffset(guest_offset, 10_000), sample_interval_ms=10)
    assert (result.inside, result.fraction_inside, result.warning) == (50, 1.0, None)
    # a wrong offset puts many samples in the gaps (75 % of the time is off-CPU): loud
    wrong = alignment.check(inside, on, alignment.ClockOffset(guest_offset + 2_500_000, 10_000), sample_interval_ms=10)
    assert wrong.fraction_inside < 0.99 and "worse than one sample interval" in wrong.warning
    assert "WARNING" in capsys.readouterr().err


def test_alignment_leaves_out_samples_before_and_after_the_traced_window():
    # a netlink sampler runs from before the transfer to after it; the trace covers the transfer only. Here a
    # real run's shape: 797 samples over 8 s, a 5.45 s trace; outside the window the vCPU's state is unknown
    on = [(1_000_000_000 + k * 10_000_000, 1_000_000_000 + k * 10_000_000 + 4_000_000) for k in range(545)]
    window = (1_000_000_000, 6_450_000_000)
    samples = [k * 10_000_000 + 2_000_000 for k in range(800)]  # the middle of each on-CPU slot, 0-8 s
    unwindowed = alignment.check(samples, on, alignment.ClockOffset(0, 100_000), sample_interval_ms=10)
    assert unwindowed.fraction_inside < 0.7 and unwindowed.warning
    result = alignment.check(samples, on, alignment.ClockOffset(0, 100_000), 10, window)
    assert (result.samples, result.outside_window, result.inside, result.warning) == (545, 255, 545, None)
    assert result.to_dict()["outside_window"] == 255


def test_alignment_without_an_offset_is_recorded_as_not_aligned():
    result = alignment.check([1, 2, 3], [(0, 10)], None, sample_interval_ms=10)
    assert result.to_dict()["aligned"] is False and result.inside is None and result.warning is None


def test_alignment_uncertainty_beyond_one_sample_interval_warns():
    result = alignment.check([5], [(0, 10)], alignment.ClockOffset(0, 20_000_000), sample_interval_ms=10)
    assert result.fraction_inside == 1.0 and "exceeds one sample interval" in result.warning
    with pytest.raises(ValidationError, match="uncertainty"):
        alignment.ClockOffset(0, -1)


def test_guest_sample_times_from_an_ss_log():
    log = "# t=1795686955.867897\nESTAB ...\n# t=1795686955,877901\n"
    assert alignment.guest_sample_times_ns(log, "ss") == [1795686955_867897_000, 1795686955_877901_000]


def test_thread_ids_are_checked_before_anything_runs():
    for bad in ([], [0], [1, 1], ["12"], [True]):
        with pytest.raises(ValidationError, match="thread ids"):
            vcputrace.check_tids(bad)


def test_leftover_instance_names_carry_their_owner():
    name = vcputrace.instance_name()
    m = vcputrace._NAME.match(name)
    assert m and int(m.group(2)) > 0


def test_a_traced_run_fills_the_vcpu_table_and_its_summary_columns_through_the_cache(tmp_path):
    import json
    import shutil

    from bbrlab.analysis import data

    shutil.copytree(DATA.parent / "campaign", tmp_path / "c")
    run = sorted((tmp_path / "c" / "runs").iterdir())[0]
    trace = _trace("deadline-1ms-4ms.txt", DEADLINE_TID)
    trace.write_csv(run / "vcpu.csv")
    record = json.loads((run / "record.json").read_text())
    record["metadata"]["vcpu_trace"] = {"file": "vcpu.csv", **trace.summary()}
    (run / "record.json").write_text(json.dumps(record))
    for force in (True, False):  # read, then from the cache (its parquet files)
        t = data.load(tmp_path / "c", force=force)
        traced = t.runs[t.runs["path"].str.contains(run.name)].iloc[0]
        assert traced["vcpu_gaps"] == trace.summary()["gaps"]["count"]
        assert traced["vcpu_on_cpu_share"] == pytest.approx(trace.summary()["on_cpu_share"])
        assert bool(traced["vcpu_schedstat_agrees"]) and pd.isna(traced["samples_inside_on_cpu"])
        assert len(t.vcpu) == len(trace.intervals) and set(t.vcpu["run_id"]) == {traced["run_id"]}
        assert t.vcpu["start_ns"].dtype == "Int64" and t.vcpu["on_cpu"].sum() == sum(iv.on for iv in trace.intervals)
        assert t.counts()["vcpu"] == len(trace.intervals)


@pytest.mark.parametrize("name, kind", [("live-bbr-both.bpf.log.gz", "bpf"), ("live-bbr.sockdiag.log.gz", "netlink")])
def test_guest_sample_times_from_the_native_samplers_logs(name, kind):
    import gzip

    from bbrlab.sampling import sockdiag

    text = gzip.open(DATA.parent / "sockdiag" / name, "rt").read()
    times = alignment.guest_sample_times_ns(text, kind)
    assert len(times) > 100 and times == sorted(times)
    rows = sockdiag.rows(text, check=False)  # the socket rows: taken at those times (a tick may find no socket)
    assert times[0] <= min(r["t_unix_s"] for r in rows) * 1e9 + 1e3
    assert max(r["t_unix_s"] for r in rows) * 1e9 <= times[-1] + 1e3


def test_an_exchange_measurement_becomes_a_guest_to_host_offset_with_its_drift():
    # the guest's clock reads 2.5 s ahead of the host's at host time 1000 s and gains 100 us per s (100 ppm)
    offset = alignment.ClockOffset.of_remote_minus_local(2.5, 0.0002, drift_ppm=100.0, measured_at_s=1000.0)
    assert offset.uncertainty_ns == 200_000
    assert offset.to_host_ns(1_002_500_000_000) == 1_000_000_000_000
    # 10 s later (guest time) the guest is 1 ms further ahead
    assert offset.to_host_ns(1_012_500_000_000) == pytest.approx(1_010_000_000_000 - 1_000_000, abs=2)


def test_an_idle_exit_of_the_cpu_starts_an_inferred_interval():
    out1 = vcpuparse.parse_line("       CPU 0/TCG-9726    [001] d..2. 100.000100: sched_switch: prev_comm=CPU 0/TCG "
                                "prev_pid=9726 prev_prio=120 prev_state=R ==> next_comm=swapper/1 next_pid=0 next_prio=120")
    exit_ = vcpuparse.parse_line("          <idle>-0       [001] dN.1. 100.003000: cpu_idle: state=4294967295 cpu_id=1")
    out2 = vcpuparse.parse_line("       CPU 0/TCG-9726    [001] d..2. 100.004000: sched_switch: prev_comm=CPU 0/TCG "
                                "prev_pid=9726 prev_prio=120 prev_state=R ==> next_comm=swapper/1 next_pid=0 next_prio=120")
    assert (exit_.kind, exit_.cpu) == ("idle_exit", 1)
    assert vcpuparse.parse_line("          <idle>-0       [001] d..1. 100.002000: cpu_idle: state=1 cpu_id=1") is None
    line = vcpuparse.timelines([out1, exit_, out2], {9726: (100_000_000_000, 100_005_000_000)}, {})[9726]
    on = [iv for iv in line.intervals if iv.on]
    assert [(iv.start_ns, iv.end_ns, iv.inferred) for iv in on][1] == (100_003_000_000, 100_004_000_000, "idle-exit")


def _switch(t: str, cpu: int, out: bool) -> vcpuparse.Event:
    if out:
        text = (f"       CPU 0/TCG-9726    [00{cpu}] d..2. {t}: sched_switch: prev_comm=CPU 0/TCG prev_pid=9726 "
                f"prev_prio=-1 prev_state=R ==> next_comm=swapper/{cpu} next_pid=0 next_prio=120")
    else:
        text = (f"          <idle>-0       [00{cpu}] d..2. {t}: sched_switch: prev_comm=swapper/{cpu} prev_pid=0 "
                f"prev_prio=120 prev_state=R ==> next_comm=CPU 0/TCG next_pid=9726 next_prio=-1")
    return vcpuparse.parse_line(text)


def _runtime(t: str, cpu: int, ns: int) -> vcpuparse.Event:
    return vcpuparse.parse_line(f"       CPU 0/TCG-9726    [00{cpu}] d.h1. {t}: sched_stat_runtime: comm=CPU 0/TCG "
                                f"pid=9726 runtime={ns} [ns]")


def test_the_first_runtime_accounted_after_a_switch_out_dates_the_unrecorded_switch_in():
    rt = _runtime("100.004000", 1, 1_400_000)
    assert (rt.kind, rt.cpu, rt.tid, rt.runtime_ns) == ("runtime", 1, 9726, 1_400_000)
    events = [_runtime("100.000050", 0, 50_000),  # before any switch: the state is unknown, it dates nothing
              _switch("100.000100", 0, out=True),
              rt, _runtime("100.004500", 1, 480_000),  # the second accounting covers only the time since the first
              _switch("100.004510", 1, out=True),
              _switch("100.008000", 0, out=False), _runtime("100.009000", 0, 999_000), _switch("100.009010", 0, out=True)]
    line = vcpuparse.timelines(events, {9726: (100_000_000_000, 100_010_000_000)}, {})[9726]
    on = [(iv.start_ns, iv.end_ns, iv.cpu, iv.inferred) for iv in line.intervals if iv.on]
    assert on == [(100_000_000_000, 100_000_100_000, None, ""),  # on since the window began (clipped)
                  (100_002_600_000, 100_004_510_000, 1, "runtime"),  # 100.004000 - 1.4 ms
                  (100_008_000_000, 100_009_010_000, 0, "")]  # a recorded switch-in: the runtime changes nothing
    # each on-CPU interval also keeps where the scheduler's accounting of it began and its last accounting
    assert [(iv.accounted_start_ns, iv.accounted_end_ns) for iv in line.intervals if iv.on] == [
        (None, None), (100_002_600_000, 100_004_500_000), (100_008_001_000, 100_009_000_000)]
    assert all(iv.accounted_end_ns is None for iv in line.intervals if not iv.on)


def test_a_runtime_longer_than_the_gap_does_not_start_before_the_previous_switch_out():
    events = [_switch("100.000100", 0, out=True), _runtime("100.001000", 1, 5_000_000), _switch("100.001010", 1, out=True)]
    line = vcpuparse.timelines(events, {9726: (100_000_000_000, 100_002_000_000)}, {})[9726]
    assert [(iv.on, iv.start_ns, iv.end_ns, iv.inferred) for iv in line.intervals] == [
        (True, 100_000_000_000, 100_000_100_000, ""), (True, 100_000_100_000, 100_001_010_000, "runtime"),
        (False, 100_001_010_000, 100_002_000_000, "")]


def test_deadline_vcpu_switch_ins_missing_on_cpu1_are_dated_by_runtime_and_agree_with_schedstat():
    trace = _trace("deadline-qemu-vcpu-1ms-25pct.txt.gz", 2653)
    on = [iv for iv in trace.intervals if iv.on]
    inferred = [iv for iv in on if iv.inferred]
    assert trace.summary()["inferred_switch_ins"] == {"runtime": 81, "idle-exit": 0, "wakeup": 0, "bound": 0}
    assert sum(iv.cpu == 1 for iv in inferred) == 80  # the host's finding: CPU 1's switch-ins from idle are missing
    assert 0.24 < trace.summary()["on_cpu_share"] < 0.26  # the 25 % asked
    # the slots dated by their runtime last as long as those whose switch-in was recorded (3.09 and 3.06 ms here)
    dated = sorted(iv.length_ns for iv in inferred)[len(inferred) // 2]
    recorded = [iv.length_ns for iv in on if not iv.inferred and not iv.clipped]
    assert dated == pytest.approx(sorted(recorded)[len(recorded) // 2], rel=0.1)
    [cmp] = trace.schedstat
    assert abs(cmp["relative_diff"]) <= 0.02 and trace.schedstat_agrees() is True
    # on the scheduler's accounting boundaries: 0.0 %; from switch to switch: +0.84 %; the accounting events
    # themselves add up to schedstat's run time to the nanosecond (none was lost)
    assert cmp["compared"] == "accounted" and abs(cmp["relative_diff"]) < 0.001
    assert cmp["relative_diff_switch"] == pytest.approx(0.00842, abs=1e-5)
    assert cmp["trace_runtime_ns"] == cmp["schedstat_run_ns"] and cmp["relative_diff_runtime"] == 0.0


def test_a_trace_without_accounting_events_is_compared_from_switch_to_switch():
    [cmp] = _trace("deadline-1ms-4ms.txt", DEADLINE_TID).schedstat
    assert cmp["compared"] == "switch" and cmp["trace_accounted_ns"] is None and cmp["trace_runtime_ns"] is None
    assert cmp["relative_diff_raw"] == cmp["relative_diff_switch"]


def test_without_runtime_events_the_same_trace_overstates_the_on_cpu_time():
    text = gzip.open(DATA / "deadline-qemu-vcpu-1ms-25pct.txt.gz", "rt").read()
    lines = [line for line in text.splitlines() if "sched_stat_runtime" not in line]
    trace = vcputrace.build("fixture", [2653], iter(lines), bytes_read=len(text), capped=False, lost_events=0,
                            reader_cpu_s=None)
    assert trace.summary()["inferred_switch_ins"]["bound"] >= 70
    assert trace.schedstat[0]["relative_diff"] > 1.0 and trace.schedstat_agrees() is False  # +144 %: why runtime is traced


def test_a_thread_first_accounted_after_the_window_began_was_off_until_then():
    # its switch-in before the first switch-out was not recorded; the accounting says it came 2 ms into the window
    events = [_runtime("100.003000", 1, 1_000_000), _switch("100.003100", 1, out=True)]
    line = vcpuparse.timelines(events, {9726: (100_000_000_000, 100_005_000_000)}, {})[9726]
    assert [(iv.on, iv.start_ns, iv.end_ns, iv.inferred, iv.clipped) for iv in line.intervals] == [
        (False, 100_000_000_000, 100_002_000_000, "", True), (True, 100_002_000_000, 100_003_100_000, "runtime", False),
        (False, 100_003_100_000, 100_005_000_000, "", True)]
