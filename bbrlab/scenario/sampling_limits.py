"""How much a flow may sample: the socket samplers on offer, how many sockets they watch, how many samples a run
may take, and the bottleneck queue's sampling interval (re-exported by :mod:`bbrlab.scenario.scenario`)."""

from __future__ import annotations

import math

from bbrlab.core.errors import ValidationError

#: Socket samplers a flow can ask for: the in-kernel BPF program, the persistent netlink (inet_diag) client,
#: or the ``ss`` fork loop (kept for cross-checks). benchmarks/sampling.py measured what each costs.
SAMPLERS = ("bpf", "netlink", "ss")
DEFAULT_SAMPLER = "bpf"
#: The netlink and BPF samplers watch at most this many data sockets (MAX_PORTS in bbrlab/sampling/native/sampler_common.h).
SAMPLER_MAX_PORTS = 64
#: At most this many socket samples (samples x streams) in one sampled run. A sample takes at most about
#: :data:`SAMPLE_RECORD_BYTES` in the log, so a run's log stays below 350 MB on this machine; the checks and the
#: ingest read it a line at a time (docs/sampling.md derives the bound; benchmarks/memory.py measures its memory).
MAX_SAMPLE_RECORDS = 500_000
SAMPLE_RECORD_BYTES = 700
#: The byte cap of a sampler's log streamed into the run directory: the largest log the bounds allow and 1 MiB
#: for its header, footer and messages. A longer log is cut there and its run fails (bbrlab.run.checks.samples).
SAMPLE_LOG_MAX_BYTES = MAX_SAMPLE_RECORDS * SAMPLE_RECORD_BYTES + (1 << 20)


def sampled_records(sample_ms: int, streams: int, duration_s: float) -> int:
    """Socket samples a run takes at most: one per stream every ``sample_ms`` for ``duration_s``."""
    return streams * math.ceil(duration_s * 1000 / sample_ms)


def check_sampling_load(sample_ms: int, streams: int, duration_s: float, sampler: str, *,
                        fields: tuple[str, str, str] = ("flow.sample_ms", "flow.streams", "flow.duration_s")) -> None:
    """Refuse a sampled flow the samplers cannot watch (more than :data:`SAMPLER_MAX_PORTS` streams for
    ``netlink``/``bpf``) or whose samples x streams over ``duration_s`` exceed :data:`MAX_SAMPLE_RECORDS`;
    ``fields`` names sample_ms, streams and duration_s in the error (a spec's keys, a flag)."""
    ms_field, streams_field, duration_field = fields
    if sampler != "ss" and streams > SAMPLER_MAX_PORTS:
        raise ValidationError(streams_field, streams,
                              f"1 <= streams <= {SAMPLER_MAX_PORTS} with sampler {sampler} (it watches at most "
                              f"{SAMPLER_MAX_PORTS} sockets); sample more streams with sampler ss, or fewer")
    records = sampled_records(sample_ms, streams, duration_s)
    if records <= MAX_SAMPLE_RECORDS:
        return
    min_ms = math.ceil(streams * duration_s * 1000 / MAX_SAMPLE_RECORDS)
    max_s = MAX_SAMPLE_RECORDS * sample_ms // (1000 * streams)
    max_streams = int(MAX_SAMPLE_RECORDS * sample_ms // (1000 * duration_s))
    ways = [f"{ms_field.rsplit('.', 1)[-1]} >= {min_ms} ms for these", f"{duration_field.rsplit('.', 1)[-1]} <= {max_s} s"]
    if max_streams >= 1:
        ways.append(f"{streams_field.rsplit('.', 1)[-1]} <= {max_streams}")
    raise ValidationError(
        f"{ms_field} with {streams_field} and {duration_field}", (sample_ms, streams, duration_s),
        f"samples x streams <= {MAX_SAMPLE_RECORDS} per run ({streams} stream(s) x {duration_s:g} s every "
        f"{sample_ms} ms is {records}): {', or '.join(ways)} (the log's size on the host: docs/sampling.md)")

#: ``flow.bottleneck_ms``: "auto" samples the emulator's bottleneck queue every :data:`DEFAULT_BOTTLENECK_MS`
#: in a sampled run (none in an unsampled one), 0 never, 1 to :data:`MAX_BOTTLENECK_MS` every that many ms.
DEFAULT_BOTTLENECK_MS, MAX_BOTTLENECK_MS = 5, 1000


def check_bottleneck_ms(value: object, field: str = "flow.bottleneck_ms") -> None:
    """Refuse a bottleneck sampling interval other than "auto", 0 or a whole number of ms up to the maximum."""
    if value == "auto" and isinstance(value, str):
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BOTTLENECK_MS:
        raise ValidationError(field, value, f'"auto", 0 (off) or a whole number of ms from 1 to {MAX_BOTTLENECK_MS}')


def bottleneck_interval_ms(bottleneck_ms: int | str, sample_ms: int | None) -> int | None:
    """The bottleneck queue's sampling interval in ms for a flow, None when it is not sampled."""
    if bottleneck_ms == "auto":
        return DEFAULT_BOTTLENECK_MS if sample_ms else None
    return bottleneck_ms or None
