/*
 * ulcp: contended locks whose waits are needed or not, with known
 * answers, for memprof-ebpf's unnecessary-contention tests (PerfPlay's
 * classes).
 *
 *   ulcp SECONDS [THREADS] [MODE]
 *
 * THREADS threads (default 4) take the locks below in turn until SECONDS
 * have passed, each section a few microseconds of work on its data, so
 * that every lock is contended. "ready" is printed on stdout first; at
 * the end, the acquisitions of each lock go to the truth file
 * (truth.h), and "ns_per_iter X" to stderr (wall time per round of
 * sections, for benchmarks). MODE "all" (default) takes all five locks,
 * MODE "true" only g_counter_lock. Each lock, and what a profiler should report:
 *
 *   g_null_lock     around work on the thread's own buffer (allocated by
 *                   the thread, never touched by another): null-lock.
 *   g_table_lock    around reads of g_table, a table every thread reads
 *                   and nobody writes while the locks are taken:
 *                   read-read.
 *   g_slots_lock    around writes of g_slots[me], each thread its own
 *                   word of one shared array (one cache line):
 *                   disjoint-write.
 *   g_flag_lock     around stores of 1 to g_flag (every thread, every
 *                   time: redundant writes of one value): benign.
 *   g_counter_lock  around updates of g_counter, one word every thread
 *                   reads and writes: true contention (needed).
 *
 * Data accesses go through volatile pointers so each is a real load or
 * store at any optimization level.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "truth.h"

#define TABLE 512
#define WORK 4000
#define MAX_THREADS 8
#define BUFFER_WORDS 512

pthread_mutex_t g_null_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_table_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_slots_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_flag_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_counter_lock = PTHREAD_MUTEX_INITIALIZER;

long g_table[TABLE] __attribute__((aligned(64)));
long g_slots[MAX_THREADS] __attribute__((aligned(64)));
long g_counter __attribute__((aligned(64)));
int g_flag __attribute__((aligned(64)));
volatile long g_sink;

static unsigned long acquisitions[5][MAX_THREADS];
static double g_end;
static int g_only_true;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Thread-local work: the thread's own buffer. */
static void null_section(volatile long *buffer)
{
	pthread_mutex_lock(&g_null_lock); /* LOCK_NULL */
	for (int i = 0; i < WORK; i++)
		buffer[i % BUFFER_WORDS] += i;
	pthread_mutex_unlock(&g_null_lock);
}

static void table_section(void)
{
	volatile long *table = g_table;
	long sum = 0;
	pthread_mutex_lock(&g_table_lock); /* LOCK_TABLE */
	/* Four times the others' work: a read is faster than an update
	 * through memory, and the sections are about as long. */
	for (int k = 0; k < 4 * WORK / TABLE; k++)
		for (int i = 0; i < TABLE; i++)
			sum += table[i];
	pthread_mutex_unlock(&g_table_lock);
	g_sink = sum;
}

static void slots_section(int me)
{
	volatile long *slot = &g_slots[me];
	pthread_mutex_lock(&g_slots_lock); /* LOCK_SLOTS */
	for (int i = 0; i < WORK; i++)
		*slot += i;
	pthread_mutex_unlock(&g_slots_lock);
}

static void flag_section(void)
{
	volatile int *flag = &g_flag;
	pthread_mutex_lock(&g_flag_lock); /* LOCK_FLAG */
	/* Four times the others' work: a store of a constant retires into
	 * the store buffer, faster than an update through memory. */
	for (int i = 0; i < 4 * WORK; i++)
		*flag = 1;
	pthread_mutex_unlock(&g_flag_lock);
}

static void counter_section(void)
{
	volatile long *counter = &g_counter;
	pthread_mutex_lock(&g_counter_lock); /* LOCK_COUNTER */
	for (int i = 0; i < WORK; i++)
		*counter += i;
	pthread_mutex_unlock(&g_counter_lock);
}

static void *worker(void *arg)
{
	int me = (int)(long)arg;
	volatile long *buffer = aligned_alloc(64, BUFFER_WORDS * sizeof(long));
	if (!buffer)
		exit(1);
	memset((void *)buffer, 0, BUFFER_WORDS * sizeof(long));
	while (now() < g_end) {
		for (int k = 0; k < 64; k++) {
			if (!g_only_true) {
				null_section(buffer);
				table_section();
				slots_section(me);
				flag_section();
				acquisitions[0][me]++;
				acquisitions[1][me]++;
				acquisitions[2][me]++;
				acquisitions[3][me]++;
			}
			counter_section();
			acquisitions[4][me]++;
		}
	}
	free((void *)buffer);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: ulcp SECONDS [THREADS] [all|true]\n");
		return 2;
	}
	double seconds = atof(argv[1]);
	int threads = argc > 2 ? atoi(argv[2]) : 4;
	if (threads < 2 || threads > MAX_THREADS) {
		fprintf(stderr, "ulcp: THREADS must be 2..%d\n", MAX_THREADS);
		return 2;
	}
	g_only_true = argc > 3 && strcmp(argv[3], "true") == 0;
	for (int i = 0; i < TABLE; i++)
		g_table[i] = i;
	go_gate_arm();
	printf("ready\n");
	fflush(stdout);
	go_gate_wait();
	double start = now();
	g_end = start + seconds;
	pthread_t t[MAX_THREADS];
	for (long i = 0; i < threads; i++)
		if (pthread_create(&t[i], NULL, worker, (void *)i) != 0)
			return 1;
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	double elapsed = now() - start;
	static const char *names[5] = {"null_lock", "table_lock", "slots_lock", "flag_lock",
				       "counter_lock"};
	for (int l = 0; l < 5; l++) {
		unsigned long n = 0;
		for (int i = 0; i < threads; i++)
			n += acquisitions[l][i];
		truth(names[l], n);
		/* One round: a section of each lock taken, all threads. */
		if (l == 4 && n > 0)
			fprintf(stderr, "ns_per_iter %.1f\n", elapsed * 1e9 / (double)n);
	}
	return 0;
}
