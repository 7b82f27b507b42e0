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
 * kernels' longer structs and unknown attributes are kept, never fatal; bbrlab.sampling.sockdiag decodes.
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
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define SAMPLER_NAME "sockdiag_sampler"
#define SAMPLER_USAGE SAMPLER_NAME " -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -d DPORT -p SPORT[,SPORT...] [-f 4|6]"
#include "sampler_common.h"
#include "sampler_schedule.h"

#define FORMAT_VERSION 1
#define RECV_BUF 16384
#define DUMP_BUF 65536
/* A socket that closes while the kernel fills its answer (the state is read before the CCA's info)
   can show up once as established BBR without BBR info; this many in a row is a kernel without it. */
#define BBR_INFO_MISSING_MAX 3

enum { EXIT_NO_DIAG = 3, EXIT_NO_BBR_INFO = 4, EXIT_NETLINK = 5 };

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
static int nl_fd = -1;
static const uint8_t EXT_BITS = (1 << (INET_DIAG_INFO - 1)) | (1 << (INET_DIAG_VEGASINFO - 1)) |
				(1 << (INET_DIAG_CONG - 1));

/* ---- output ------------------------------------------------------------------------------- */

static void write_footer(const char *reason)
{
	write_schedule_footer(reason);
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
	struct common_args a = COMMON_ARGS_UNSET;
	int opt;
	opterr = 0;
	while ((opt = getopt(argc, argv, COMMON_OPTIONS "f:")) != -1) {
		if (common_option(opt, &a))
			continue;
		switch (opt) {
		case 'f':
			if (strcmp(optarg, "4") && strcmp(optarg, "6"))
				usage("-f (family) = '%s' is not allowed: 4 or 6", optarg);
			flow_family = optarg[0] == '6' ? AF_INET6 : AF_INET;
			break;
		default: usage("unknown option or missing value: -%c", optopt);
		}
	}
	check_common_args(argc, argv, &a);
	uint16_t ports[MAX_PORTS];
	n_sockets = parse_ports(strdup(a.ports_arg), ports);
	for (int i = 0; i < n_sockets; i++)
		sockets[i].sport = ports[i];
	server_port = (uint16_t)a.dport;

	buffer_output_and_catch_signals();

	const uint64_t interval_ns = (uint64_t)a.interval_us * 1000;
	const uint64_t t0 = mono_start_ns = now_ns(CLOCK_MONOTONIC);
	const uint64_t deadline = t0 + (uint64_t)a.stop_after_s * 1000000000ull;
	printf("# bbrlab-sockdiag-sampler format=%d interval_ns=%llu stop_after_s=%ld dport=%ld sports=%s family=%d "
	       "pid=%d t0_ns=%llu\n", FORMAT_VERSION, (unsigned long long)interval_ns, a.stop_after_s, a.dport,
	       a.ports_arg, flow_family == AF_INET6 ? 6 : 4, (int)getpid(), (unsigned long long)t0);

	nl_fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl_fd < 0)
		fail(EXIT_NO_DIAG, "socket(AF_NETLINK, NETLINK_SOCK_DIAG): %s", strerror(errno));
	write_ready(); /* flushed with the header: they show that the sampler runs; the rest waits for a full buffer */

	write_footer(run_schedule(a.stop_file, t0, interval_ns, deadline, take_sample));
	return finish_output();
}
