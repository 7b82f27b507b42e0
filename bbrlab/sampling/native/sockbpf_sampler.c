/*
 * bbrlab in-kernel socket sampler, the loader. Loads sockbpf_sampler.bpf.c (embedded, CO-RE) on the
 * tcp_probe tracepoint, tells it which sockets to sample and how often, and writes what it recorded.
 * The BPF program samples each of the flow's data sockets at most once per slot, when an ACK for it
 * is processed; this loader only wakes every BATCH_MS to drain the ring buffer (the program never
 * wakes it), so the sender pays no context switch per sample.
 *
 * Usage:
 *   sockbpf_sampler -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -d DPORT -p SPORT[,SPORT...] [-b BATCH_MS]
 *
 *   -i  sampling interval in microseconds, 100 .. 10000000 (slot k is [t0 + k * i, t0 + (k + 1) * i))
 *   -t  deadline in seconds after start, 1 .. 86400
 *   -s  stop file: the sampler ends at the first drain at which this path exists
 *   -d  the peer's (server's) port of the data connections, 1 .. 65535
 *   -p  the local ports of the data connections (comma separated, 1 .. 64 ports)
 *   -b  how often to drain the ring buffer, in ms, 10 .. 10000 (default 250)
 *
 * Output (stdout; header flushed at once, the rest buffered), one record a line:
 *   # bbrlab-sockbpf-sampler format=1 interval_ns=N stop_after_s=N dport=N sports=A,B batch_ms=N
 *     record_size=N t0_ns=N realtime_minus_monotonic_ns=N pid=N                  (one line: the header)
 *   # ready cpu_user_us=N cpu_sys_us=N                                            loaded and attached
 *   R <sport> <slot> <monotonic_ns> <hex of struct sockbpf_record>               one sample of one socket
 *   # error <code> <message>                                                      why it failed
 *   # end records=N dropped=N drains=N prog_runs=N prog_run_ns=N cpu_user_us=N cpu_sys_us=N maxrss_kb=N
 *     wall_ns=N realtime_minus_monotonic_ns=N reason=R                            (one line: the footer)
 * prog_runs / prog_run_ns: how often the BPF program ran (every segment of every established socket)
 * and the kernel CPU time it took in all (BPF_STATS_RUN_TIME; -1 when the kernel refused statistics).
 * The realtime of a record is its monotonic time plus realtime_minus_monotonic_ns.
 *
 * Exit status: 0 stopped normally; 2 bad arguments; 3 the kernel cannot run the program (no BTF, no
 * tcp_probe, no BPF); 5 another failure; 6 output failure.
 */
#define _GNU_SOURCE
#include <linux/types.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#define SAMPLER_NAME "sockbpf_sampler"
#define SAMPLER_USAGE SAMPLER_NAME " -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -d DPORT -p SPORT[,SPORT...] " \
	"[-b BATCH_MS]"
#include "sampler_common.h"
#include "sockbpf_record.h"
#include "sockbpf.skel.h"

#define FORMAT_VERSION 1

enum { EXIT_NO_BPF = 3, EXIT_OTHER = 5 };

static uint64_t records, drains;
static struct sockbpf *skel;

static long long prog_runs = -1, prog_run_ns = -1;

static void read_prog_stats(void)
{
	struct bpf_prog_info info;
	__u32 len = sizeof(info);
	memset(&info, 0, sizeof(info));
	if (skel && bpf_obj_get_info_by_fd(bpf_program__fd(skel->progs.sample_on_segment), &info, &len) == 0) {
		prog_runs = (long long)info.run_cnt;
		prog_run_ns = (long long)info.run_time_ns;
	}
}

static void write_footer(const char *reason)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	read_prog_stats();
	unsigned long long dropped = skel && skel->bss ? skel->bss->dropped : 0;
	printf("# end records=%llu dropped=%llu drains=%llu prog_runs=%lld prog_run_ns=%lld cpu_user_us=%lld "
	       "cpu_sys_us=%lld maxrss_kb=%ld wall_ns=%llu realtime_minus_monotonic_ns=%lld reason=%s\n",
	       (unsigned long long)records, dropped, (unsigned long long)drains, prog_runs, prog_run_ns,
	       cpu_us(&ru.ru_utime), cpu_us(&ru.ru_stime), ru.ru_maxrss,
	       (unsigned long long)(now_ns(CLOCK_MONOTONIC) - mono_start_ns),
	       (long long)(now_ns(CLOCK_REALTIME) - now_ns(CLOCK_MONOTONIC)), reason);
}

/* libbpf's own messages: warnings and errors to stderr (they explain a failed load). */
static int libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, fmt, ap);
}

static int on_record(void *ctx, void *data, size_t size)
{
	(void)ctx;
	const struct sockbpf_record *r = data;
	if (size < sizeof(*r))
		return 0;
	printf("R %u %llu %llu ", r->sport, (unsigned long long)r->slot, (unsigned long long)r->mono_ns);
	put_hex(data, sizeof(*r));
	putchar('\n');
	records++;
	return 0;
}

int main(int argc, char **argv)
{
	struct common_args a = COMMON_ARGS_UNSET;
	long batch_ms = 250;
	uint16_t ports[MAX_PORTS];
	int opt;
	opterr = 0;
	while ((opt = getopt(argc, argv, COMMON_OPTIONS "b:")) != -1) {
		if (common_option(opt, &a))
			continue;
		switch (opt) {
		case 'b': batch_ms = parse_long(optarg, "-b (batch_ms)", 10, 10000); break;
		default: usage("unknown option or missing value: -%c", optopt);
		}
	}
	check_common_args(argc, argv, &a);
	int n_ports = parse_ports(strdup(a.ports_arg), ports);

	buffer_output_and_catch_signals();
	libbpf_set_print(libbpf_print);

	const uint64_t interval_ns = (uint64_t)a.interval_us * 1000;
	const uint64_t t0 = mono_start_ns = now_ns(CLOCK_MONOTONIC);
	const uint64_t deadline = t0 + (uint64_t)a.stop_after_s * 1000000000ull;
	printf("# bbrlab-sockbpf-sampler format=%d interval_ns=%llu stop_after_s=%ld dport=%ld sports=%s batch_ms=%ld "
	       "record_size=%zu t0_ns=%llu realtime_minus_monotonic_ns=%lld pid=%d\n", FORMAT_VERSION,
	       (unsigned long long)interval_ns, a.stop_after_s, a.dport, a.ports_arg, batch_ms, sizeof(struct sockbpf_record),
	       (unsigned long long)t0, (long long)(now_ns(CLOCK_REALTIME) - now_ns(CLOCK_MONOTONIC)), (int)getpid());
	fflush(stdout);

	int stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME); /* kept open: statistics stay on while it is */
	skel = sockbpf__open();
	if (!skel)
		fail(EXIT_NO_BPF, "opening the BPF program failed: %s", strerror(errno));
	skel->rodata->interval_ns = interval_ns;
	skel->rodata->t0_ns = t0;
	skel->rodata->server_port = (uint16_t)a.dport;
	int err = sockbpf__load(skel);
	if (err == -EPERM)
		fail(EXIT_NO_BPF, "loading the BPF program failed (%s): it needs root (CAP_BPF and CAP_PERFMON, or "
		     "CAP_SYS_ADMIN)", strerror(-err));
	if (err)
		fail(EXIT_NO_BPF, "loading the BPF program failed (%s): the kernel needs BPF, BTF "
		     "(/sys/kernel/btf/vmlinux) and the tcp_probe tracepoint", strerror(-err));
	for (int i = 0; i < n_ports; i++) {
		struct { __u64 next_due_ns; } start = { 0 };
		if (bpf_map_update_elem(bpf_map__fd(skel->maps.watched), &ports[i], &start, BPF_ANY))
			fail(EXIT_OTHER, "watching port %u: %s", ports[i], strerror(errno));
	}
	err = sockbpf__attach(skel);
	if (err)
		fail(EXIT_NO_BPF, "attaching to tp_btf/tcp_probe failed: %s", strerror(-err));
	struct ring_buffer *rb = ring_buffer__new(bpf_map__fd(skel->maps.records), on_record, NULL, NULL);
	if (!rb)
		fail(EXIT_OTHER, "opening the ring buffer failed: %s", strerror(errno));
	write_ready();

	const char *reason = "deadline";
	const uint64_t batch_ns = (uint64_t)batch_ms * 1000000ull;
	uint64_t next = t0;
	for (;;) {
		if (ring_buffer__consume(rb) < 0)
			fail(EXIT_OTHER, "reading the ring buffer failed: %s", strerror(errno));
		drains++;
		const char *stop = stop_reason(a.stop_file);
		if (stop) {
			reason = stop;
			break;
		}
		uint64_t now = now_ns(CLOCK_MONOTONIC);
		if (now >= deadline)
			break;
		while (next <= now)
			next += batch_ns;
		if (next > deadline)
			next = deadline;
		sleep_until(next);
	}
	sockbpf__detach(skel);
	ring_buffer__consume(rb);
	write_footer(reason);
	ring_buffer__free(rb);
	sockbpf__destroy(skel);
	if (stats_fd >= 0)
		close(stats_fd);
	return finish_output();
}
