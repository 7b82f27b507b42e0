"""The timing environment (``metadata.timing_env``) read for real from the shared local testbed and checked against
reads that do not go through :mod:`bbrlab.testbed.timingenv`: the guest's sysfs files and its jiffies counted over
two seconds (HZ measured, not taken from the config), this machine's ``/proc`` and ``/sys`` read here in Python, and
QEMU's own command line; ``bbrlab doctor --testbed NAME`` shows the same. Then one real cfs-quota run: its record carries the timing environment and the cgroup's
throttling, and the runs table shows both."""

from __future__ import annotations

import glob
import subprocess
from pathlib import Path

import pytest

from bbrlab.analysis.records_reader import run_row
from bbrlab.run.runmeta import RunMetadata
from bbrlab.run.runner import run_once
from bbrlab.scenario.cpumodels import CfsParams
from bbrlab.scenario.scenario import Contention, Flow, IperfParams, Link, Scenario
from bbrlab.testbed import doctor, timingenv

pytestmark = [pytest.mark.system, pytest.mark.testbed]

CLOCKSOURCE = "/sys/devices/system/clocksource/clocksource0"
#: ``/proc/timer_list``'s clock (``now at N nsecs``) and jiffies (``jiffies: N``), twice, 2 s apart (root only).
JIFFIES_SH = ("grep -E '^now at|^jiffies:' /proc/timer_list | head -n 2; sleep 2; "
              "grep -E '^now at|^jiffies:' /proc/timer_list | head -n 2")


def _jiffies_per_s(text: str) -> float:
    """Jiffies per second of the kernel's own clock, from two readings of JIFFIES_SH's two lines each."""
    now = [int(line.split()[2]) for line in text.splitlines() if line.startswith("now at")]
    jiffies = [int(line.split()[1]) for line in text.splitlines() if line.startswith("jiffies:")]
    assert len(now) == len(jiffies) == 2, text
    return (jiffies[1] - jiffies[0]) / ((now[1] - now[0]) / 1e9)


def test_the_timing_environment_matches_independent_reads(testbed):
    """The local testbed here: a TCG guest on tsc (tsc, hpet and acpi_pm offered; no kvm-clock without KVM), Debian's
    6.1 config with HZ 250 and NO_HZ_FULL (built in, not asked for on the command line: no CPU is tickless while
    busy); this machine a KVM guest itself on tsc, HZ 250, NO_HZ_IDLE, without cpufreq (governor none) and SMT
    notsupported. Measured: the guest's jiffies ran at 250.1/s, the host's at 250.2/s."""
    vcpus = testbed.sender.vcpu_threads()
    env = timingenv.of_testbed(testbed, vcpus[0])
    print(f"\ntiming environment: {env}")
    guest, host, hv = env.guest, env.host, env.hypervisor
    assert guest.error is None and host.error is None and hv.error is None
    sender = testbed.sender.host
    assert guest.clocksource == sender.read_text(f"{CLOCKSOURCE}/current_clocksource").strip()
    assert guest.clocksources == sender.read_text(f"{CLOCKSOURCE}/available_clocksource").split()
    assert guest.kvm_clock == ("kvm-clock" in guest.clocksources)
    assert guest.kernel == sender.read_text("/proc/sys/kernel/osrelease").strip()
    assert guest.config == f"/boot/config-{guest.kernel}" and sender.exists(guest.config)
    assert guest.tick_mode in ("periodic", "nohz_idle", "nohz_full")
    measured_hz = _jiffies_per_s(sender.output(["sh", "-c", JIFFIES_SH], timeout=30))
    print(f"guest jiffies rate {measured_hz:.1f}/s against CONFIG_HZ {guest.hz}")
    assert abs(measured_hz - guest.hz) <= 0.05 * guest.hz

    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(line.split(":", 1)[1] for line in cpuinfo.splitlines() if line.startswith("model name"))
    assert host.cpu_model == " ".join(model.split())
    governors = sorted({Path(p).read_text().strip() for p in glob.glob(
        "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")})
    assert host.governor == (",".join(governors) or "none")
    control = Path("/sys/devices/system/cpu/smt/control")
    assert host.smt == (control.read_text().strip() if control.exists() else host.smt)
    assert host.clocksource == Path(f"{CLOCKSOURCE}/current_clocksource").read_text().strip()
    host_hz = _jiffies_per_s(subprocess.run(["sh", "-c", JIFFIES_SH], capture_output=True, text=True,
                                            check=True, timeout=30).stdout)
    print(f"host jiffies rate {host_hz:.1f}/s against CONFIG_HZ {host.hz}")
    assert host.hz is None or abs(host_hz - host.hz) <= 0.05 * host.hz

    argv = Path(f"/proc/{vcpus[0]}/cmdline").read_bytes().decode().split("\0")
    accel = argv[argv.index("-accel") + 1]
    assert hv.accelerator == testbed.accelerator and accel.split(",")[0] == testbed.accelerator
    assert f"-accel {accel}" in hv.qemu_options and not any(o.startswith("-smp") for o in hv.qemu_options)

    shown = {c.name: c.detail for c in doctor.check_timing(testbed.name)}  # bbrlab doctor --testbed NAME
    assert shown["timing: sender clock"].startswith(f"clocksource {guest.clocksource} ")
    assert f"HZ {guest.hz}, tick {guest.tick_mode}" in shown["timing: sender tick"]
    assert shown["timing: host governor"].startswith(host.governor) and f"-accel {accel}" in shown["timing: hypervisor"]


def test_a_cfs_quota_run_records_its_timing_environment_and_throttling(testbed, tmp_path):
    """A 3 s transfer at 50 Mbit/s with the vCPU held to 10 % of a CPU per 100 ms period: the TCG sender wants more
    (at 25 % it got 17.1 % and was throttled in 9 of 42 periods), so the quota binds in most periods. Measured in
    4 runs here: 59-65 periods, 56-65 of them throttled, 3.1-4.5 s throttled (56-69 ms per throttled period of
    the 90 ms a 10 ms quota leaves), 9.9-10.3 % achieved. The bounds: at least 20 periods (the contention spans
    the 3 s transfer), at least half throttled, at most 90 ms throttled per throttled period plus one period."""
    scenario = Scenario(Link(rtt_ms=20, rate_mbit=50), Contention(10, 10, "cfs-quota", CfsParams(100)),
                        Flow("cubic", IperfParams(duration_s=3)))
    record = run_once(testbed, scenario, tmp_path)
    assert record["status"] == "ok", record["reason"]
    meta = RunMetadata.from_dict(record["metadata"])
    env, throttling = meta.timing_env, meta.contention.evidence.throttling
    print(f"\nrecord: timing_env {record['metadata']['timing_env']}\nthrottling {throttling}; achieved "
          f"{meta.contention.evidence.achieved.achieved_share_pct} %")
    assert env.guest.clocksource and env.guest.hz and env.host.governor and env.hypervisor.qemu_options
    assert throttling.cgroup == record["metadata"]["contention"]["applied_model"]["path"]
    assert throttling.nr_periods >= 20 and 0.5 * throttling.nr_periods <= throttling.nr_throttled <= throttling.nr_periods
    assert 0 < throttling.throttled_ms <= throttling.nr_throttled * 90 + 100
    row = run_row(record, {}, "r", meta=meta)
    assert row["clocksource"] == env.guest.clocksource and row["hz"] == env.guest.hz
    assert row["cfs_nr_throttled"] == throttling.nr_throttled and row["cfs_throttled_ms"] == throttling.throttled_ms
