/*
 * short: a contended lock and a hot function with one-letter names, for
 * memprof-ebpf's naming tests. GCC stores such short names inline in the
 * debug info (DW_FORM_string), where a symbolizer that takes the name from
 * the wrong place reports a type name instead ("wchar_t").
 *
 *   short SECONDS   prints "ready", then 2 threads run w() for SECONDS:
 *                   lock m, ~20 us of busy work, unlock, ~5 us outside.
 *                   The busy work increments the thread's own word of
 *                   the global g (both words on one cache line: false
 *                   sharing on a one-letter global).
 *                   Truth: acquisitions.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "truth.h"

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static unsigned long n;
/* One line of its own: thread i writes g[i]. */
static volatile long g[8] __attribute__((aligned(64)));
static long until_ns;

static long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Always inlined: the hot function is w itself. */
static inline __attribute__((always_inline)) void spin_ns(int id, long ns)
{
	long end = now_ns() + ns;
	while (now_ns() < end)
		for (int k = 0; k < 64; k++)
			g[id]++; // SHORT_G_WRITE
}

static void *w(void *arg)
{
	int id = (int)(intptr_t)arg;
	while (now_ns() < until_ns) {
		pthread_mutex_lock(&m); // SHORT_WAIT
		n++;
		spin_ns(id, 20000);
		pthread_mutex_unlock(&m);
		spin_ns(id, 5000);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = argc == 2 ? atof(argv[1]) : 0;
	if (seconds <= 0) {
		fprintf(stderr, "usage: short SECONDS\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	puts("ready");
	until_ns = now_ns() + (long)(seconds * 1e9);
	pthread_t a, b;
	if (pthread_create(&a, NULL, w, (void *)0) || pthread_create(&b, NULL, w, (void *)1))
		return 1;
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	truth("acquisitions", n);
	return 0;
}
