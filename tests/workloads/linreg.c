/*
 * linreg: a linear-regression map-reduce kernel in the shape of the
 * well-known benchmark suites' one, for memprof-ebpf's false-sharing tests
 * and benchmarks. Each worker sums its share of a points array into its own
 * 64-byte argument struct; the structs sit side by side in one calloc'd
 * array, and calloc aligns to 16 bytes, so neighbouring workers' structs
 * straddle a cache line (heap false sharing). Built at -O0 the loop reloads
 * `args` from its stack slot before every field access, and loads
 * `args->points` and `args->num_elems` into the very register that held
 * `args`: the access a timer sample lands after has lost its base register.
 *
 *   linreg LAYOUT THREADS POINTS [ROUNDS]
 *
 * LAYOUT is "calloc" (the struct array as calloc returns it, shifted so
 * that it starts 16 bytes past a line, as a heap block with a 16-byte
 * header usually does) or "padded" (each struct aligned to 128 bytes: no
 * sharing). THREADS workers (1..64) each sum POINTS points, ROUNDS times
 * (default 1); each round creates new threads over the same structs, as
 * thread pools that re-create their workers per phase do. Prints "ready"
 * once the points are made, then "elapsed_ns N" on stderr (first round's
 * start to the last join). Truth: points_summed, rounds, struct_size,
 * block_offset (the struct array's offset in its line).
 *
 * With WORKLOAD_GO_SIGNAL=1 it waits for SIGUSR1 after "ready" (truth.h).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "truth.h"

#define MAX_THREADS 64

typedef struct {
	char x;
	char y;
} point_t;

/* 64 bytes: tid 0, points 8, num_elems 16, sums 24..63. */
typedef struct {
	pthread_t tid;
	point_t *points;
	int num_elems;
	long long SX;
	long long SY;
	long long SXX;
	long long SYY;
	long long SXY;
} lreg_args;

/* The same, each on its own pair of lines. */
typedef struct {
	lreg_args a;
	char pad[128 - sizeof(lreg_args)];
} __attribute__((aligned(128))) lreg_padded;

static void *lreg_thread(void *args_in)
{
	lreg_args *args = (lreg_args *)args_in;
	int i;
	args->SX = 0;
	args->SY = 0;
	args->SXX = 0;
	args->SYY = 0;
	args->SXY = 0;
	for (i = 0; i < args->num_elems; i++) { /* LINREG_LOOP */
		args->SX += args->points[i].x;   /* LINREG_SX */
		args->SXX += args->points[i].x * args->points[i].x;
		args->SY += args->points[i].y;
		args->SYY += args->points[i].y * args->points[i].y;
		args->SXY += args->points[i].x * args->points[i].y; /* LINREG_SXY */
	}
	return NULL;
}

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

/* The program keeps its block in a global, as programs do: a profiler
 * attached after the allocation names the block by it. */
char *g_linreg_block;

static lreg_args *make_args(const char *layout, int threads)
{
	if (!strcmp(layout, "padded")) {
		lreg_padded *p = aligned_alloc(128, threads * sizeof(lreg_padded)); /* LINREG_PADDED_ALLOC */
		if (!p)
			exit(1);
		memset(p, 0, threads * sizeof(lreg_padded));
		return &p[0].a;
	}
	/* 48 spare bytes so the array can start 16 bytes past a line. */
	char *raw = calloc(1, threads * sizeof(lreg_args) + 64); /* LINREG_CALLOC */
	if (!raw)
		exit(1);
	g_linreg_block = raw;
	uintptr_t at = ((uintptr_t)raw + 63) / 64 * 64 + 16;
	if (at - (uintptr_t)raw >= 64)
		at -= 64;
	return (lreg_args *)at;
}

static lreg_args *arg_at(lreg_args *base, const char *layout, int i)
{
	if (!strcmp(layout, "padded"))
		return &((lreg_padded *)base)[i].a;
	return &base[i];
}

int main(int argc, char **argv)
{
	if (argc < 4 || argc > 5 ||
	    (strcmp(argv[1], "calloc") && strcmp(argv[1], "padded"))) {
		fprintf(stderr, "usage: linreg calloc|padded THREADS POINTS [ROUNDS]\n");
		return 2;
	}
	const char *layout = argv[1];
	int threads = atoi(argv[2]);
	long points = atol(argv[3]);
	int rounds = argc == 5 ? atoi(argv[4]) : 1;
	if (threads < 1 || threads > MAX_THREADS || points < 1 || rounds < 1)
		return 2;
	go_gate_arm();

	point_t *pts = malloc(points * threads * sizeof(point_t));
	if (!pts)
		return 1;
	for (long i = 0; i < points * threads; i++) {
		pts[i].x = (char)(i * 7 % 101);
		pts[i].y = (char)(i * 13 % 97);
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	puts("ready");
	go_gate_wait();
	/* After the gate: a profiler attached at "ready" sees the allocation. */
	lreg_args *args = make_args(layout, threads);

	double start = now_ns();
	long long sx = 0;
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < threads; i++) {
			lreg_args *a = arg_at(args, layout, i);
			a->points = pts + i * points;
			a->num_elems = (int)points;
			if (pthread_create(&a->tid, NULL, lreg_thread, a))
				return 1;
		}
		for (int i = 0; i < threads; i++) {
			lreg_args *a = arg_at(args, layout, i);
			pthread_join(a->tid, NULL);
			sx += a->SX;
		}
	}
	double end = now_ns();
	fprintf(stderr, "elapsed_ns %.0f\n", end - start);
	truth("points_summed", (unsigned long)points * threads * rounds);
	truth("rounds", rounds);
	truth("struct_size", sizeof(lreg_args));
	truth("block_offset", (uintptr_t)args % 64);
	truth("checksum", (unsigned long)sx);
	return 0;
}
