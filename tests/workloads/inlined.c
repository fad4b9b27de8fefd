/*
 * inlined: per-thread accumulators allocated by a helper that the compiler
 * inlines into main, then false-shared by two threads. The allocation
 * site is the helper's calloc line; a symbolizer that names the compiled
 * function only reports main's line that calls the helper.
 *
 *   inlined SECONDS   prints "ready", then 2 threads each increment their
 *                     own 8-byte accumulator of one calloc'd array (the
 *                     two on one cache line) for SECONDS.
 *                     Truth: iterations.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "truth.h"

#define THREADS 2
#define CHECK_EVERY 4096
/* Enough accumulators that two neighbours always fit in one line,
 * wherever calloc puts the block (it only aligns to 16). */
#define ACCUMS 16

struct accum {
	long sum;
};

static struct accum *g_accums;
static int g_first; /* index of thread 0's accumulator */
static volatile int g_stop;
static long g_done[THREADS];

static inline __attribute__((always_inline)) struct accum *make_accums(int n)
{
	struct accum *a = calloc(n, sizeof *a); /* HELPER_CALLOC */
	if (!a)
		abort();
	return a;
}

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	volatile long *s = &g_accums[g_first + id].sum;
	long n = 0;
	do {
		for (int k = 0; k < CHECK_EVERY; k++)
			(*s)++; /* INLINED_WRITE */
		n += CHECK_EVERY;
	} while (!g_stop);
	g_done[id] = n;
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = argc == 2 ? atof(argv[1]) : 0;
	if (seconds <= 0) {
		fprintf(stderr, "usage: inlined SECONDS\n");
		return 2;
	}
	g_accums = make_accums(ACCUMS); /* MAIN_CALLS_HELPER */
	/* The first accumulator whose neighbour is on its line. */
	while (((uintptr_t)&g_accums[g_first] & 63) > 64 - 2 * sizeof(struct accum))
		g_first++;
	pthread_t tids[THREADS];
	for (int i = 0; i < THREADS; i++)
		if (pthread_create(&tids[i], NULL, worker, (void *)(intptr_t)i))
			return 1;
	setvbuf(stdout, NULL, _IONBF, 0);
	puts("ready");
	struct timespec d = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
	nanosleep(&d, NULL);
	g_stop = 1;
	long total = 0;
	for (int i = 0; i < THREADS; i++) {
		pthread_join(tids[i], NULL);
		total += g_done[i];
	}
	truth("iterations", total);
	free(g_accums);
	return 0;
}
