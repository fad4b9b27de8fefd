/*
 * spin: CPU-bound threads with known hot lines, for memprof-ebpf's tests,
 * demo and benchmark.
 *
 *   spin time THREADS SECONDS [LATE_MS]   run THREADS spinners for SECONDS;
 *                                          with LATE_MS, one more thread
 *                                          (late_worker) starts after LATE_MS
 *   spin work THREADS CHUNKS              fixed work: each thread runs CHUNKS
 *                                          chunks, then the program exits
 *   spin chain SECONDS [PATH]             run before_exec_worker for SECONDS,
 *                                          then exec PATH (default: itself)
 *                                          as "time 1 SECONDS"
 *   spin burst COUNT                      COUNT short threads (~50 ms each,
 *                                          named burst-N), one after another
 *   spin gaps SECONDS                     the main thread reads the clock in
 *                                          a loop for SECONDS and prints, every
 *                                          100 ms, "gaps PPM": the share of
 *                                          the time it ran (in parts per
 *                                          million) lost in gaps between two
 *                                          reads of 0.5-200 µs: interrupts
 *                                          (longer gaps are preemption, left
 *                                          out with their time). The sampler's
 *                                          interrupts add to it: the ground
 *                                          truth of what they cost.
 *
 * Prints "ready" once its first threads run, so tests can attach; in work
 * mode, "elapsed SECONDS" at the end (the benchmark's measure).
 * Lines marked HOT are where the samples must land.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 200000UL

/* Each thread accumulates into its own stack slot (volatile, so every
 * iteration stores), so threads share no cache line: pure CPU work. */
static unsigned long sink;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct job {
	double until;        /* time mode: stop at this time */
	unsigned long chunks; /* work mode: this many chunks */
};

__attribute__((noinline)) void spin_worker(const struct job *job)
{
	volatile unsigned long acc = 0;
	unsigned long done = 0;
	while (job->chunks ? done < job->chunks : now() < job->until) {
		for (unsigned long i = 0; i < CHUNK; i++) acc += i; /* HOT spin_worker */
		done++;
	}
	__atomic_fetch_add(&sink, acc, __ATOMIC_RELAXED);
}

__attribute__((noinline)) void late_worker(const struct job *job)
{
	volatile unsigned long acc = 0;
	while (now() < job->until) {
		for (unsigned long i = 0; i < CHUNK; i++) acc ^= i; /* HOT late_worker */
	}
	__atomic_fetch_add(&sink, acc, __ATOMIC_RELAXED);
}

__attribute__((noinline)) void before_exec_worker(double until)
{
	volatile unsigned long acc = 0;
	while (now() < until) {
		for (unsigned long i = 0; i < CHUNK; i++) acc -= i; /* HOT before_exec_worker */
	}
	__atomic_fetch_add(&sink, acc, __ATOMIC_RELAXED);
}

static void *spin_thread(void *arg)
{
	spin_worker(arg); /* CALL spin_worker */
	return NULL;
}

static void *late_thread(void *arg)
{
	late_worker(arg);
	return NULL;
}

static unsigned long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* The same rule as the profiler's own measure (kernel/interrupts.rs), so
 * the two are comparable: a gap is 0.5-200 µs between two reads. */
static void gaps(double seconds)
{
	unsigned long long start = now_ns(), last = start, interval = start;
	unsigned long long end = start + (unsigned long long)(seconds * 1e9);
	unsigned long long gap_ns = 0, preempted_ns = 0;
	for (;;) {
		unsigned long long t = now_ns(), d = t - last;
		if (d > 200000)
			preempted_ns += d;
		else if (d > 500)
			gap_ns += d;
		last = t;
		if (t - interval >= 100000000ULL) {
			unsigned long long ran = t - interval - preempted_ns;
			printf("gaps %llu\n", ran ? gap_ns * 1000000ULL / ran : 0);
			fflush(stdout);
			/* Printing is not a gap of the next interval. */
			interval = last = now_ns();
			gap_ns = preempted_ns = 0;
		}
		if (t >= end)
			return;
	}
}

static void usage(void)
{
	fprintf(stderr, "usage: spin time THREADS SECONDS [LATE_MS] | spin work THREADS CHUNKS"
			" | spin chain SECONDS [PATH] | spin burst COUNT | spin gaps SECONDS\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "chain") == 0) {
		printf("ready\n");
		fflush(stdout);
		before_exec_worker(now() + atof(argv[2]));
		const char *next = argc > 3 ? argv[3] : "/proc/self/exe";
		char *args[] = {(char *)next, "time", "1", argv[2], NULL};
		execv(next, args);
		perror("execv");
		return 1;
	}
	if (argc == 3 && strcmp(argv[1], "burst") == 0) {
		printf("ready\n");
		fflush(stdout);
		for (int i = 0; i < atoi(argv[2]); i++) {
			struct job short_job = {.until = now() + 0.05};
			pthread_t t;
			if (pthread_create(&t, NULL, spin_thread, &short_job) != 0)
				return 1;
			char name[16];
			snprintf(name, sizeof name, "burst-%d", i);
			pthread_setname_np(t, name);
			pthread_join(t, NULL);
		}
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "gaps") == 0 && atof(argv[2]) > 0) {
		printf("ready\n");
		fflush(stdout);
		gaps(atof(argv[2]));
		return 0;
	}
	if (argc < 4)
		usage();
	int threads = atoi(argv[2]);
	if (threads < 1 || threads > 256)
		usage();
	struct job job = {0};
	long late_ms = 0;
	if (strcmp(argv[1], "time") == 0) {
		job.until = now() + atof(argv[3]);
		late_ms = argc > 4 ? atol(argv[4]) : 0;
	} else if (strcmp(argv[1], "work") == 0) {
		job.chunks = strtoul(argv[3], NULL, 10);
	} else {
		usage();
	}

	pthread_t tids[257];
	for (int i = 0; i < threads; i++) {
		if (pthread_create(&tids[i], NULL, spin_thread, &job) != 0)
			return 1;
		char name[16];
		snprintf(name, sizeof name, "spin-%d", i);
		pthread_setname_np(tids[i], name);
	}
	printf("ready\n");
	fflush(stdout);

	double started = now();
	int n = threads;
	if (late_ms > 0) {
		usleep(late_ms * 1000);
		if (pthread_create(&tids[n], NULL, late_thread, &job) != 0)
			return 1;
		pthread_setname_np(tids[n], "late");
		n++;
	}
	for (int i = 0; i < n; i++)
		pthread_join(tids[i], NULL);
	if (job.chunks)
		printf("elapsed %.6f\n", now() - started);
	return 0;
}
