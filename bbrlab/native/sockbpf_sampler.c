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
#include <errno.h>
#include <linux/types.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "sockbpf_record.h"
#include "sockbpf.skel.h"

#define FORMAT_VERSION 1
#define MAX_PORTS 64
#define OUT_BUF (1 << 20)

enum { EXIT_BAD_ARGS = 2, EXIT_NO_BPF = 3, EXIT_OTHER = 5, EXIT_OUTPUT = 6 };

static volatile sig_atomic_t got_signal;
static char out_buf[OUT_BUF];
static uint64_t records, drains, mono_start_ns;
static struct sockbpf *skel;

static uint64_t now_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_signal(int sig)
{
	got_signal = sig;
}

static void usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("sockbpf_sampler: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nusage: sockbpf_sampler -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -d DPORT -p SPORT[,SPORT...] "
	      "[-b BATCH_MS]\n", stderr);
	exit(EXIT_BAD_ARGS);
}

static long parse_long(const char *text, const char *name, long lo, long hi)
{
	char *end;
	errno = 0;
	long v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < lo || v > hi)
		usage("%s = '%s' is not allowed: an integer from %ld to %ld", name, text, lo, hi);
	return v;
}

static int parse_ports(char *list, uint16_t *ports)
{
	int n = 0;
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		if (n == MAX_PORTS)
			usage("-p (sports): more than %d ports", MAX_PORTS);
		uint16_t port = (uint16_t)parse_long(tok, "-p (sport)", 1, 65535);
		for (int i = 0; i < n; i++)
			if (ports[i] == port)
				usage("-p (sports): port %u listed twice", port);
		ports[n++] = port;
	}
	if (n == 0)
		usage("-p (sports): at least one local port");
	return n;
}

static void put_hex(const unsigned char *p, size_t n)
{
	static const char HEX[] = "0123456789abcdef";
	char chunk[2 * sizeof(struct sockbpf_record)];
	size_t k = 0;
	for (size_t i = 0; i < n && k + 2 <= sizeof(chunk); i++) {
		chunk[k++] = HEX[p[i] >> 4];
		chunk[k++] = HEX[p[i] & 15];
	}
	fwrite(chunk, 1, k, stdout);
}

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

/* "# ready": the CPU the sampler took to start (loading the program), before any sample. */
static void write_ready(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("# ready cpu_user_us=%lld cpu_sys_us=%lld\n", (long long)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec,
	       (long long)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec);
	fflush(stdout);
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
	       (long long)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec,
	       (long long)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec, ru.ru_maxrss,
	       (unsigned long long)(now_ns(CLOCK_MONOTONIC) - mono_start_ns),
	       (long long)(now_ns(CLOCK_REALTIME) - now_ns(CLOCK_MONOTONIC)), reason);
}

static void fail(int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "sockbpf_sampler: %s\n", msg);
	printf("# error %d %s\n", code, msg);
	write_footer("error");
	fflush(stdout);
	exit(code);
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
	long interval_us = -1, stop_after_s = -1, dport = -1, batch_ms = 250;
	const char *stop_file = NULL;
	char *ports_arg = NULL;
	uint16_t ports[MAX_PORTS];
	int opt;
	opterr = 0;
	while ((opt = getopt(argc, argv, "i:t:s:d:p:b:")) != -1) {
		switch (opt) {
		case 'i': interval_us = parse_long(optarg, "-i (interval_us)", 100, 10000000); break;
		case 't': stop_after_s = parse_long(optarg, "-t (stop_after_s)", 1, 86400); break;
		case 's': stop_file = optarg; break;
		case 'd': dport = parse_long(optarg, "-d (dport)", 1, 65535); break;
		case 'p': ports_arg = optarg; break;
		case 'b': batch_ms = parse_long(optarg, "-b (batch_ms)", 10, 10000); break;
		default: usage("unknown option or missing value: -%c", optopt);
		}
	}
	if (optind != argc)
		usage("unexpected argument '%s'", argv[optind]);
	if (interval_us < 0 || stop_after_s < 0 || dport < 0 || !stop_file || !ports_arg)
		usage("-i, -t, -s, -d and -p are all required");
	if (stop_file[0] != '/')
		usage("-s (stop_file) = '%s' is not allowed: an absolute path", stop_file);
	char *ports_copy = strdup(ports_arg);
	int n_ports = parse_ports(ports_copy, ports);

	setvbuf(stdout, out_buf, _IOFBF, sizeof(out_buf));
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	libbpf_set_print(libbpf_print);

	const uint64_t interval_ns = (uint64_t)interval_us * 1000;
	const uint64_t t0 = mono_start_ns = now_ns(CLOCK_MONOTONIC);
	const uint64_t deadline = t0 + (uint64_t)stop_after_s * 1000000000ull;
	printf("# bbrlab-sockbpf-sampler format=%d interval_ns=%llu stop_after_s=%ld dport=%ld sports=%s batch_ms=%ld "
	       "record_size=%zu t0_ns=%llu realtime_minus_monotonic_ns=%lld pid=%d\n", FORMAT_VERSION,
	       (unsigned long long)interval_ns, stop_after_s, dport, ports_arg, batch_ms, sizeof(struct sockbpf_record),
	       (unsigned long long)t0, (long long)(now_ns(CLOCK_REALTIME) - now_ns(CLOCK_MONOTONIC)), (int)getpid());
	fflush(stdout);

	int stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME); /* kept open: statistics stay on while it is */
	skel = sockbpf__open();
	if (!skel)
		fail(EXIT_NO_BPF, "opening the BPF program failed: %s", strerror(errno));
	skel->rodata->interval_ns = interval_ns;
	skel->rodata->t0_ns = t0;
	skel->rodata->server_port = (uint16_t)dport;
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
		if (got_signal) {
			reason = "signal";
			break;
		}
		if (access(stop_file, F_OK) == 0) {
			reason = "stop_file";
			break;
		}
		uint64_t now = now_ns(CLOCK_MONOTONIC);
		if (now >= deadline)
			break;
		while (next <= now)
			next += batch_ns;
		if (next > deadline)
			next = deadline;
		struct timespec due = { (time_t)(next / 1000000000ull), (long)(next % 1000000000ull) };
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR && !got_signal)
			;
	}
	sockbpf__detach(skel);
	ring_buffer__consume(rb);
	write_footer(reason);
	ring_buffer__free(rb);
	sockbpf__destroy(skel);
	if (stats_fd >= 0)
		close(stats_fd);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "sockbpf_sampler: writing the output failed: %s\n", strerror(errno));
		return EXIT_OUTPUT;
	}
	return 0;
}
