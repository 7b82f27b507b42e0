"""The samplers' rows against what ``ss`` printed at the same time: which columns to compare, and how.

Shared by the parser's unit tests on output recorded in the guest (tests/fixtures/sockdiag) and the
testbed tests that record it.
"""

from __future__ import annotations

import math

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
