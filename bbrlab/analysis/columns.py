"""A table column (:class:`Column`: name, dtype, unit and meaning), the ``runs`` columns that name the machine and
the boots a run ran on and its timing environment, and the schemas of the per-run detail tables: the vCPU trace's intervals, the emulator's
bottleneck samples, iperf3's per-stream intervals and per-flow summaries. :mod:`bbrlab.analysis.tables` holds the main tables and builds them all."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bbrlab.campaign.dimensions import DIMENSIONS, Dimension


@dataclass(frozen=True)
class Column:
    """One column of a table.

    Parameters
    ----------
    name : str
        Column name; a unit suffix (``_ms``, ``_mbit``, ``_pct``) states the unit.
    dtype : str
        pandas dtype: ``"string"``, ``"float64"``, ``"Int64"`` (integer or missing), ``"bool"``.
    doc : str
        What the column holds, with its unit.
    of_record : callable, optional
        For ``runs`` columns: how to read the value from a bbrlab run (a :class:`bbrlab.analysis.records_reader.RunView`).
    """

    name: str
    dtype: str
    doc: str
    of_record: Callable[[Any], Any] | None = None


VCPU_SCHEMA: tuple[Column, ...] = (
    Column("run_id", "string", "the run"),
    Column("tid", "Int64", "the vCPU thread's id on the hypervisor host"),
    Column("on_cpu", "bool", "the thread was on a host CPU (else off it)"),
    Column("start_ns", "Int64", "interval start, the host's CLOCK_REALTIME [ns] (1 us resolution)"),
    Column("end_ns", "Int64", "interval end [ns]"),
    Column("length_ms", "float64", "end - start [ms]"),
    Column("cpu", "Int64", "the host CPU it ran on (on-CPU intervals)"),
    Column("left_state", "string", "off-CPU: the thread's state when it left (R preempted or throttled, S asleep)"),
    Column("woken_ns", "Int64", "off-CPU: when a sleeping thread was woken [ns]"),
    Column("clipped", "bool", "one end is the trace window's edge, not a scheduler event"),
    Column("inferred", "string", "on-CPU, its switch-in missing from the trace: start from the first runtime "
           "accounted after it (runtime), its CPU's idle exit (idle-exit), the wakeup (wakeup) or an upper bound "
           "(bound); <NA> when both ends are events"),
)

BOTTLENECK_SCHEMA: tuple[Column, ...] = (
    Column("run_id", "string", "the run"),
    Column("t_host_s", "float64", "when the emulator sampled the queue, on the clock of the machine that ran the "
           "campaign (Unix seconds; the emulator's clock shifted by its measured offset, interpolated between the "
           "run's start and end; missing when the record has no clock offsets) [s]"),
    Column("t_s", "float64", "time since the run's first bottleneck sample [s]"),
    Column("align_uncertainty_ms", "float64", "the bound on t_host_s's error: the larger of the emulator clock "
           "offset's two uncertainties [ms]"),
    Column("kind", "string", "the qdisc (tbf, netem, ...) on the emulator's data port"),
    Column("handle", "string", "its handle as tc prints it"),
    Column("bottleneck", "bool", "this qdisc holds the bottleneck queue (tbf in bbrlab's tree, netem in the "
           "authors')"),
    Column("backlog_bytes", "Int64", "bytes queued in it [bytes]"),
    Column("qlen_packets", "Int64", "packets queued in it [packets]"),
    Column("drops", "Int64", "packets it dropped since it was set (cumulative) [packets]"),
    Column("bytes", "Int64", "bytes it sent since it was set (cumulative) [bytes]"),
    Column("packets", "Int64", "packets it sent since it was set (cumulative) [packets]"),
    Column("overlimits", "Int64", "times it held a packet back for lack of tokens (cumulative)"),
)

STREAM_SCHEMA: tuple[Column, ...] = (
    Column("run_id", "string", "the run"),
    Column("flow", "Int64", "the flow within the run, from 0 (a single-flow run: 0)"),
    Column("stream", "Int64", "the stream within the flow, from 0 (iperf3 -P)"),
    Column("port", "Int64", "the stream's local port on the sender"),
    Column("t_start_s", "float64", "interval start since the run's first flow started (the flow's start "
           "offset plus iperf3's interval start) [s]"),
    Column("t_end_s", "float64", "interval end, same clock [s]"),
    Column("throughput_mbit", "float64", "the receiver's bytes of this stream in the interval of the same "
           "index (iperf3's server output) [Mbit/s]"),
    Column("sender_throughput_mbit", "float64", "bytes the sender wrote to this stream in the interval [Mbit/s]"),
    Column("retransmits", "float64", "the stream's retransmissions in the interval"),
    Column("rtt_ms", "float64", "the stream's smoothed RTT at the interval's end (iperf3's rtt) [ms]"),
    Column("rttvar_ms", "float64", "the stream's RTT variance at the interval's end [ms]"),
    Column("cwnd_bytes", "float64", "the stream's congestion window at the interval's end (snd_cwnd) [bytes]"),
)

FLOW_SCHEMA: tuple[Column, ...] = (
    Column("run_id", "string", "the run"),
    Column("flow", "Int64", "the flow within the run, from 0"),
    Column("origin", "string", "sender (the contended sender VM) or competitor (an uncontended sender on the "
           "sender's side of the bottleneck)"),
    Column("cca", "string", "the flow's congestion control"),
    Column("streams", "Int64", "the flow's parallel streams"),
    Column("start_s", "float64", "when the flow started, after the run's first flow [s]"),
    Column("duration_s", "float64", "the flow's asked transfer time [s]"),
    Column("throughput_mbit", "float64", "iperf3's receiver sum over the flow's whole transfer [Mbit/s]"),
    Column("sender_throughput_mbit", "float64", "iperf3's sender sum over the flow's transfer [Mbit/s]"),
    Column("retransmits", "float64", "the flow's retransmissions (iperf3 sender sum)"),
    Column("mean_rtt_ms", "float64", "iperf3's mean_rtt averaged over the flow's streams [ms]"),
    Column("overlap_throughput_mbit", "float64", "the flow's mean throughput in the window when every flow "
           "sent (bbrlab.analysis.fairness); <NA> for one flow [Mbit/s]"),
    Column("share", "float64", "overlap_throughput_mbit over the sum of the flows' (0..1); <NA> for one flow"),
)


#: ``runs`` columns: the machine and the boots a run ran on (``metadata.testbed``; bbrlab.core.machine). Records made
#: before bbrlab named the machine read <NA> in the machine's three.
MACHINE_SCHEMA: tuple[Column, ...] = (
    Column("machine", "string", "the host that ran the sender VM, '<CPU model> @ <MHz> MHz' (nominal speed, else "
           "maximum, else current to 10 MHz); <NA> in records made before bbrlab named it",
           lambda v: v.testbed.machine and v.testbed.machine.label),
    Column("machine_id", "string", "that host's anonymised machine id (16 hex digits of a SHA-256 of "
           "/etc/machine-id; clones of one VM image share it)",
           lambda v: v.testbed.machine and v.testbed.machine.machine_id),
    Column("host_boot_id", "string", "that host's anonymised boot id: another value after every boot of the host",
           lambda v: v.testbed.machine and v.testbed.machine.boot_id),
    Column("sender_boot_id", "string", "the sender VM's boot id: the runs of one sender boot share it",
           lambda v: v.testbed.sender_boot_id),
)


def _timing(v, part: str, name: str):
    """``metadata.timing_env.<part>.<name>`` of a run (bbrlab.testbed.timingenv); None in records made before it."""
    env = v.meta.timing_env
    return None if env is None else getattr(getattr(env, part), name)


#: ``runs`` columns: the run's timing environment (``metadata.timing_env``; bbrlab.testbed.timingenv), <NA> in
#: records made before it was read. Not in the run identity: they describe the run, the spec does not set them.
TIMING_SCHEMA: tuple[Column, ...] = (
    Column("clocksource", "string", "the sender guest's current clocksource (tsc, kvm-clock, hpet ...)",
           lambda v: _timing(v, "guest", "clocksource")),
    Column("hz", "Int64", "the sender guest kernel's CONFIG_HZ (from /boot/config-<release> or /proc/config.gz); "
           "<NA> when neither exists [1/s]", lambda v: _timing(v, "guest", "hz")),
    Column("tick_mode", "string", "the sender guest kernel's tick: periodic, nohz_idle or nohz_full (its config), "
           "unknown without a config", lambda v: _timing(v, "guest", "tick_mode")),
    Column("host_cpu_model", "string", "the CPU model of the host that ran the sender VM (/proc/cpuinfo)",
           lambda v: _timing(v, "host", "cpu_model")),
    Column("governor", "string", "that host's CPU frequency governor(s) (scaling_governor; several joined by ','); "
           "none without cpufreq", lambda v: _timing(v, "host", "governor")),
    Column("smt", "string", "that host's SMT: smt/control (on, off, forceoff, notsupported, notimplemented), else "
           "on/off from CPU 0's thread siblings", lambda v: _timing(v, "host", "smt")),
)


#: A dimension's values' type -> its column's dtype.
_DTYPES = {str: "string", int: "Int64", float: "float64"}


def _reader(d: Dimension) -> Callable[[Any], Any]:
    """How a run's value of dimension ``d`` is read from its record's scenario (where :attr:`Dimension.lands_in`:
    a key of the scenario's JSON, :meth:`~bbrlab.scenario.scenario.Scenario.to_dict`); a record made before the
    dimension existed ran at its default."""
    default = d.default[0] if d.default else None

    def read(v) -> Any:
        scenario = v.scenario.to_dict()
        part = scenario if d.part == "scenario" else scenario.get(d.part) or {}
        return part.get(d.field, default)
    return read


def dimension_columns(schema: tuple[Column, ...]) -> tuple[Column, ...]:
    """``runs`` columns for the spec's dimensions (:data:`bbrlab.campaign.dimensions.DIMENSIONS`) whose column
    ``schema`` lacks, read where the value lands in the scenario: a new dimension's column from its table entry
    on (none while every dimension's column is declared in ``schema`` with its own reader)."""
    have = {c.name for c in schema}
    out = {d.column: Column(d.column, _DTYPES[d.type], d.doc + (f" [{d.unit}]" if d.unit else ""), _reader(d))
           for d in DIMENSIONS if d.column not in have}
    return tuple(out.values())
