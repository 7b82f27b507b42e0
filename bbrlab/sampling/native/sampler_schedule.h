/*
 * bbrlab: the slot schedule of the netlink samplers (sockdiag_sampler.c, qdisc_sampler.c) and the footer that
 * counts it. Include after sampler_common.h. The BPF sampler has its own schedule (its program samples on ACKs).
 */

#ifndef BBRLAB_SAMPLER_SCHEDULE_H
#define BBRLAB_SAMPLER_SCHEDULE_H

#include "sampler_common.h"

/* The slot schedule of the netlink samplers, and what their footer counts. */
static uint64_t samples;   /* samples taken */
static uint64_t tick;      /* the slot of the sample being taken: due at t0 + tick * interval */
static uint64_t ticks;     /* slots begun so far (= samples + missed at the end) */
static uint64_t missed;    /* slots skipped: passed before the sampler woke, or while the previous sample ran */

/*
 * Slot k is [t0 + k * interval, t0 + (k + 1) * interval) on CLOCK_MONOTONIC. At most one sample per slot,
 * taken in its own slot: a slot that has passed when the sampler wakes (late wake-up) or when the previous
 * sample ends (a sample longer than the rest of its slot) is skipped and counted as missed; samples are never
 * bunched to catch up. take(realtime_ns, monotonic_ns) takes one sample. Returns why it ended: "deadline",
 * or stop_reason()'s.
 */
static const char *run_schedule(const char *stop_file, uint64_t t0, uint64_t interval_ns, uint64_t deadline,
				void (*take)(uint64_t real_ns, uint64_t mono_ns))
{
	for (;;) {
		const char *stop = stop_reason(stop_file);
		if (stop)
			return stop;
		uint64_t real = now_ns(CLOCK_REALTIME);
		uint64_t now = now_ns(CLOCK_MONOTONIC);
		if (now >= deadline)
			return "deadline";
		tick = (now - t0) / interval_ns;
		if (tick > ticks)
			missed += tick - ticks;
		take(real, now);
		now = now_ns(CLOCK_MONOTONIC);
		uint64_t current = (now - t0) / interval_ns;
		missed += current - tick;
		ticks = current + 1;
		uint64_t next = t0 + ticks * interval_ns;
		sleep_until(next > deadline ? deadline : next);
	}
}

/* "# end ...": the schedule's counts, the CPU and memory the sampler used, its wall time and why it ended. */
static void write_schedule_footer(const char *reason)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("# end samples=%llu ticks=%llu missed=%llu cpu_user_us=%lld cpu_sys_us=%lld maxrss_kb=%ld "
	       "wall_ns=%llu reason=%s\n",
	       (unsigned long long)samples, (unsigned long long)ticks, (unsigned long long)missed,
	       cpu_us(&ru.ru_utime), cpu_us(&ru.ru_stime), ru.ru_maxrss,
	       (unsigned long long)(now_ns(CLOCK_MONOTONIC) - mono_start_ns), reason);
}

#endif
