/*
 * One record of bbrlab's in-kernel (BPF) socket sampler: what the BPF program reads from a TCP socket
 * when an ACK arrives in a new sampling slot. Shared by sockbpf_sampler.bpf.c (writes it into a ring
 * buffer) and sockbpf_sampler.c (prints it as hex); bbrlab/sampling/sockdiag/bpf.py decodes it (little-endian,
 * this exact layout, 296 bytes; the sampler's header states record_size so a mismatch is caught).
 *
 * The fields are the ones tcp_get_info() and the congestion control's get_info() report, read raw:
 * srtt_us is 8 x the smoothed RTT, mdev_us 4 x its variation, rtt_min the windowed minimum (us),
 * rate_delivered / rate_interval_us the last delivery-rate sample (packets / us), ca_priv the
 * congestion control's private area (struct bbr for BBR) as bytes.
 */
#ifndef SOCKBPF_RECORD_H
#define SOCKBPF_RECORD_H

#define SOCKBPF_CA_PRIV_MAX 128
#define SOCKBPF_CA_NAME_MAX 16

struct sockbpf_record {
	__u64 mono_ns;          /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u64 slot;             /* (mono_ns - t0) / interval */
	__u64 bytes_sent;
	__u64 bytes_acked;
	__u64 bytes_retrans;
	__u64 pacing_rate;      /* bytes/s, ~0 = unlimited */
	__u64 max_pacing_rate;
	__u32 snd_cwnd;
	__u32 snd_ssthresh;
	__u32 mss_cache;
	__u32 srtt_us;          /* << 3 */
	__u32 mdev_us;          /* << 2 */
	__u32 min_rtt_us;       /* rtt_min.s[0].v */
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
	__u16 sport;            /* host order */
	__u16 dport;            /* host order */
	__u8 state;             /* TCP state (1 = established) */
	__u8 app_limited;       /* rate_app_limited */
	__u8 ca_priv_len;       /* bytes of ca_priv the kernel has (ICSK_CA_PRIV_SIZE), at most 128 */
	__u8 pad;
	char ca_name[SOCKBPF_CA_NAME_MAX];
	__u8 ca_priv[SOCKBPF_CA_PRIV_MAX];
};

#endif
