/*
 * bbrlab sockdiag sampler: TCP socket state of one flow's data connections, read through ONE
 * persistent NETLINK_SOCK_DIAG socket on a fixed schedule. It runs inside the sender, the machine
 * whose CPU is under test, so it does as little as it can per sample: no fork, no dump of the TCP
 * table once the flow's sockets are known, one sendmsg and one recvmmsg per sample.
 *
 * Usage:
 *   sockdiag_sampler -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -d DPORT -p SPORT[,SPORT...] [-f 4|6]
 *
 *   -i  sampling interval in microseconds, 100 .. 10000000
 *   -t  deadline in seconds after start, 1 .. 86400 (the sampler ends by itself then)
 *   -s  stop file: the sampler ends at the first tick at which this path exists
 *   -d  the peer's (server's) port of the data connections, 1 .. 65535
 *   -p  the local ports of the data connections (comma separated, 1 .. 64 ports)
 *   -f  their address family: 4 (IPv4, the default) or 6 (IPv6)
 *
 * Schedule: tick k is due at t0 + k * interval on CLOCK_MONOTONIC, slept for with clock_nanosleep
 * (TIMER_ABSTIME); its slot lasts one interval. At most one sample is taken per slot, inside it: a
 * slot already over when the sampler wakes or when the previous sample ends is skipped and counted
 * as missed; samples are never bunched to catch up.
 *
 * Sockets: until every listed local port has been seen, each tick dumps the established TCP
 * sockets of the family and keeps those whose local port is listed and whose peer port is DPORT;
 * that dump is also the tick's sample. Afterwards each tick asks for exactly those sockets by their
 * 4-tuple and cookie (no NLM_F_DUMP), all requests in one sendmsg, all answers in one recvmmsg.
 * A socket the kernel no longer knows (closed) is reported once and not asked for again; so is one
 * that reached TIME_WAIT or CLOSE.
 *
 * Each answer carries INET_DIAG_INFO (struct tcp_info), INET_DIAG_CONG (the CCA's name) and the
 * CCA's own info (INET_DIAG_BBRINFO for BBR; requested as INET_DIAG_VEGASINFO, as the uapi says).
 * Every attribute of the answer is written out as hex, whatever its type and length, so newer
 * kernels' longer structs and unknown attributes are kept, never fatal; bbrlab.sockdiag decodes.
 *
 * Output (stdout; the header is flushed at once, the rest when the 1 MiB buffer is full and at exit),
 * one record a line:
 *   # bbrlab-sockdiag-sampler format=1 interval_ns=N stop_after_s=N dport=N sports=A,B family=4|6 pid=N
 *     t0_ns=N                                                            (one line: the header)
 *   # ready cpu_user_us=N cpu_sys_us=N                                   started (its CPU so far)
 *   D <sport> <family 4|6> <src> <dst> <dport> <cookie hex> <tick>     a data socket discovered
 *   T <tick> <realtime_ns> <monotonic_ns> <request_ns>                 a sample: when it was asked, how long
 *                                                                        the kernel took to answer
 *   S <sport> <state> <rqueue> <wqueue> <type>:<hex> <type>:<hex> ...   one socket of that sample
 *   G <sport> <tick> <reason>                                            a socket gone (not asked again)
 *   # error <code> <message>                                             why the sampler failed
 *   # end samples=N ticks=N missed=N cpu_user_us=N cpu_sys_us=N maxrss_kb=N wall_ns=N reason=R
 * The footer is written whatever the end: reason stop_file, deadline, signal or error.
 *
 * Exit status: 0 stopped normally; 2 bad arguments (nothing started); 3 the kernel has no
 * inet_diag/tcp_diag; 4 an established BBR socket without BBR info in 3 samples in a row (once can
 * be a socket closing while the kernel answers); 5 another netlink failure; 6 output failure.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FORMAT_VERSION 1
#define MAX_PORTS 64
#define RECV_BUF 16384
#define OUT_BUF (1 << 20)
#define DUMP_BUF 65536
/* A socket that closes while the kernel fills its answer (the state is read before the CCA's info)
   can show up once as established BBR without BBR info; this many in a row is a kernel without it. */
#define BBR_INFO_MISSING_MAX 3

enum { EXIT_BAD_ARGS = 2, EXIT_NO_DIAG = 3, EXIT_NO_BBR_INFO = 4, EXIT_NETLINK = 5, EXIT_OUTPUT = 6 };

struct flow_socket {
	uint16_t sport;      /* host order */
	int found;           /* discovered */
	int gone;            /* closed, TIME_WAIT or unknown to the kernel: not asked again */
	int bbr_info_missing; /* consecutive established BBR samples without INET_DIAG_BBRINFO */
	uint8_t family;
	struct inet_diag_sockid id;
};

static struct flow_socket sockets[MAX_PORTS];
static int n_sockets;
static int n_found;
static uint16_t server_port;
static uint8_t flow_family = AF_INET;
static volatile sig_atomic_t got_signal;
static int nl_fd = -1;
static char out_buf[OUT_BUF];
static uint64_t samples, missed;
static uint64_t tick;      /* the slot of the sample being taken: due at t0 + tick * interval */
static uint64_t ticks;     /* slots begun so far (= samples + missed at the end) */
static const uint8_t EXT_BITS = (1 << (INET_DIAG_INFO - 1)) | (1 << (INET_DIAG_VEGASINFO - 1)) |
				(1 << (INET_DIAG_CONG - 1));

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
	fputs("sockdiag_sampler: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nusage: sockdiag_sampler -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -d DPORT -p SPORT[,SPORT...] "
	      "[-f 4|6]\n", stderr);
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

static void parse_ports(char *list)
{
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		if (n_sockets == MAX_PORTS)
			usage("-p (sports): more than %d ports", MAX_PORTS);
		uint16_t port = (uint16_t)parse_long(tok, "-p (sport)", 1, 65535);
		for (int i = 0; i < n_sockets; i++)
			if (sockets[i].sport == port)
				usage("-p (sports): port %u listed twice", port);
		sockets[n_sockets++].sport = port;
	}
	if (n_sockets == 0)
		usage("-p (sports): at least one local port");
}

/* ---- output ------------------------------------------------------------------------------- */

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

static void write_footer(const char *reason, uint64_t mono_start)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("# end samples=%llu ticks=%llu missed=%llu cpu_user_us=%lld cpu_sys_us=%lld maxrss_kb=%ld "
	       "wall_ns=%llu reason=%s\n",
	       (unsigned long long)samples, (unsigned long long)ticks, (unsigned long long)missed,
	       (long long)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec,
	       (long long)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec, ru.ru_maxrss,
	       (unsigned long long)(now_ns(CLOCK_MONOTONIC) - mono_start), reason);
}

static uint64_t mono_start_ns;

/* "# ready": the CPU the sampler took to start, before any sample. */
static void write_ready(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("# ready cpu_user_us=%lld cpu_sys_us=%lld\n", (long long)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec,
	       (long long)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec);
}

/* Fail loudly: the reason on stderr and in the output, then the footer, then exit. */
static void fail(int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "sockdiag_sampler: %s\n", msg);
	printf("# error %d %s\n", code, msg);
	write_footer("error", mono_start_ns);
	fflush(stdout);
	exit(code);
}

/* ---- netlink ------------------------------------------------------------------------------ */

struct request {
	struct nlmsghdr nlh;
	struct inet_diag_req_v2 req;
};

static void send_requests(struct request *reqs, int n)
{
	struct iovec iov = { reqs, sizeof(*reqs) * (size_t)n };
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	struct msghdr msg = { .msg_name = &kernel, .msg_namelen = sizeof(kernel), .msg_iov = &iov, .msg_iovlen = 1 };
	if (sendmsg(nl_fd, &msg, 0) < 0)
		fail(EXIT_NETLINK, "sendmsg on NETLINK_SOCK_DIAG: %s", strerror(errno));
}

static void no_diag(int err)
{
	fail(EXIT_NO_DIAG, "the kernel answered %s to an inet_diag request for TCP: it has no inet_diag/tcp_diag "
			   "(load them: modprobe tcp_diag)", strerror(err));
}

static struct flow_socket *by_port(uint16_t sport)
{
	for (int i = 0; i < n_sockets; i++)
		if (sockets[i].sport == sport)
			return &sockets[i];
	return NULL;
}

static const char *addr_text(uint8_t family, const __be32 *addr, char *buf, size_t len)
{
	return inet_ntop(family, addr, buf, (socklen_t)len) ? buf : "?";
}

/* One socket's answer: an S line with every attribute, and the BBR check. Returns the TCP state. */
static int write_socket(const struct inet_diag_msg *m, size_t len)
{
	const unsigned char *attrs = (const unsigned char *)(m + 1);
	size_t rest = len - NLMSG_ALIGN(sizeof(*m));
	char cca[32] = "";
	int has_bbr_info = 0;
	printf("S %u %u %u %u", ntohs(m->id.idiag_sport), m->idiag_state, m->idiag_rqueue, m->idiag_wqueue);
	while (rest >= sizeof(struct nlattr)) {
		const struct nlattr *a = (const struct nlattr *)attrs;
		if (a->nla_len < sizeof(*a) || a->nla_len > rest)
			break;
		size_t payload = a->nla_len - NLA_HDRLEN;
		int type = a->nla_type & NLA_TYPE_MASK;
		const unsigned char *data = attrs + NLA_HDRLEN;
		printf(" %d:", type);
		put_hex(data, payload);
		if (type == INET_DIAG_CONG) {
			size_t n = payload < sizeof(cca) - 1 ? payload : sizeof(cca) - 1;
			memcpy(cca, data, n);
			cca[n] = 0;
		} else if (type == INET_DIAG_BBRINFO) {
			has_bbr_info = 1;
		}
		size_t step = NLA_ALIGN(a->nla_len);
		if (step > rest)
			break;
		attrs += step;
		rest -= step;
	}
	putchar('\n');
	struct flow_socket *s = by_port(ntohs(m->id.idiag_sport));
	if (s && strncmp(cca, "bbr", 3) == 0 && m->idiag_state == 1 /* TCP_ESTABLISHED */) {
		s->bbr_info_missing = has_bbr_info ? 0 : s->bbr_info_missing + 1;
		if (s->bbr_info_missing >= BBR_INFO_MISSING_MAX)
			fail(EXIT_NO_BBR_INFO, "socket :%u runs %s but the kernel sent no INET_DIAG_BBRINFO in %d samples "
			     "in a row", s->sport, cca, s->bbr_info_missing);
	}
	return m->idiag_state;
}

/* A socket of the flow, answered in a dump: remember it the first time (a D line). */
static void discover(const struct inet_diag_msg *m)
{
	struct flow_socket *s = by_port(ntohs(m->id.idiag_sport));
	if (!s || s->found)
		return;
	char src[INET6_ADDRSTRLEN], dst[INET6_ADDRSTRLEN];
	s->found = 1;
	s->family = m->idiag_family;
	s->id = m->id;
	n_found++;
	printf("D %u %d %s %s %u %08x%08x %llu\n", s->sport, m->idiag_family == AF_INET6 ? 6 : 4,
	       addr_text(m->idiag_family, m->id.idiag_src, src, sizeof(src)),
	       addr_text(m->idiag_family, m->id.idiag_dst, dst, sizeof(dst)), ntohs(m->id.idiag_dport),
	       m->id.idiag_cookie[1], m->id.idiag_cookie[0], (unsigned long long)tick);
}

static int is_flow_socket(const struct inet_diag_msg *m)
{
	return ntohs(m->id.idiag_dport) == server_port && by_port(ntohs(m->id.idiag_sport)) != NULL;
}

/*
 * Dump the established TCP sockets of one family and copy the flow's answers into ``side``
 * (written out after the sample's T line, once the dump has ended). The first answer tells
 * whether the kernel has tcp_diag at all.
 */
static char side[DUMP_BUF];
static size_t side_len;

static void dump_family(uint8_t family, char *buf, size_t buflen)
{
	struct request r = {
		.nlh = { .nlmsg_len = sizeof(r), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			 .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP, .nlmsg_seq = family },
		.req = { .sdiag_family = family, .sdiag_protocol = IPPROTO_TCP, .idiag_ext = EXT_BITS,
			 .idiag_states = 1u << 1 /* TCP_ESTABLISHED */ },
	};
	send_requests(&r, 1);
	for (;;) {
		ssize_t n = recv(nl_fd, buf, buflen, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			fail(EXIT_NETLINK, "recv on NETLINK_SOCK_DIAG: %s", strerror(errno));
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			/* a dump reports its error in NLMSG_DONE's payload (e.g. ENOENT: inet_diag is there
			   but tcp_diag is not), a refused request in NLMSG_ERROR (no inet_diag at all) */
			int error = 0;
			if (h->nlmsg_type == NLMSG_DONE && h->nlmsg_len >= NLMSG_LENGTH(sizeof(int)))
				error = *(const int *)NLMSG_DATA(h);
			else if (h->nlmsg_type == NLMSG_ERROR)
				error = ((const struct nlmsgerr *)NLMSG_DATA(h))->error;
			if (error == -ENOENT || error == -EOPNOTSUPP || error == -EINVAL)
				no_diag(-error);
			if (error)
				fail(EXIT_NETLINK, "inet_diag dump: %s", strerror(-error));
			if (h->nlmsg_type == NLMSG_DONE)
				return;
			if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || !is_flow_socket(NLMSG_DATA(h)))
				continue;
			size_t len = NLMSG_ALIGN(h->nlmsg_len);
			if (side_len + len > sizeof(side))
				fail(EXIT_NETLINK, "inet_diag dump: more than %zu bytes of answers for the flow's ports",
				     sizeof(side));
			memcpy(side + side_len, h, h->nlmsg_len);
			side_len += len;
		}
	}
}

static void write_sample_line(uint64_t real, uint64_t mono, uint64_t done)
{
	printf("T %llu %llu %llu %llu\n", (unsigned long long)tick, (unsigned long long)real,
	       (unsigned long long)mono, (unsigned long long)(done - mono));
}

/* Discovery tick: the dump is the sample. */
static void sample_by_dump(uint64_t real, uint64_t mono)
{
	static char buf[DUMP_BUF];
	side_len = 0;
	dump_family(flow_family, buf, sizeof(buf));
	write_sample_line(real, mono, now_ns(CLOCK_MONOTONIC));
	for (size_t off = 0; off < side_len;) {
		const struct nlmsghdr *h = (const struct nlmsghdr *)(side + off);
		discover(NLMSG_DATA(h));
		write_socket(NLMSG_DATA(h), h->nlmsg_len - NLMSG_HDRLEN);
		off += NLMSG_ALIGN(h->nlmsg_len);
	}
}

static void mark_gone(struct flow_socket *s, const char *reason)
{
	s->gone = 1;
	printf("G %u %llu %s\n", s->sport, (unsigned long long)tick, reason);
}

/* Steady tick: one exact request per known, live socket, in one sendmsg; answers in one recvmmsg. */
static void sample_exact(uint64_t real, uint64_t mono)
{
	static struct request reqs[MAX_PORTS];
	static char bufs[MAX_PORTS][RECV_BUF];
	static struct iovec iovs[MAX_PORTS];
	static struct mmsghdr msgs[MAX_PORTS];
	int n = 0;
	for (int i = 0; i < n_sockets; i++) {
		struct flow_socket *s = &sockets[i];
		if (!s->found || s->gone)
			continue;
		reqs[n] = (struct request){
			.nlh = { .nlmsg_len = sizeof(struct request), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
				 .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = (uint32_t)i },
			.req = { .sdiag_family = s->family, .sdiag_protocol = IPPROTO_TCP, .idiag_ext = EXT_BITS,
				 .idiag_states = ~0u, .id = s->id },
		};
		iovs[n] = (struct iovec){ bufs[n], RECV_BUF };
		msgs[n] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &iovs[n], .msg_iovlen = 1 } };
		n++;
	}
	if (n == 0) { /* every socket of the flow has gone: the tick is still a (empty) sample */
		write_sample_line(real, mono, mono);
		return;
	}
	send_requests(reqs, n);
	int got = 0;
	while (got < n) {
		/* netlink answers synchronously inside sendmsg: everything is queued already */
		int r = recvmmsg(nl_fd, msgs + got, (unsigned)(n - got), got ? MSG_DONTWAIT : 0, NULL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			fail(EXIT_NETLINK, "recvmmsg on NETLINK_SOCK_DIAG after %d of %d answers: %s", got, n,
			     strerror(errno));
		}
		got += r;
	}
	uint64_t done = now_ns(CLOCK_MONOTONIC);
	write_sample_line(real, mono, done);
	for (int k = 0; k < n; k++) {
		const struct nlmsghdr *h = (const struct nlmsghdr *)bufs[k];
		if (msgs[k].msg_len < NLMSG_HDRLEN || !NLMSG_OK(h, msgs[k].msg_len))
			fail(EXIT_NETLINK, "short netlink answer (%u bytes)", msgs[k].msg_len);
		if (h->nlmsg_seq >= (uint32_t)n_sockets)
			fail(EXIT_NETLINK, "netlink answer with unknown sequence number %u", h->nlmsg_seq);
		struct flow_socket *s = &sockets[h->nlmsg_seq];
		if (h->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(h);
			if (e->error == -ENOENT || e->error == -ESTALE) {
				mark_gone(s, e->error == -ENOENT ? "ENOENT" : "ESTALE");
				continue;
			}
			if (e->error == -EOPNOTSUPP || e->error == -EINVAL)
				no_diag(-e->error);
			fail(EXIT_NETLINK, "inet_diag request for :%u: %s", s->sport, strerror(-e->error));
		}
		if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
			fail(EXIT_NETLINK, "unexpected netlink message type %u", h->nlmsg_type);
		int state = write_socket(NLMSG_DATA(h), h->nlmsg_len - NLMSG_HDRLEN);
		if (state == 7 /* TCP_CLOSE */ || state == 6 /* TCP_TIME_WAIT */)
			mark_gone(s, state == 7 ? "CLOSE" : "TIME_WAIT");
	}
}

/* One sample, stamped with the realtime and monotonic clocks just before the kernel is asked. */
static void take_sample(uint64_t real, uint64_t mono)
{
	if (n_found < n_sockets)
		sample_by_dump(real, mono);
	else
		sample_exact(real, mono);
	samples++;
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
	long interval_us = -1, stop_after_s = -1, dport = -1;
	const char *stop_file = NULL;
	char *ports_arg = NULL;
	int opt;
	opterr = 0;
	while ((opt = getopt(argc, argv, "i:t:s:d:p:f:")) != -1) {
		switch (opt) {
		case 'i': interval_us = parse_long(optarg, "-i (interval_us)", 100, 10000000); break;
		case 't': stop_after_s = parse_long(optarg, "-t (stop_after_s)", 1, 86400); break;
		case 's': stop_file = optarg; break;
		case 'd': dport = parse_long(optarg, "-d (dport)", 1, 65535); break;
		case 'p': ports_arg = optarg; break;
		case 'f':
			if (strcmp(optarg, "4") && strcmp(optarg, "6"))
				usage("-f (family) = '%s' is not allowed: 4 or 6", optarg);
			flow_family = optarg[0] == '6' ? AF_INET6 : AF_INET;
			break;
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
	parse_ports(ports_copy);
	server_port = (uint16_t)dport;

	setvbuf(stdout, out_buf, _IOFBF, sizeof(out_buf));
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);

	const uint64_t interval_ns = (uint64_t)interval_us * 1000;
	const uint64_t t0 = mono_start_ns = now_ns(CLOCK_MONOTONIC);
	const uint64_t deadline = t0 + (uint64_t)stop_after_s * 1000000000ull;
	printf("# bbrlab-sockdiag-sampler format=%d interval_ns=%llu stop_after_s=%ld dport=%ld sports=%s family=%d "
	       "pid=%d t0_ns=%llu\n", FORMAT_VERSION, (unsigned long long)interval_ns, stop_after_s, dport, ports_arg,
	       flow_family == AF_INET6 ? 6 : 4, (int)getpid(), (unsigned long long)t0);

	nl_fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl_fd < 0)
		fail(EXIT_NO_DIAG, "socket(AF_NETLINK, NETLINK_SOCK_DIAG): %s", strerror(errno));
	write_ready();
	fflush(stdout); /* the header shows that the sampler runs; the rest waits for a full buffer */

	/*
	 * Slot k is [t0 + k * interval, t0 + (k + 1) * interval). At most one sample per slot, taken in
	 * its own slot: a slot that has passed when the sampler wakes (late wake-up) or when the previous
	 * sample ends (a sample longer than the rest of its slot) is skipped and counted as missed.
	 */
	const char *reason = "deadline";
	for (;;) {
		if (got_signal) {
			reason = "signal";
			break;
		}
		if (access(stop_file, F_OK) == 0) {
			reason = "stop_file";
			break;
		}
		uint64_t real = now_ns(CLOCK_REALTIME);
		uint64_t now = now_ns(CLOCK_MONOTONIC);
		if (now >= deadline)
			break;
		tick = (now - t0) / interval_ns;
		if (tick > ticks)
			missed += tick - ticks;
		take_sample(real, now);
		now = now_ns(CLOCK_MONOTONIC);
		uint64_t current = (now - t0) / interval_ns;
		missed += current - tick;
		ticks = current + 1;
		uint64_t next = t0 + ticks * interval_ns;
		if (next > deadline)
			next = deadline;
		struct timespec due = { (time_t)(next / 1000000000ull), (long)(next % 1000000000ull) };
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR && !got_signal)
			;
	}
	write_footer(reason, mono_start_ns);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "sockdiag_sampler: writing the output failed: %s\n", strerror(errno));
		return EXIT_OUTPUT;
	}
	return 0;
}
