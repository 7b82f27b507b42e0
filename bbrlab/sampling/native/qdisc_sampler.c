/*
 * qdisc_sampler: the qdiscs of one interface, sampled every INTERVAL_US through one persistent NETLINK_ROUTE
 * socket (an RTM_GETQDISC dump per sample: no fork, no tc), for bbrlab's bottleneck queue in the emulator.
 *
 * usage: qdisc_sampler -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -n IFNAME
 *
 * Output (stdout, fully buffered):
 *   # bbrlab-qdisc-sampler format=1 interval_ns=N stop_after_s=N ifname=S ifindex=N pid=N t0_ns=N
 *   # ready cpu_user_us=N cpu_sys_us=N
 *   Q <realtime_ns> <handle> <parent> <kind> <bytes> <packets> <drops> <overlimits> <requeues> <backlog> <qlen>
 *   ... one Q line per qdisc of the interface per sample; handle and parent in hex (8 digits) ...
 *   # end samples=N ticks=N missed=N cpu_user_us=N cpu_sys_us=N maxrss_kb=N wall_ns=N reason=R
 *
 * The schedule is the socket sampler's: slot k is [t0 + k * interval, t0 + (k + 1) * interval), one sample per
 * slot at most, a slot that passed before the sampler could take it counted as missed. The timestamp is
 * CLOCK_REALTIME read just before the dump is asked for.
 *
 * Exit status: 0 stopped normally; 2 bad arguments; 3 no netlink socket or no such interface; 4 a dump
 * failed; 6 output failure.
 */
#define SAMPLER_NAME "qdisc_sampler"
#define SAMPLER_USAGE SAMPLER_NAME " -i INTERVAL_US -t STOP_AFTER_S -s STOP_FILE -n IFNAME"

/* sampler_common.h's port options are the socket samplers' alone */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "sampler_common.h"
#include "sampler_schedule.h"

#include <linux/gen_stats.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#define FORMAT_VERSION 1
enum { EXIT_NO_NETLINK = 3, EXIT_DUMP = 4 };

static int nl_fd;
static int ifindex;
static uint32_t seq;
static char rx[1 << 16];

static void write_footer(const char *reason)
{
	write_schedule_footer(reason);
}

static void ask_dump(void)
{
	struct {
		struct nlmsghdr nh;
		struct tcmsg tc;
	} req = {
		.nh = { .nlmsg_len = sizeof(req), .nlmsg_type = RTM_GETQDISC, .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
			.nlmsg_seq = ++seq },
		.tc = { .tcm_family = AF_UNSPEC, .tcm_ifindex = ifindex },
	};
	if (send(nl_fd, &req, sizeof(req), 0) != (ssize_t)sizeof(req))
		fail(EXIT_DUMP, "send(RTM_GETQDISC): %s", strerror(errno));
}

/* The Q line of one RTM_NEWQDISC message of our interface. */
static void print_qdisc(uint64_t real_ns, struct nlmsghdr *nh)
{
	struct tcmsg *tc = NLMSG_DATA(nh);
	if (tc->tcm_ifindex != ifindex)
		return;
	const char *kind = "?";
	struct gnet_stats_basic basic = { 0 };
	struct gnet_stats_queue queue = { 0 };
	int len = (int)nh->nlmsg_len - (int)NLMSG_LENGTH(sizeof(*tc));
	for (struct rtattr *a = (struct rtattr *)((char *)tc + NLMSG_ALIGN(sizeof(*tc))); RTA_OK(a, len);
	     a = RTA_NEXT(a, len)) {
		if (a->rta_type == TCA_KIND) {
			kind = RTA_DATA(a);
		} else if (a->rta_type == TCA_STATS2) {
			int inner = (int)RTA_PAYLOAD(a);
			for (struct rtattr *s = RTA_DATA(a); RTA_OK(s, inner); s = RTA_NEXT(s, inner)) {
				size_t n = RTA_PAYLOAD(s);
				if (s->rta_type == TCA_STATS_BASIC)
					memcpy(&basic, RTA_DATA(s), n < sizeof(basic) ? n : sizeof(basic));
				else if (s->rta_type == TCA_STATS_QUEUE)
					memcpy(&queue, RTA_DATA(s), n < sizeof(queue) ? n : sizeof(queue));
			}
		}
	}
	printf("Q %llu %08x %08x %s %llu %u %u %u %u %u %u\n", (unsigned long long)real_ns, tc->tcm_handle,
	       tc->tcm_parent, kind, (unsigned long long)basic.bytes, basic.packets, queue.drops, queue.overlimits,
	       queue.requeues, queue.backlog, queue.qlen);
}

/* One sample (stamped with real_ns; the schedule's monotonic time is not printed): the dump asked and read to
 * its NLMSG_DONE. */
static void take_sample(uint64_t real_ns, uint64_t mono_ns)
{
	(void)mono_ns;
	ask_dump();
	for (;;) {
		ssize_t n = recv(nl_fd, rx, sizeof(rx), 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			fail(EXIT_DUMP, "recv(RTM_GETQDISC dump): %s", strerror(errno));
		}
		int left = (int)n;
		for (struct nlmsghdr *nh = (struct nlmsghdr *)rx; NLMSG_OK(nh, left); nh = NLMSG_NEXT(nh, left)) {
			if (nh->nlmsg_seq != seq)
				continue;
			if (nh->nlmsg_type == NLMSG_DONE) {
				samples++;
				return;
			}
			if (nh->nlmsg_type == NLMSG_ERROR) {
				struct nlmsgerr *e = NLMSG_DATA(nh);
				fail(EXIT_DUMP, "RTM_GETQDISC dump: %s", strerror(-e->error));
			}
			if (nh->nlmsg_type == RTM_NEWQDISC)
				print_qdisc(real_ns, nh);
		}
	}
}

int main(int argc, char **argv)
{
	struct common_args a = COMMON_ARGS_UNSET;
	const char *ifname = NULL;
	int opt;
	opterr = 0;
	while ((opt = getopt(argc, argv, "i:t:s:n:")) != -1) {
		if (opt != 'n' && common_option(opt, &a))
			continue;
		if (opt == 'n')
			ifname = optarg;
		else
			usage("unknown option or missing value: -%c", optopt);
	}
	if (optind != argc)
		usage("unexpected argument '%s'", argv[optind]);
	if (a.interval_us < 0 || a.stop_after_s < 0 || !a.stop_file || !ifname)
		usage("-i, -t, -s and -n are all required");
	if (a.stop_file[0] != '/')
		usage("-s (stop_file) = '%s' is not allowed: an absolute path", a.stop_file);
	if (strlen(ifname) >= IF_NAMESIZE)
		usage("-n (ifname) = '%s' is not allowed: at most %d characters", ifname, IF_NAMESIZE - 1);

	buffer_output_and_catch_signals();
	const uint64_t interval_ns = (uint64_t)a.interval_us * 1000;
	const uint64_t t0 = mono_start_ns = now_ns(CLOCK_MONOTONIC);
	const uint64_t deadline = t0 + (uint64_t)a.stop_after_s * 1000000000ull;
	ifindex = (int)if_nametoindex(ifname);
	printf("# bbrlab-qdisc-sampler format=%d interval_ns=%llu stop_after_s=%ld ifname=%s ifindex=%d pid=%d "
	       "t0_ns=%llu\n", FORMAT_VERSION, (unsigned long long)interval_ns, a.stop_after_s, ifname, ifindex,
	       (int)getpid(), (unsigned long long)t0);
	if (ifindex == 0)
		fail(EXIT_NO_NETLINK, "no interface %s: %s", ifname, strerror(errno));
	nl_fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (nl_fd < 0)
		fail(EXIT_NO_NETLINK, "socket(AF_NETLINK, NETLINK_ROUTE): %s", strerror(errno));
	write_ready();

	write_footer(run_schedule(a.stop_file, t0, interval_ns, deadline, take_sample));
	return finish_output();
}
