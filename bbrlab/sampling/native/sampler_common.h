/*
 * What bbrlab's two socket samplers share (sockdiag_sampler.c, the netlink one, and sockbpf_sampler.c, the
 * loader of the BPF one): the options they both take and their checks, the stop signal, the clocks, the
 * absolute-time sleep, hex output, the "# ready" line, failing loudly and the final flush. Static functions,
 * for one program each: every function here is used by both.
 *
 * A program defines, before including this file:
 *   SAMPLER_NAME   its name as messages start with it, e.g. "sockdiag_sampler"
 *   SAMPLER_USAGE  its usage line (what follows "usage: "), e.g. SAMPLER_NAME " -i INTERVAL_US ..."
 * and defines after it
 *   static void write_footer(const char *reason);   its "# end" line, which fail() writes too.
 *
 * Exit status shared by both: 2 bad arguments (nothing started), 6 output failure; 3 to 5 are each program's.
 */
#ifndef BBRLAB_SAMPLER_COMMON_H
#define BBRLAB_SAMPLER_COMMON_H

#if !defined(SAMPLER_NAME) || !defined(SAMPLER_USAGE)
#error "define SAMPLER_NAME and SAMPLER_USAGE before including sampler_common.h"
#endif

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 64
#define OUT_BUF (1 << 20)

enum { EXIT_BAD_ARGS = 2, EXIT_OUTPUT = 6 };

static volatile sig_atomic_t got_signal;
static uint64_t mono_start_ns; /* CLOCK_MONOTONIC at start: the schedule's t0 and the footer's wall_ns */
static char out_buf[OUT_BUF];

static void write_footer(const char *reason);

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

/* stdout fully buffered in out_buf; SIGTERM, SIGINT and SIGHUP end the sampler at its next check. */
static void buffer_output_and_catch_signals(void)
{
	setvbuf(stdout, out_buf, _IOFBF, sizeof(out_buf));
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

static void usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs(SAMPLER_NAME ": ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nusage: " SAMPLER_USAGE "\n", stderr);
	exit(EXIT_BAD_ARGS);
}

/* A decimal integer in [lo, hi], the whole string; else a usage error naming the option. */
static long parse_long(const char *text, const char *name, long lo, long hi)
{
	char *end;
	errno = 0;
	long v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < lo || v > hi)
		usage("%s = '%s' is not allowed: an integer from %ld to %ld", name, text, lo, hi);
	return v;
}

/* The comma separated local ports of -p into ports (MAX_PORTS at most, none twice); returns how many. */
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

/* The options both samplers take (getopt letters COMMON_OPTIONS); -1 / NULL: not given. */
struct common_args {
	long interval_us;
	long stop_after_s;
	long dport;
	const char *stop_file;
	char *ports_arg;
};

#define COMMON_OPTIONS "i:t:s:d:p:"
#define COMMON_ARGS_UNSET { .interval_us = -1, .stop_after_s = -1, .dport = -1, .stop_file = NULL, .ports_arg = NULL }

/* One getopt result: 1 when it is a common option (stored in a), 0 when the program must handle it. */
static int common_option(int opt, struct common_args *a)
{
	switch (opt) {
	case 'i': a->interval_us = parse_long(optarg, "-i (interval_us)", 100, 10000000); return 1;
	case 't': a->stop_after_s = parse_long(optarg, "-t (stop_after_s)", 1, 86400); return 1;
	case 's': a->stop_file = optarg; return 1;
	case 'd': a->dport = parse_long(optarg, "-d (dport)", 1, 65535); return 1;
	case 'p': a->ports_arg = optarg; return 1;
	default: return 0;
	}
}

/* After getopt: no operands, every common option given, an absolute stop file. */
static void check_common_args(int argc, char **argv, const struct common_args *a)
{
	if (optind != argc)
		usage("unexpected argument '%s'", argv[optind]);
	if (a->interval_us < 0 || a->stop_after_s < 0 || a->dport < 0 || !a->stop_file || !a->ports_arg)
		usage("-i, -t, -s, -d and -p are all required");
	if (a->stop_file[0] != '/')
		usage("-s (stop_file) = '%s' is not allowed: an absolute path", a->stop_file);
}

/* Why the sampler should end now: "signal", "stop_file" (the stop file exists), or NULL to go on. */
static const char *stop_reason(const char *stop_file)
{
	if (got_signal)
		return "signal";
	if (access(stop_file, F_OK) == 0)
		return "stop_file";
	return NULL;
}

/* Sleep until CLOCK_MONOTONIC reaches due_ns (absolute: no drift); a signal that asks to stop cuts it short. */
static void sleep_until(uint64_t due_ns)
{
	struct timespec due = { (time_t)(due_ns / 1000000000ull), (long)(due_ns % 1000000000ull) };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR && !got_signal)
		;
}

static long long cpu_us(const struct timeval *tv)
{
	return (long long)tv->tv_sec * 1000000 + tv->tv_usec;
}

static const char HEX[] = "0123456789abcdef";

static void put_hex(const unsigned char *p, size_t n)
{
	char chunk[512];
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		chunk[k++] = HEX[p[i] >> 4];
		chunk[k++] = HEX[p[i] & 15];
		if (k == sizeof(chunk)) {
			fwrite(chunk, 1, k, stdout);
			k = 0;
		}
	}
	fwrite(chunk, 1, k, stdout);
}

/* "# ready": the CPU the sampler took to start, before any sample; flushed at once (the run waits for it). */
static void write_ready(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("# ready cpu_user_us=%lld cpu_sys_us=%lld\n", cpu_us(&ru.ru_utime), cpu_us(&ru.ru_stime));
	fflush(stdout);
}

/* Fail loudly: the reason on stderr and in the output, then the footer, then exit. */
static void fail(int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, SAMPLER_NAME ": %s\n", msg);
	printf("# error %d %s\n", code, msg);
	write_footer("error");
	fflush(stdout);
	exit(code);
}

/* The last flush: 0, or EXIT_OUTPUT when the output could not be written. */
static int finish_output(void)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, SAMPLER_NAME ": writing the output failed: %s\n", strerror(errno));
		return EXIT_OUTPUT;
	}
	return 0;
}

#endif
