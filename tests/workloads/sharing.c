/*
 * sharing: cache-line sharing workloads with known answers, for
 * memprof-ebpf's false-sharing tests and benchmarks.
 *
 *   sharing MODE THREADS SECONDS [ITERS]
 *
 * THREADS workers (1..64) start together and loop until SECONDS have
 * passed; with ITERS > 0 each does exactly ITERS iterations instead and
 * the program prints "elapsed_ns N" on stderr (workers' start to the last
 * join), for benchmarks. Every mode prints "ready" on stdout (flushed)
 * once the workers run, and "iterations N" (all threads) on stderr at the
 * end. Modes, and what a profiler should report:
 *
 *   array       g_counters[i]++ by thread i, long g_counters[64] on
 *               aligned lines: threads 0-7 share one line.   FALSE sharing
 *   padded      the same with each counter padded to 64 bytes.     nothing
 *   heap        per-thread 16-byte slots in one 64-byte-aligned heap block
 *               (one aligned_alloc call in main).             FALSE sharing
 *   atomic      all threads __atomic_fetch_add one g_shared_counter.
 *                                                              TRUE sharing
 *   readmostly  thread 0 writes one g_table entry every ~1 ms; the others
 *               keep summing the whole table (THREADS >= 2).       nothing
 *   mapreduce   per-thread 40-byte struct thread_arg in g_args[]: thread i
 *               updates g_args[i].sum and .count, so neighbours share
 *               lines (the classic map-reduce layout).        FALSE sharing
 *   wide        as array, and between counter updates each thread writes
 *               its own 32 MiB buffer, four lines a time (WIDE_WRITE): far
 *               more distinct lines than the profiler's line table holds.
 *                                             FALSE sharing (g_counters)
 *
 * Shared objects are non-static globals with distinctive names (the
 * profiler names them by ELF symbol); the lines the tests look for carry a
 * marker comment and hold the one access. Hot accesses go through
 * volatile pointers so each iteration really loads and stores memory at
 * -O1. Workers check g_stop (alone on its line) every 1024 iterations.
 * Worker i is pinned to CPU i modulo the CPUs online, so two workers
 * always run on different CPUs and the line really moves between caches
 * (run to run, the cost of false sharing is then stable enough to time).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define ALIGNED __attribute__((aligned(64)))
#define CHECK_EVERY 1024

volatile int g_stop ALIGNED;
static char g_stop_pad[60] __attribute__((used));

long g_counters[MAX_THREADS] ALIGNED;

struct padded_counter {
    long value;
    char pad[56];
};
struct padded_counter g_padded[MAX_THREADS] ALIGNED;

struct heap_slot {
    long count;
    long last;
};
struct heap_slot *g_heap_slots;

long g_shared_counter ALIGNED;
static char g_shared_pad[56] __attribute__((used));

long g_table[64] ALIGNED;

struct thread_arg {
    int id;
    int flags;
    long sum;
    long count;
    char tag[16];
};
_Static_assert(sizeof(struct thread_arg) == 40, "thread_arg must be 40 bytes");
struct thread_arg g_args[MAX_THREADS] ALIGNED;

/* Per-thread results of the readers, each on its own line. */
struct padded_counter g_reader_sums[MAX_THREADS] ALIGNED;

static const char *g_mode;
static long g_iters; /* 0: run until g_stop */
static long g_done[MAX_THREADS];
static pthread_barrier_t g_start;

/* Whether the worker should stop after `n` iterations. */
static int finished(long n)
{
    if (g_iters > 0)
        return n >= g_iters;
    return (n % CHECK_EVERY) == 0 && g_stop;
}

static long run_array(int id)
{
    volatile long *c = &g_counters[id];
    long n = 0;
    do {
        for (int k = 0; k < CHECK_EVERY; k++)
            (*c)++; /* ARRAY_WRITE */
        n += CHECK_EVERY;
    } while (!finished(n));
    return n;
}

static long run_padded(int id)
{
    volatile long *c = &g_padded[id].value;
    long n = 0;
    do {
        for (int k = 0; k < CHECK_EVERY; k++)
            (*c)++; /* PADDED_WRITE */
        n += CHECK_EVERY;
    } while (!finished(n));
    return n;
}

static long run_heap(int id)
{
    volatile long *c = &g_heap_slots[id].count;
    long n = 0;
    do {
        for (int k = 0; k < CHECK_EVERY; k++)
            (*c)++; /* HEAP_WRITE */
        n += CHECK_EVERY;
    } while (!finished(n));
    return n;
}

static long run_atomic(int id)
{
    (void)id;
    long n = 0;
    do {
        for (int k = 0; k < CHECK_EVERY; k++)
            __atomic_fetch_add(&g_shared_counter, 1, __ATOMIC_RELAXED); /* ATOMIC_ADD */
        n += CHECK_EVERY;
    } while (!finished(n));
    return n;
}

static long run_readmostly(int id)
{
    volatile long *table = g_table;
    long n = 0;
    if (id == 0) {
        /* The writer: one entry every ~1 ms. */
        struct timespec ms = {0, 1000000};
        long k = 0;
        while (g_iters > 0 ? k * CHECK_EVERY < g_iters : !g_stop) {
            table[k % 64] = k; /* TABLE_WRITE */
            k++;
            nanosleep(&ms, NULL);
        }
        return k;
    }
    long sum = 0;
    do {
        for (int k = 0; k < CHECK_EVERY / 64; k++)
            for (int i = 0; i < 64; i++)
                sum += table[i]; /* TABLE_READ */
        n += CHECK_EVERY;
    } while (!finished(n));
    g_reader_sums[id].value = sum;
    return n;
}

#define WIDE_BYTES (32L << 20)
/* With one line written per counter update the samples' split between the
 * two varied from run to run (the contended counter line took 85-93% of
 * them in some runs, and the wide lines then stayed short of the table):
 * four lines per update keep the wide writes well above it. */
#define WIDE_LINES_PER_COUNT 4
static char *g_wide[MAX_THREADS];

static long run_wide(int id)
{
    volatile long *c = &g_counters[id];
    volatile char *buf = g_wide[id];
    long n = 0, at = 0;
    do {
        for (int k = 0; k < CHECK_EVERY; k++) {
            (*c)++; /* WIDE_COUNTER */
            for (int j = 0; j < WIDE_LINES_PER_COUNT; j++) {
                buf[at]++; /* WIDE_WRITE */
                at = (at + 64) % WIDE_BYTES;
            }
        }
        n += CHECK_EVERY;
    } while (!finished(n));
    return n;
}

static long run_mapreduce(int id)
{
    volatile struct thread_arg *a = &g_args[id];
    long n = 0;
    do {
        for (int k = 0; k < CHECK_EVERY; k++) {
            a->sum += id + 1; /* MAPREDUCE_SUM */
            a->count++;       /* MAPREDUCE_COUNT */
        }
        n += CHECK_EVERY;
    } while (!finished(n));
    return n;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 1) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(id % cpus, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    pthread_barrier_wait(&g_start);
    long n;
    if (!strcmp(g_mode, "array"))
        n = run_array(id);
    else if (!strcmp(g_mode, "padded"))
        n = run_padded(id);
    else if (!strcmp(g_mode, "heap"))
        n = run_heap(id);
    else if (!strcmp(g_mode, "atomic"))
        n = run_atomic(id);
    else if (!strcmp(g_mode, "readmostly"))
        n = run_readmostly(id);
    else if (!strcmp(g_mode, "wide"))
        n = run_wide(id);
    else
        n = run_mapreduce(id);
    g_done[id] = n;
    return NULL;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int usage(void)
{
    fprintf(stderr, "usage: sharing array|padded|heap|atomic|readmostly|mapreduce|wide "
                    "THREADS SECONDS [ITERS]\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5)
        return usage();
    g_mode = argv[1];
    const char *modes[] = {"array", "padded", "heap", "atomic", "readmostly", "mapreduce", "wide"};
    int known = 0;
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        known |= !strcmp(g_mode, modes[i]);
    int threads = atoi(argv[2]);
    double seconds = atof(argv[3]);
    g_iters = argc == 5 ? atol(argv[4]) : 0;
    if (!known || threads < 1 || threads > MAX_THREADS || (g_iters <= 0 && seconds <= 0))
        return usage();
    if (!strcmp(g_mode, "readmostly") && threads < 2)
        return usage();
    if (!strcmp(g_mode, "heap")) {
        size_t bytes = (threads * sizeof(struct heap_slot) + 63) / 64 * 64;
        g_heap_slots = aligned_alloc(64, bytes); /* HEAP_ALLOC */
        if (!g_heap_slots)
            return 1;
        memset(g_heap_slots, 0, bytes);
    }

    if (!strcmp(g_mode, "wide"))
        for (int i = 0; i < threads; i++)
            if (!(g_wide[i] = calloc(1, WIDE_BYTES)))
                return 1;

    pthread_t tids[MAX_THREADS];
    pthread_barrier_init(&g_start, NULL, threads + 1);
    for (int i = 0; i < threads; i++)
        pthread_create(&tids[i], NULL, worker, (void *)(intptr_t)i);
    pthread_barrier_wait(&g_start);
    double start = now_ns();
    printf("ready\n");
    fflush(stdout);
    if (g_iters <= 0) {
        struct timespec d = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
        nanosleep(&d, NULL);
        g_stop = 1;
    }
    long total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tids[i], NULL);
        total += g_done[i];
    }
    double end = now_ns();
    if (g_iters > 0)
        fprintf(stderr, "elapsed_ns %.0f\n", end - start);
    fprintf(stderr, "iterations %ld\n", total);
    free(g_heap_slots);
    return 0;
}
