// SPDX-License-Identifier: (MIT OR GPL-2.0)
/*
 * bbrlab in-kernel socket sampler (BPF, CO-RE). Runs on the tcp_probe tracepoint, which the kernel
 * hits for every segment an established TCP socket receives (for a sender: every ACK). For the
 * flow's data sockets only (local port in the `watched` map, peer port = server_port) and at most
 * once per sampling slot [t0 + k * interval, t0 + (k + 1) * interval) per socket, it copies the
 * socket's state into a ring buffer without waking anyone; the loader (sockbpf_sampler.c) drains
 * the buffer a few times a second. So a sample costs the sender no context switch, no system call
 * and no process wake-up: only this program, in the context that processes the ACK anyway.
 *
 * Only the kernel fields read are declared below, with preserve_access_index: libbpf relocates each
 * access by name against the running kernel's BTF (no vmlinux.h, no kernel headers).
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#include "sockbpf_record.h"

struct sock_common {
	volatile unsigned char skc_state;
	__be16 skc_dport;
	__u16 skc_num;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	unsigned long sk_pacing_rate;
	unsigned long sk_max_pacing_rate;
} __attribute__((preserve_access_index));

struct sk_buff;

struct tcp_congestion_ops {
	char name[16];
} __attribute__((preserve_access_index));

struct inet_connection_sock {
	const struct tcp_congestion_ops *icsk_ca_ops;
	__u64 icsk_ca_priv[13];
} __attribute__((preserve_access_index));

struct minmax_sample {
	__u32 t;
	__u32 v;
} __attribute__((preserve_access_index));

struct minmax {
	struct minmax_sample s[3];
} __attribute__((preserve_access_index));

struct tcp_sock {
	__u32 snd_cwnd;
	__u32 snd_ssthresh;
	__u32 mss_cache;
	__u32 srtt_us;
	__u32 mdev_us;
	struct minmax rtt_min;
	__u32 packets_out;
	__u32 sacked_out;
	__u32 lost_out;
	__u32 retrans_out;
	__u32 total_retrans;
	__u32 delivered;
	__u32 rate_delivered;
	__u32 rate_interval_us;
	__u32 segs_out;
	__u32 data_segs_out;
	__u32 write_seq;
	__u32 snd_nxt;
	__u32 snd_una;
	__u32 snd_wnd;
	__u32 rcv_nxt;
	__u32 copied_seq;
	__u64 bytes_sent;
	__u64 bytes_acked;
	__u64 bytes_retrans;
	__u8 rate_app_limited : 1;
} __attribute__((preserve_access_index));

/* Set by the loader before the program is loaded. */
const volatile __u64 interval_ns = 10000000;
const volatile __u64 t0_ns = 0;
const volatile __u16 server_port = 5201;

/* Records the ring buffer had no room for. */
__u64 dropped = 0;

struct watch {
	__u64 next_due_ns; /* the start of the next slot this socket may be sampled in */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u16); /* local port, host order */
	__type(value, struct watch);
} watched SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} records SEC(".maps");

SEC("tp_btf/tcp_probe")
int BPF_PROG(sample_on_segment, struct sock *sk, struct sk_buff *skb)
{
	__u16 sport = BPF_CORE_READ(sk, __sk_common.skc_num);
	struct watch *w = bpf_map_lookup_elem(&watched, &sport);
	if (!w)
		return 0;
	if (bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport)) != server_port)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now < w->next_due_ns || now < t0_ns)
		return 0;
	__u64 slot = (now - t0_ns) / interval_ns;
	w->next_due_ns = t0_ns + (slot + 1) * interval_ns;

	struct sockbpf_record *r = bpf_ringbuf_reserve(&records, sizeof(*r), 0);
	if (!r) {
		__sync_fetch_and_add(&dropped, 1);
		return 0;
	}
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct inet_connection_sock *icsk = (struct inet_connection_sock *)sk;
	r->mono_ns = now;
	r->slot = slot;
	r->bytes_sent = BPF_CORE_READ(tp, bytes_sent);
	r->bytes_acked = BPF_CORE_READ(tp, bytes_acked);
	r->bytes_retrans = BPF_CORE_READ(tp, bytes_retrans);
	r->pacing_rate = BPF_CORE_READ(sk, sk_pacing_rate);
	r->max_pacing_rate = BPF_CORE_READ(sk, sk_max_pacing_rate);
	r->snd_cwnd = BPF_CORE_READ(tp, snd_cwnd);
	r->snd_ssthresh = BPF_CORE_READ(tp, snd_ssthresh);
	r->mss_cache = BPF_CORE_READ(tp, mss_cache);
	r->srtt_us = BPF_CORE_READ(tp, srtt_us);
	r->mdev_us = BPF_CORE_READ(tp, mdev_us);
	r->min_rtt_us = BPF_CORE_READ(tp, rtt_min.s[0].v);
	r->packets_out = BPF_CORE_READ(tp, packets_out);
	r->sacked_out = BPF_CORE_READ(tp, sacked_out);
	r->lost_out = BPF_CORE_READ(tp, lost_out);
	r->retrans_out = BPF_CORE_READ(tp, retrans_out);
	r->total_retrans = BPF_CORE_READ(tp, total_retrans);
	r->delivered = BPF_CORE_READ(tp, delivered);
	r->rate_delivered = BPF_CORE_READ(tp, rate_delivered);
	r->rate_interval_us = BPF_CORE_READ(tp, rate_interval_us);
	r->segs_out = BPF_CORE_READ(tp, segs_out);
	r->data_segs_out = BPF_CORE_READ(tp, data_segs_out);
	r->write_seq = BPF_CORE_READ(tp, write_seq);
	r->snd_nxt = BPF_CORE_READ(tp, snd_nxt);
	r->snd_una = BPF_CORE_READ(tp, snd_una);
	r->snd_wnd = BPF_CORE_READ(tp, snd_wnd);
	r->rcv_nxt = BPF_CORE_READ(tp, rcv_nxt);
	r->copied_seq = BPF_CORE_READ(tp, copied_seq);
	r->sport = sport;
	r->dport = server_port;
	r->state = BPF_CORE_READ(sk, __sk_common.skc_state);
	r->app_limited = BPF_CORE_READ_BITFIELD_PROBED(tp, rate_app_limited);
	r->pad = 0;
	const struct tcp_congestion_ops *ops = BPF_CORE_READ(icsk, icsk_ca_ops);
	if (bpf_core_read_str(r->ca_name, sizeof(r->ca_name), &ops->name) < 0)
		r->ca_name[0] = 0;
	__u32 priv = bpf_core_field_size(icsk->icsk_ca_priv);
	if (priv > SOCKBPF_CA_PRIV_MAX)
		priv = SOCKBPF_CA_PRIV_MAX;
	r->ca_priv_len = priv;
	if (bpf_core_read(r->ca_priv, priv, &icsk->icsk_ca_priv))
		r->ca_priv_len = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
