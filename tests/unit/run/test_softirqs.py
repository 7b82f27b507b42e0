"""Which of the sender's vCPUs carried the flow's network work (issue #38): /proc/softirqs, /proc/stat and
/proc/interrupts read before and after the flow, their per-CPU differences recorded and put in the tables; the
run's vCPU count read back; the testbed session reboots the sender only when the count changes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bbrlab.analysis import tables
from bbrlab.analysis.records_reader import RunView
from bbrlab.core.errors import RunFailed
from bbrlab.run import checks, softirqs
from bbrlab.run import session as run_session
from bbrlab.run.runmeta import RunMetadata
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario


def _output(rx: tuple[int, int], tx: tuple[int, int], user: tuple[int, int], irqs: tuple[int, int],
            first: bool) -> str:
    head = "dev=eth1\nrx_queues=1\ntx_queues=1\ndevice=virtio2\n" if first else ""
    return head + f"""--softirqs
                    CPU0       CPU1
          HI:          0          0
      NET_TX:   {tx[0]:>8}   {tx[1]:>8}
      NET_RX:   {rx[0]:>8}   {rx[1]:>8}
--stat
cpu  900 0 300 5000 0 0 70 0 0 0
cpu0 {user[0]} 0 100 2500 0 0 30 0 0 0
cpu1 {user[1]} 0 200 2500 0 0 40 0 0 0
intr 1234
--interrupts
           CPU0       CPU1
  1:          9          0   IO-APIC   1-edge      i8042
 24:          0          0   PCI-MSI 65536-edge      virtio2-config
 25:   {irqs[0]:>8}   {irqs[1]:>8}   PCI-MSI 65537-edge      virtio2-input.0
 26:          5          1   PCI-MSI 65538-edge      virtio2-output.0
 27:       7000          0   PCI-MSI 49153-edge      virtio1-input.0
NMI:          0          0   Non-maskable interrupts
"""


class FakeHost:
    """A sender answering the counters' command with the outputs given, in turn."""

    name = "sender"

    def __init__(self, *outputs: str):
        self.outputs, self.calls = list(outputs), []

    def output(self, argv, timeout=None):
        self.calls.append(argv)
        return self.outputs.pop(0)


BEFORE = _output((100, 10), (5, 0), (400, 500), (50, 2), first=True)
AFTER = _output((130, 4010), (6, 20), (410, 2500), (60, 3002), first=False)


def test_the_watch_records_each_cpus_differences_and_the_busiest():
    host = FakeHost(BEFORE, AFTER)
    with softirqs.SoftirqWatch(host, "10.77.0.2") as watch:
        assert watch.before.online_cpus == 2
    rec = watch.record()
    assert (rec.cpus, rec.interface, rec.rx_queues, rec.tx_queues, rec.device) == (2, "eth1", 1, 1, "virtio2")
    assert rec.net_rx == [30, 4000] and rec.net_tx == [1, 20] and rec.process_ticks == [10, 2000]
    assert rec.nic_irqs == [10, 3000] and rec.softirq_ticks == [0, 0]
    assert rec.net_rx_top == (1, round(4000 / 4030, 4)) and rec.process_top == (1, round(2000 / 2010, 4))
    assert rec.nic_irq_top[0] == 1 and rec.net_tx_top[0] == 1
    assert host.calls[0][-2:] == ["10.77.0.2", ""] and host.calls[1][-1] == "eth1"  # the interface found once


def test_the_record_round_trips_through_the_run_metadata_and_older_records_have_none():
    with softirqs.SoftirqWatch(FakeHost(BEFORE, AFTER), "10.77.0.2") as watch:
        pass
    meta = RunMetadata(softirqs=watch.record())
    again = RunMetadata.from_dict(meta.to_dict())
    assert again.softirqs == meta.softirqs and meta.to_dict()["softirqs"]["net_rx"] == [30, 4000]
    assert "softirqs" not in RunMetadata().to_dict() and RunMetadata.from_dict({}).softirqs is None


def test_a_failed_read_on_leaving_a_failed_block_keeps_the_blocks_failure():
    class Broken(FakeHost):
        def output(self, argv, timeout=None):
            if self.outputs:
                return super().output(argv, timeout)
            raise softirqs.SoftirqReadError("gone")

    with pytest.raises(RuntimeError, match="the run's own"):
        with softirqs.SoftirqWatch(Broken(BEFORE), "10.77.0.2") as watch:
            raise RuntimeError("the run's own")
    assert watch.record() is None
    with pytest.raises(softirqs.SoftirqReadError):
        with softirqs.SoftirqWatch(Broken(BEFORE), "10.77.0.2"):
            pass


def test_bad_output_is_refused_by_name():
    with pytest.raises(softirqs.SoftirqReadError, match="NET_RX"):
        softirqs.parse_softirqs(["CPU0", "HI: 0"])
    with pytest.raises(softirqs.SoftirqReadError, match="header"):
        softirqs.parse_softirqs(["NET_RX: 1"])
    with pytest.raises(softirqs.SoftirqReadError, match="no route"):
        with softirqs.SoftirqWatch(FakeHost(BEFORE.replace("dev=eth1", "dev=")), "10.77.0.2"):
            pass
    assert softirqs.top_cpu([0, 0]) == (None, None) and softirqs.top_cpu([3, 3]) == (0, 0.5)
    assert softirqs.parse_interrupts(["CPU0"], "") is None


def test_the_runs_vcpus_are_read_back():
    checks.sender_vcpus(None, 4, 1)  # no count asked: nothing to check (a lab, a host-netns sender)
    checks.sender_vcpus(2, 2, 2)
    with pytest.raises(RunFailed, match="asks for 2 sender vCPU.*1 CPU"):
        checks.sender_vcpus(2, 1, 1)
    with pytest.raises(RunFailed, match="hypervisor reports 1 vCPU thread"):
        checks.sender_vcpus(2, 2, 1)


def _row(meta: dict) -> dict:
    scenario = Scenario(Link(20, 100), Contention(1, 100), Flow("bbr"), sender_vcpus=2).to_dict()
    view = RunView({"run_id": "r", "scenario": scenario, "metadata": meta}, {}, "runs/r")
    return {c.name: c.of_record(view) for c in tables.RUN_SCHEMA}


def test_the_tables_show_the_count_and_the_busiest_cpus():
    with softirqs.SoftirqWatch(FakeHost(BEFORE, AFTER), "10.77.0.2") as watch:
        pass
    row = _row({"testbed": {"name": "local", "sender_vcpus": 1}, "softirqs": watch.record().__dict__})
    assert row["sender_vcpus"] == 2  # read back in the guest wins over the testbed's start
    assert (row["softirq_net_rx_top_cpu"], row["sender_busiest_cpu"], row["nic_irq_top_cpu"]) == (1, 1, 1)
    assert row["sender_nic_queues"] == 1 and row["softirq_net_rx_top_share"] == pytest.approx(0.9926, abs=1e-4)
    older = _row({"testbed": {"name": "local", "sender_vcpus": 1}})
    assert older["sender_vcpus"] == 1 and older["softirq_net_rx_top_cpu"] is None
    assert older["contended_threads"] is None
    assert "sender_vcpus" in tables.POINT_COLUMNS


# -- the testbed session --------------------------------------------------------------------------------------
class FakeBed:
    """A local testbed of ``vcpus`` sender vCPUs whose sender boot id changes with every boot."""

    def __init__(self, vcpus: int, boot: int = 0):
        host = SimpleNamespace(name="emulator", output=lambda argv, **_: "emulator-boot")
        self.kind, self.name, self.boot = "local", "local", boot
        self.local = SimpleNamespace(sender_vcpus=vcpus)
        self.emulator = SimpleNamespace(host=host, ports=("eth1", "eth2"))
        self.sender = SimpleNamespace(host=SimpleNamespace(output=lambda argv, **_: f"sender-boot-{self.boot}"))

    def close(self):
        pass


def test_the_session_reboots_the_sender_only_when_the_count_changes(monkeypatch):
    calls = []

    def reboot(name, *, sender, emulator, sender_vcpus, progress):
        calls.append(("reboot", sender, emulator, sender_vcpus))
        return FakeBed(sender_vcpus, boot=len(calls))

    def up(name, *, sender_vcpus, kernel, progress):
        calls.append(("up", kernel, sender_vcpus))
        return FakeBed(sender_vcpus, boot=len(calls))

    fake = SimpleNamespace(reboot=reboot, up=up)
    monkeypatch.setattr(run_session.TestbedSession, "_testbed_mod", staticmethod(lambda: fake))
    session = run_session.TestbedSession(FakeBed(1))
    meta = RunMetadata()
    session.boot(None, meta, sender_vcpus=1)
    session.boot(None, meta, sender_vcpus=None)
    assert calls == [] and "vcpus_boot_s" not in meta.timing
    session.boot(None, meta, sender_vcpus=2)
    session.boot(None, meta, sender_vcpus=2)
    assert calls == [("reboot", True, False, 2)] and "vcpus_boot_s" in meta.timing
    session.boot("debian-6.12", meta, sender_vcpus=1)  # a kernel and a count: one boot
    assert calls[-1] == ("up", "debian-6.12", 1) and len(calls) == 2
    session.boot("debian-6.12", meta)  # no count asked: the sender keeps its count
    assert len(calls) == 2 and session.testbed.local.sender_vcpus == 1


def test_a_lab_session_refuses_a_count():
    bed = FakeBed(1)
    bed.kind, bed.local = "lab", None
    with pytest.raises(RunFailed, match="leave sender_vcpus out of a lab's spec"):
        run_session.TestbedSession(bed).boot(None, RunMetadata(), sender_vcpus=2)
