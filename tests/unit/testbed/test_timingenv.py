"""The timing environment a run records (``metadata.timing_env``): the guest's and the host's scripts' output
parsed (kernel config found or not, cpufreq or none, SMT from control or from thread siblings), QEMU's timer
options picked from its command line, a host that cannot be read recorded rather than raised, the typed part's
round trip, older records without it, and its runs-table columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bbrlab.analysis.records_reader import run_row
from bbrlab.core import errors
from bbrlab.run.runmeta import RunMetadata
from bbrlab.testbed import timingenv
from bbrlab.testbed.timingenv import GuestTiming, HostTiming, HypervisorTiming, TimingEnvironment

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "data/contention-models-local/runs/bbr-cfs100ms-sh25-rtt20ms-20mbit-r00-6f28cad813/record.json"

#: The sender guest of the local testbed as GUEST_SCRIPT prints it (Debian 12, TCG).
GUEST = """clocksource=tsc
available=tsc acpi_pm
kernel=6.1.0-41-amd64
cmdline=root=/dev/vda rw console=ttyS0 init=/sbin/bbrlab-init net.ifnames=0 quiet panic=1 clocksource=tsc nohz=off
config=/boot/config-6.1.0-41-amd64
CONFIG_NO_HZ_IDLE=y
CONFIG_HZ=250
"""
#: This project's host as HOST_SCRIPT prints it (a KVM guest itself: no cpufreq, SMT not supported).
HOST = """cpu_model= Intel(R) Xeon(R)  Processor
smt_control=notsupported
smt_active=0
siblings=0
clocksource=tsc
config=/proc/config.gz
CONFIG_NO_HZ_IDLE=y
CONFIG_HZ=250
qemu_arg=qemu-system-x86_64
qemu_arg=-name
qemu_arg=bbrlab-x-sender,debug-threads=on
qemu_arg=-accel
qemu_arg=kvm
qemu_arg=-cpu
qemu_arg=host
qemu_arg=-smp
qemu_arg=1
qemu_arg=-rtc
qemu_arg=base=utc,clock=vm
qemu_arg=-global
qemu_arg=kvm-pit.lost_tick_policy=discard
qemu_arg=-global
qemu_arg=virtio-net-pci.mq=on
"""


def test_the_guests_clocks_tick_and_timer_options_are_read():
    g = timingenv.parse_guest(GUEST)
    assert g == GuestTiming(clocksource="tsc", clocksources=["tsc", "acpi_pm"], kvm_clock=False, hz=250,
                            tick_mode="nohz_idle", config="/boot/config-6.1.0-41-amd64",
                            timer_cmdline=["clocksource=tsc", "nohz=off"], kernel="6.1.0-41-amd64")
    assert timingenv.parse_guest(GUEST.replace("tsc acpi_pm", "kvm-clock tsc acpi_pm")).kvm_clock is True


@pytest.mark.parametrize("lines, hz, mode", [
    ("config=/proc/config.gz\nCONFIG_HZ_PERIODIC=y\nCONFIG_HZ=1000\n", 1000, "periodic"),
    ("config=/proc/config.gz\nCONFIG_NO_HZ_FULL=y\nCONFIG_HZ=100\n", 100, "nohz_full"),
    ("config=/boot/config-2.6\nCONFIG_NO_HZ=y\nCONFIG_HZ=300\n", 300, "nohz_idle"),  # before NO_HZ_IDLE existed
    ("config=/proc/config.gz\n", None, "unknown"),  # a config naming neither
    ("config=\n", None, "unknown"),  # neither /boot/config-<release> nor /proc/config.gz
    ("", None, "unknown"),
])
def test_hz_and_tick_mode_come_from_the_config_or_are_unknown(lines, hz, mode):
    tick = timingenv.kernel_tick(timingenv.key_values(lines))
    assert (tick.hz, tick.tick_mode) == (hz, mode)


def test_the_host_without_cpufreq_has_governor_none_and_smt_from_its_control():
    h = timingenv.parse_host(HOST)
    assert h == HostTiming(cpu_model="Intel(R) Xeon(R) Processor", governor="none", smt="notsupported",
                           smt_active=False, clocksource="tsc", hz=250, tick_mode="nohz_idle", config="/proc/config.gz")


def test_governors_are_distinct_and_sorted():
    text = "governor=powersave\ngovernor=performance\n"
    assert timingenv.parse_host(text).governor == "performance,powersave"
    assert timingenv.parse_host("governor=schedutil\n").governor == "schedutil"


@pytest.mark.parametrize("control, active, siblings, smt", [
    ("on", "1", "0,2", ("on", True)), ("forceoff", "0", "0", ("forceoff", False)),
    (None, None, "0,4", ("on", True)), (None, None, "0-1", ("on", True)), (None, None, "0", ("off", False)),
    (None, None, None, ("unknown", None)),
])
def test_smt_is_the_kernels_control_else_thread_siblings(control, active, siblings, smt):
    assert timingenv.smt_state(control, active, siblings) == smt


def test_qemus_clock_and_timer_options_are_kept_with_their_values():
    argv = timingenv.key_values(HOST)["qemu_arg"]
    assert timingenv.qemu_timer_options(argv) == ["-accel kvm", "-cpu host", "-rtc base=utc,clock=vm",
                                                  "-global kvm-pit.lost_tick_policy=discard"]
    assert timingenv.qemu_timer_options(["qemu", "-enable-kvm", "--no-hpet", "-m", "1024"]) == ["-enable-kvm",
                                                                                              "-no-hpet"]
    assert timingenv.qemu_timer_options(["qemu", "-accel", "tcg,thread=multi", "-smp", "1"]) == ["-accel tcg,thread=multi"]


def test_the_hypervisors_options_are_read_only_when_a_qemu_thread_was_given():
    assert timingenv.parse_hypervisor(HOST, "kvm", asked=False) == HypervisorTiming("kvm")
    assert timingenv.parse_hypervisor(HOST, "kvm", asked=True).qemu_options[0] == "-accel kvm"
    gone = timingenv.parse_hypervisor("qemu_error=no process has thread 7\n", "tcg", asked=True)
    assert gone == HypervisorTiming("tcg", None, "no process has thread 7")


class _Host:
    """A host answering each script with fixed text, or failing."""

    def __init__(self, answer: str | Exception):
        self.answer, self.calls = answer, []

    def output(self, argv, **kw):
        self.calls.append(argv)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_one_command_per_host_reads_the_whole_environment():
    guest, host = _Host(GUEST), _Host(HOST)
    env = timingenv.measure(guest, host, accelerator="kvm", qemu_tid=4242)
    assert len(guest.calls) == 1 and len(host.calls) == 1 and host.calls[0][-1] == "4242"
    assert env.guest.hz == 250 and env.host.governor == "none" and env.hypervisor.qemu_options[0] == "-accel kvm"


def test_a_host_that_cannot_be_read_is_recorded_not_raised():
    env = timingenv.measure(_Host(errors.TestbedError("ssh: connection refused")), _Host(OSError("boom")),
                            accelerator="tcg", qemu_tid=None)
    assert env.guest == GuestTiming(error="TestbedError: ssh: connection refused")
    assert env.host == HostTiming(error="OSError: boom") and env.hypervisor == HypervisorTiming("tcg")


def _env() -> TimingEnvironment:
    return TimingEnvironment(timingenv.parse_guest(GUEST), timingenv.parse_host(HOST),
                             timingenv.parse_hypervisor(HOST, "kvm", asked=True))


def test_the_typed_part_round_trips_through_the_records_json_and_older_records_lack_it():
    record = json.loads(RECORD.read_text())
    old = RunMetadata.from_dict(record["metadata"])
    assert old.timing_env is None and "timing_env" not in old.to_dict()
    old.timing_env = _env()
    d = json.loads(json.dumps(old.to_dict()))
    assert d["timing_env"]["guest"]["clocksource"] == "tsc" and d["timing_env"]["host"]["smt"] == "notsupported"
    assert d["timing_env"]["hypervisor"] == {"accelerator": "kvm", "error": None, "qemu_options": [
        "-accel kvm", "-cpu host", "-rtc base=utc,clock=vm", "-global kvm-pit.lost_tick_policy=discard"]}
    again = RunMetadata.from_dict(d)
    assert again.timing_env == _env() and again.to_dict() == d


def test_the_runs_table_shows_the_main_fields_and_na_for_older_records():
    record = json.loads(RECORD.read_text())
    row = run_row(record, {}, "r", meta=RunMetadata.from_dict(record["metadata"]))
    names = ("clocksource", "hz", "tick_mode", "host_cpu_model", "governor", "smt")
    assert all(row[n] is None for n in names)
    meta = RunMetadata.from_dict(record["metadata"])
    meta.timing_env = _env()
    row = run_row(record, {}, "r", meta=meta)
    assert [row[n] for n in names] == ["tsc", 250, "nohz_idle", "Intel(R) Xeon(R) Processor", "none", "notsupported"]


def test_the_timing_columns_are_not_part_of_the_run_identity():
    from bbrlab.analysis.runkey import RUN_KEY

    assert not {"clocksource", "hz", "tick_mode", "host_cpu_model", "governor", "smt"} & set(RUN_KEY)
