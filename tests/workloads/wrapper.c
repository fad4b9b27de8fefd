/*
 * wrapper: per-thread counters allocated through allocation wrappers and
 * false-shared by two threads, for memprof-ebpf's naming tests: findings
 * and sites are named by the line that calls the wrapper (marked
 * *_CALLS_WRAPPER), never by the wrapper's own allocation line.
 *
 *   wrapper MODE SECONDS
 *     MODE header: through xalloc_hdr(), an out-of-line wrapper that puts
 *                  a 64-byte header before the block it returns.
 *     MODE inline: through CALLOC() of wrapper.h, a static inline helper.
 *   Prints "ready" (then waits for the go signal if armed, see truth.h),
 *   allocates a scratch buffer and an array of counters through the
 *   wrapper, and two threads increment their own counter (both on one
 *   cache line) for SECONDS.
 *   Truth: iterations.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "truth.h"
#include "wrapper.h"

#define THREADS 2
#define CHECK_EVERY 4096
#define MAGIC 0x6d656d70726f66UL

/* 8 bytes: with any 16-byte alignment both threads' counters share a
 * line. */
struct counters {
	int hits;
	int misses;
};

/* What xalloc_hdr() puts before each block: one cache line. */
struct header {
	unsigned long magic;
	size_t size;
	char pad[48];
};

static struct counters *g_counters;
static volatile int g_stop;
static long g_done[THREADS];
static void *volatile g_sink;

/* An allocation wrapper that adds a header: returns malloc's block plus
 * 64 bytes. */
__attribute__((noinline)) void *xalloc_hdr(size_t n)
{
	struct header *h = malloc(sizeof *h + n); /* WRAPPER_MALLOC */
	if (!h)
		abort();
	h->magic = MAGIC;
	h->size = n;
	return (char *)h + sizeof *h;
}

__attribute__((noinline)) void xfree_hdr(void *p)
{
	free((char *)p - sizeof(struct header));
}

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	volatile struct counters *c = &g_counters[id];
	long n = 0;
	do {
		for (int k = 0; k < CHECK_EVERY; k++)
			c->hits++; /* WRAPPER_WRITE */
		n += CHECK_EVERY;
	} while (!g_stop);
	g_done[id] += n;
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = argc == 3 ? atof(argv[2]) : 0;
	int header = argc == 3 && strcmp(argv[1], "header") == 0;
	if (seconds <= 0 || (!header && strcmp(argv[1], "inline") != 0)) {
		fprintf(stderr, "usage: wrapper header|inline SECONDS\n");
		return 2;
	}
	go_gate_arm();
	setvbuf(stdout, NULL, _IONBF, 0);
	puts("ready");
	go_gate_wait();
	/* Another line calling the same wrapper: kept, never shared. */
	if (header)
		g_sink = xalloc_hdr(4096); /* SCRATCH_CALLS_WRAPPER */
	else
		g_sink = CALLOC(1, 4096); /* SCRATCH_CALLS_HELPER */
	if (header)
		g_counters = xalloc_hdr(THREADS * sizeof *g_counters); /* HEADER_CALLS_WRAPPER */
	else
		g_counters = CALLOC(THREADS, sizeof *g_counters); /* INLINE_CALLS_WRAPPER */
	pthread_t tids[THREADS];
	for (int i = 0; i < THREADS; i++)
		if (pthread_create(&tids[i], NULL, worker, (void *)(intptr_t)i))
			return 1;
	struct timespec d = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
	nanosleep(&d, NULL);
	g_stop = 1;
	for (int i = 0; i < THREADS; i++)
		pthread_join(tids[i], NULL);
	if (header)
		xfree_hdr(g_counters);
	else
		free(g_counters);
	long total = 0;
	for (int i = 0; i < THREADS; i++)
		total += g_done[i];
	truth("iterations", total);
	return 0;
}
