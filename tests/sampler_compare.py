"""The samplers' rows against each other and against what ``ss`` printed at the same time: which columns
to compare, how, and which samples bracket another sampler's.

Shared by the parser's unit tests on output recorded in the guest (tests/fixtures/sockdiag) and the
testbed tests that record it.
"""

from __future__ import annotations

import math

from bbrlab.core.hostloop import RUNNING_SH
from bbrlab.sampling import sockdiag

#: Columns ss prints and an idle connection cannot change (the lastsnd/lastrcv/lastack ages are left out).
IDLE_FIELDS = ("cca", "recv_q", "send_q", "rto_ms", "rtt_ms", "rttvar_ms", "mss", "pmtu", "rcvmss", "advmss", "cwnd",
               "ssthresh", "bytes_sent", "bytes_retrans", "bytes_acked", "segs_out", "segs_in", "data_segs_out",
               "send_mbit", "pacing_rate_mbit", "delivery_rate_mbit", "delivered", "app_limited", "unacked",
               "retrans_out", "lost", "sacked", "rcv_space", "rcv_ssthresh", "notsent", "minrtt_ms", "snd_wnd",
               "bw_mbit", "mrtt_ms", "pacing_gain", "cwnd_gain", "inflight_bytes", "bdp_bytes", "inflight_bdp",
               "local", "peer", "port")

#: Values ss does not print (so its parser has None) while netlink reports them: retrans 0/0, the default
#: reordering of 3.
SS_OMITS = {"retrans_total": 0, "reordering": 3}

#: Counters that only grow: every ss sample must lie between the netlink samples around it.
MONOTONE = ("bytes_sent", "bytes_acked", "segs_out", "data_segs_out", "delivered", "bytes_retrans", "retrans_total")


def ss_equal(value, ss_value, key: str = "") -> bool:
    """Equal to ss's printing precision (%g: 6 significant digits; rates in whole bits per second). Where ss
    printed nothing for ``key`` of :data:`SS_OMITS`, ``value`` must be the value ss leaves out."""
    if ss_value is None and key in SS_OMITS:
        return value == SS_OMITS[key]
    if value is None or ss_value is None or isinstance(ss_value, bool | str):
        return value == ss_value
    return math.isclose(value, ss_value, rel_tol=1e-5, abs_tol=1e-6)


def between_netlink_samples(rows: list[dict], netlink_rows: list[dict], netlink_text: str) -> list[tuple]:
    """``(row, before, after)`` for each of ``rows`` (monotonic ``t_mono_s``) that netlink samples bracket:
    ``before`` the last netlink row whose answer had come back by then, ``after`` the first taken at or after it."""
    done = {i: (s.monotonic_ns + s.request_ns) / 1e9 for i, s in enumerate(sockdiag.parse_log(netlink_text).samples)}
    pairs = []
    for row in rows:
        before = [r for r in netlink_rows if done[r["sample"]] <= row["t_mono_s"]]
        after = [r for r in netlink_rows if r["t_mono_s"] >= row["t_mono_s"]]
        if before and after:
            pairs.append((row, before[-1], after[0]))
    return pairs


#: For tests that start a netlink or BPF sampler by hand (not through ``bbrlab.sampling.sampler``, which waits on
#: its stream): wait until the sampler's log ($1) says "# ready" (socket opened, resp. program loaded and
#: attached) while its process ($2) runs. Fails, printing the log, when the sampler exits first or after 60 s.
WAIT_READY_SH = RUNNING_SH + r"""
i=0
until grep -q '^# ready' "$1" 2>/dev/null; do
    running "$2" || { cat "$1"; exit 1; }
    [ $i -lt 1200 ] || { echo "not ready after 60 s"; exit 1; }
    sleep 0.05; i=$((i + 1))
done
"""
