/*
 * cacheuse: cache-line use workloads with known answers, for
 * memprof-ebpf's cache-use tests.
 *
 *   cacheuse MODE SECONDS
 *
 * One thread loops over an array of 2^15 elements until SECONDS have
 * passed, printing "ready" on stdout first and "iterations N" and
 * "ns_per_iter X" (one pass over the array) on stderr at the end. Modes, and what a profiler should report:
 *
 *   records  reads the key of each g_records element (struct record: an
 *            8-byte key, a 56-byte payload): 8 of every 64 bytes brought
 *            in are used, 12.5%; key hot, payload cold.
 *   split    the same keys in their own array, g_keys, the payloads in
 *            g_payloads (not read): whole lines used.          nothing
 *   heap     as records, on an array of struct record allocated with
 *            malloc (the line marked HEAP_RECORDS, which declares the
 *            pointer: its type names the element); 12.5%.
 *   pair     reads hot_a and hot_b of each g_pairs element (struct pair,
 *            128 bytes: 32 cold, hot_a, 48 cold, hot_b, 32 cold): the two
 *            hot fields are 56 bytes apart, on two lines, 16 of 128 bytes
 *            used; together they would fit one line.
 *
 * Reads go through volatile pointers so each one is a real load at -O1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N (1 << 15)
#define ALIGNED __attribute__((aligned(64)))

struct record {
	long key;
	char payload[56];
};

struct pair {
	char cold0[32];
	long hot_a;
	char cold1[48];
	long hot_b;
	char cold2[32];
};

struct record g_records[N] ALIGNED;
long g_keys[N] ALIGNED;
char g_payloads[N][56] ALIGNED;
struct pair g_pairs[N] ALIGNED;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
	fprintf(stderr, "usage: cacheuse records|split|heap|pair SECONDS\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc != 3)
		usage();
	double seconds = atof(argv[2]);
	if (seconds <= 0)
		usage();
	int mode = strcmp(argv[1], "records") == 0 ? 0
		 : strcmp(argv[1], "split") == 0   ? 1
		 : strcmp(argv[1], "pair") == 0    ? 2
		 : strcmp(argv[1], "heap") == 0    ? 3
						   : -1;
	if (mode < 0)
		usage();
	for (long i = 0; i < N; i++) {
		g_records[i].key = i;
		g_keys[i] = i;
		g_pairs[i].hot_a = i;
		g_pairs[i].hot_b = -i;
	}
	volatile struct record *records = g_records;
	if (mode == 3) {
		struct record *block = malloc(N * sizeof(struct record)); // HEAP_RECORDS
		if (!block)
			return 1;
		for (long i = 0; i < N; i++)
			block[i].key = i;
		records = block;
		mode = 0;
	}
	volatile long *keys = g_keys;
	volatile struct pair *pairs = g_pairs;
	setvbuf(stdout, NULL, _IONBF, 0);
	puts("ready");
	double start = now();
	long sum = 0, iterations = 0;
	while (now() - start < seconds) {
		for (long i = 0; i < N; i++) {
			if (mode == 0)
				sum += records[i].key; // RECORD_KEY
			else if (mode == 1)
				sum += keys[i]; // SPLIT_KEY
			else
				sum += pairs[i].hot_a + pairs[i].hot_b; // PAIR_HOT
		}
		iterations++;
	}
	fprintf(stderr, "iterations %ld (sum %ld)\n", iterations, sum);
	fprintf(stderr, "ns_per_iter %.1f\n", (now() - start) * 1e9 / (double)iterations);
	return 0;
}
