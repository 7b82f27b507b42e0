"""How far a remote host's clock is from this machine's: the offset of its CLOCK_REALTIME, with its uncertainty.

The sender's socket samples carry the sender guest's wall clock, the bottleneck samples the emulator guest's,
the host's traces this machine's. To put them on one axis, :func:`measure` exchanges timestamps with the remote
host, NTP-style: this machine reads its clock (``t1``), asks the remote host for its clock (``t``), reads its
own again when the answer arrives (``t2``). The remote clock was read somewhere between ``t1`` and ``t2``, so

    offset = t - (t1 + t2) / 2          (remote minus local, seconds)
    uncertainty = (t2 - t1) / 2         (the true offset lies within offset +- uncertainty)

whatever the delays on the way there and back. Of several exchanges the one with the smallest round trip is
kept: its bound is the tightest.

A fresh SSH command per exchange would put a whole command's start-up (a fork and exec in a TCG guest) into
the round trip; instead one long-lived remote ``bash`` answers each line it reads on its stdin with
``$EPOCHREALTIME`` (a builtin: no fork), over one SSH channel (:meth:`bbrlab.core.hosts.Host.hold_open`).

A run measures at its start and at its end (:class:`ClockWatch`); the change of the offset between the two
is the remote clock's drift against ours, in parts per million, and :func:`to_local` maps a remote timestamp
to this machine's clock by interpolating the offset between them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from bbrlab.core import recordjson
from bbrlab.core.errors import BbrlabError, ValidationError
from bbrlab.core.hosts import Host

#: bash on the remote host: says ``ready``, then answers every line it reads with its wall clock (seconds).
#: ``$EPOCHREALTIME`` is bash's own (no fork); a locale's decimal comma is made a point.
CLOCK_BASH = r"""
echo ready
while read -r _; do t=$EPOCHREALTIME; printf '%s\n' "${t/,/.}"; done
"""
#: Exchanges per measurement (the one with the smallest round trip is kept).
DEFAULT_EXCHANGES = 20
#: A run's measurement goes on, a batch of :data:`DEFAULT_EXCHANGES` at a time, while its best uncertainty is
#: above this (seconds) and fewer than :data:`MAX_EXCHANGES` were made: a busy moment (the emulator while the
#: sender's TCG guest ran flat out) can leave the fastest of 20 above 1 ms.
TARGET_UNCERTAINTY_S = 0.001
MAX_EXCHANGES = 100
#: Seconds to wait for the remote clock's ``ready`` and for each answer.
ANSWER_TIMEOUT_S = 30.0


class ClockError(BbrlabError):
    """The remote clock could not be read (its process did not start, or answered something else)."""


@dataclass(frozen=True)
class ClockOffset:
    """The remote clock minus this machine's, as one measurement found it (all in seconds).

    ``offset_s``: remote CLOCK_REALTIME minus local, from the exchange with the smallest round trip;
    ``uncertainty_s``: half that round trip (the true offset lies within ``offset_s +- uncertainty_s``);
    ``round_trip_s``: that round trip; ``exchanges``: how many exchanges were made; ``measured_at``: local
    CLOCK_REALTIME (Unix seconds) of that exchange's midpoint.
    """

    offset_s: float
    uncertainty_s: float
    round_trip_s: float
    exchanges: int
    measured_at: float

    def to_dict(self) -> dict:
        """The record's JSON (``metadata.clocks.<host>.start`` / ``.end``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ClockOffset:
        """A record's offset back."""
        return cls(**d)


def best_exchange(exchanges: list[tuple[float, float, float]]) -> ClockOffset:
    """The offset from ``(t1, t, t2)`` exchanges (local send, remote clock, local receive; seconds): the one
    with the smallest round trip. ValueError for no exchange, or one whose receive precedes its send."""
    if not exchanges:
        raise ValueError("no clock exchange to take the offset from")
    for t1, _, t2 in exchanges:
        if t2 < t1:
            raise ValueError(f"a clock exchange was received ({t2}) before it was sent ({t1})")
    t1, t, t2 = min(exchanges, key=lambda e: e[2] - e[0])
    mid = (t1 + t2) / 2
    return ClockOffset(offset_s=t - mid, uncertainty_s=(t2 - t1) / 2, round_trip_s=t2 - t1,
                       exchanges=len(exchanges), measured_at=mid)


class RemoteClock:
    """A remote host's clock, read through one long-lived process (:data:`CLOCK_BASH`); :meth:`close` it."""

    def __init__(self, host: Host):
        self.host = host
        self._held = host.hold_open(["bash", "-c", CLOCK_BASH, "bbrlab-clock"])
        try:
            first = self._held.readline(ANSWER_TIMEOUT_S).strip()
            if first != "ready":
                raise ClockError(f"[{host.name}] the clock process said {first!r}, not 'ready'")
        except BaseException:
            self._held.close(wait_s=2)
            raise

    def exchange(self) -> tuple[float, float, float]:
        """One exchange: (local send, remote clock, local receive), Unix seconds."""
        t1 = time.clock_gettime(time.CLOCK_REALTIME)
        self._held.send("t\n")
        answer = self._held.readline(ANSWER_TIMEOUT_S)
        t2 = time.clock_gettime(time.CLOCK_REALTIME)
        try:
            return t1, float(answer), t2
        except ValueError:
            raise ClockError(f"[{self.host.name}] the clock process answered {answer!r}, not seconds") from None

    def measure(self, exchanges: int = DEFAULT_EXCHANGES, target_uncertainty_s: float | None = None,
                max_exchanges: int = MAX_EXCHANGES) -> ClockOffset:
        """The offset from ``exchanges`` exchanges (1 to 1000), the one with the smallest round trip kept. With a
        ``target_uncertainty_s``, more batches of ``exchanges`` follow while the best uncertainty is above it,
        up to ``max_exchanges`` in all (the offset says how many were made)."""
        if isinstance(exchanges, bool) or not isinstance(exchanges, int) or not 1 <= exchanges <= 1000:
            raise ValidationError("exchanges", exchanges, "an integer from 1 to 1000")
        made = [self.exchange() for _ in range(exchanges)]
        best = best_exchange(made)
        while target_uncertainty_s is not None and best.uncertainty_s > target_uncertainty_s \
                and len(made) < max_exchanges:
            made += [self.exchange() for _ in range(min(exchanges, max_exchanges - len(made)))]
            best = best_exchange(made)
        return best

    def close(self) -> None:
        """End the remote process (end of file on its stdin)."""
        self._held.close(wait_s=5)


def measure(host: Host, exchanges: int = DEFAULT_EXCHANGES) -> ClockOffset:
    """``host``'s clock offset from ``exchanges`` exchanges over one remote process started for them."""
    clock = RemoteClock(host)
    try:
        return clock.measure(exchanges)
    finally:
        clock.close()


@dataclass(frozen=True)
class ClockDrift:
    """A host's clock offset at the start and at the end of a run, and the drift between them."""

    start: ClockOffset
    end: ClockOffset

    @property
    def drift_ppm(self) -> float | None:
        """How fast the offset changed, in parts per million (microseconds per second); None when both
        measurements were taken at the same instant."""
        span = self.end.measured_at - self.start.measured_at
        return (self.end.offset_s - self.start.offset_s) / span * 1e6 if span > 0 else None

    @property
    def drift_uncertainty_ppm(self) -> float | None:
        """The bound on :attr:`drift_ppm` from the two measurements' uncertainties."""
        span = self.end.measured_at - self.start.measured_at
        return (self.start.uncertainty_s + self.end.uncertainty_s) / span * 1e6 if span > 0 else None

    def offset_at(self, local_t: float) -> float:
        """The offset (remote minus local, s) at local time ``local_t``, interpolated (or extrapolated)
        linearly between the two measurements."""
        span = self.end.measured_at - self.start.measured_at
        if span <= 0:
            return self.start.offset_s
        slope = (self.end.offset_s - self.start.offset_s) / span
        return self.start.offset_s + slope * (local_t - self.start.measured_at)

    def to_local(self, remote_t: float) -> float:
        """Remote timestamp ``remote_t`` (Unix seconds) as this machine's clock read it at that instant."""
        # the offset changes by microseconds per second: evaluating it at the remote time is exact enough
        return remote_t - self.offset_at(remote_t - self.start.offset_s)

    def to_dict(self) -> dict:
        """The record's JSON (``metadata.clocks.<host>``): start, end, drift_ppm, drift_uncertainty_ppm."""
        ppm, ppm_u = self.drift_ppm, self.drift_uncertainty_ppm
        return {"start": self.start.to_dict(), "end": self.end.to_dict(),
                "drift_ppm": None if ppm is None else round(ppm, 3),
                "drift_uncertainty_ppm": None if ppm_u is None else round(ppm_u, 3)}

    @classmethod
    def from_dict(cls, d: dict) -> ClockDrift:
        """A record's ``metadata.clocks.<host>`` back (the drift is recomputed from start and end)."""
        return cls(ClockOffset.from_dict(d["start"]), ClockOffset.from_dict(d["end"]))

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Where nested in a typed record, read and written by :meth:`from_dict` and :meth:`to_dict` (the drift
        written rounded after start and end: :func:`bbrlab.core.recordjson.own_layout`)."""
        return recordjson.own_layout(cls)


@dataclass(frozen=True)
class RunClocks:
    """``metadata.clocks`` of a run with guest timestamps: the ``sender``'s and the ``emulator``'s clock against
    this machine's at the run's start and end (:class:`ClockDrift`), as :class:`ClockWatch` measured them. A
    host not measured is left out of the JSON (None here)."""

    sender: ClockDrift | None = recordjson.left_out_when_none()
    emulator: ClockDrift | None = recordjson.left_out_when_none()

    def measured(self) -> dict[str, ClockDrift]:
        """The hosts measured, by name, in the record's order."""
        return {name: drift for name, drift in (("sender", self.sender), ("emulator", self.emulator))
                if drift is not None}

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The measured hosts' drifts, the others left out (:func:`bbrlab.core.recordjson.record_layout`)."""
        return recordjson.record_layout(source, handler)


def to_local(remote_t: float, clocks: dict) -> float:
    """Remote timestamp ``remote_t`` on this machine's clock, from a record's ``metadata.clocks.<host>`` (JSON)."""
    return ClockDrift.from_dict(clocks).to_local(remote_t)


class ClockWatch:
    """The clocks of named hosts measured at the start of a run (:meth:`start`) and at its end
    (:meth:`finish`), each through a remote process held open in between (it waits on its stdin, costing
    nothing). :meth:`close` ends the processes; :meth:`record` is ``metadata.clocks`` (hosts named ``sender``
    and ``emulator``)."""

    def __init__(self, hosts: dict[str, Host], exchanges: int = DEFAULT_EXCHANGES):
        self.hosts, self.exchanges = dict(hosts), exchanges
        self._clocks: dict[str, RemoteClock] = {}
        self._start: dict[str, ClockOffset] = {}
        self.drifts: dict[str, ClockDrift] = {}

    def start(self) -> None:
        """Open each host's clock and measure its offset."""
        for name, host in self.hosts.items():
            self._clocks[name] = RemoteClock(host)
            self._start[name] = self._clocks[name].measure(self.exchanges, TARGET_UNCERTAINTY_S)

    def finish(self) -> None:
        """Measure each host's offset again: its drift since :meth:`start`."""
        for name, clock in self._clocks.items():
            self.drifts[name] = ClockDrift(self._start[name], clock.measure(self.exchanges, TARGET_UNCERTAINTY_S))

    def close(self) -> None:
        """End the remote processes (every one, even when one fails to end)."""
        clocks, self._clocks = self._clocks, {}
        for clock in clocks.values():
            try:
                clock.close()
            except Exception:  # noqa: BLE001 - a channel already gone leaves nothing to end
                pass

    def record(self) -> RunClocks:
        """``metadata.clocks`` after :meth:`finish`: each host's start, end and drift. ValueError for a host
        :meth:`finish` did not measure (the watch failed) or one not named ``sender`` or ``emulator``."""
        missing = sorted(set(self._start) - set(self.drifts))
        if missing:
            raise ValueError(f"clocks {missing} were measured at the start only")
        unknown = sorted(set(self.drifts) - {"sender", "emulator"})
        if unknown:
            raise ValueError(f"clocks {unknown} are not a run's (sender, emulator)")
        return RunClocks(**self.drifts)

    def __enter__(self) -> ClockWatch:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.finish()
        finally:
            self.close()
