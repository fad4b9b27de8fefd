/*
 * demo: a small "server" with one bug of each kind memprof-ebpf finds, for
 * `cargo xtask demo` and its integration test.
 *
 *   demo SECONDS
 *
 * Two worker threads (pinned to different CPUs when there are two) loop
 * for SECONDS, each round doing three things:
 *
 *   count_requests()  bumps its own counter in one heap-allocated
 *                     struct stats (malloc'd once at STATS_ALLOC): worker 0
 *                     writes .served, worker 1 writes .failed, 8 bytes
 *                     apart on one cache line.           FALSE sharing (heap)
 *   update_table()    takes g_table_lock (TABLE_LOCK), does ~40 us of work
 *                     inside (TABLE_WORK), releases it (TABLE_UNLOCK): the
 *                     two workers often want it at once.    contended mutex
 *   handle_request()  mallocs and frees request buffers of 64..4096 bytes
 *                     (REQUEST_ALLOC), and keeps one 48-byte session record
 *                     per round (of 16 requests) that it never frees
 *                     (SESSION_LEAK).
 *                                                   allocator churn + leak
 *
 * Prints "ready" (unbuffered) once the workers run, and at the end on
 * stderr "rounds N leaked_blocks N leaked_bytes N ..." (the workload's own
 * truth), then exits 0. Functions are noinline so each finding's code has
 * its own name; marked lines hold the one statement the report points at.
 * Nothing else is shared between the workers: their own results sit on
 * their own cache lines, and the store sink is per thread, so struct stats
 * is the only falsely shared line.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WORKERS 2
#define ALIGNED __attribute__((aligned(64)))
#define SESSION_BYTES 48
#define MAX_SESSIONS 200000

/* Per-worker statistics, deliberately unpadded: the classic bug. */
struct stats {
    long served; /* written by worker 0 */
    long failed; /* written by worker 1 */
};

struct session {
    long id;
    char user[SESSION_BYTES - sizeof(long)];
};
_Static_assert(sizeof(struct session) == SESSION_BYTES, "session size");

pthread_mutex_t g_table_lock ALIGNED = PTHREAD_MUTEX_INITIALIZER;
static unsigned long table[256] ALIGNED;

/* Read-only once the workers run. */
static struct stats *stats ALIGNED;
static long until_ns;
/* Stores through this cannot be optimised away; one per thread. */
static __thread void *volatile sink;
/* Each worker's own results, one cache line each. */
static struct {
    long rounds;
    long leaked;
} ALIGNED result[WORKERS];
static pthread_barrier_t start;

/* Fails on a null result. malloc itself is called on each marked line,
 * not inside a wrapper: the profiler names a block by the line that calls
 * malloc. */
static void *check(void *p)
{
    if (!p) {
        perror("malloc");
        exit(1);
    }
    return p;
}

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Spins for about `ns` nanoseconds (vDSO clock: no system call). */
static void busy_ns(long ns)
{
    long end = now_ns() + ns;
    while (now_ns() < end)
        sink = (void *)(uintptr_t)end;
}

__attribute__((noinline)) void count_requests(int id)
{
    volatile long *mine = id == 0 ? &stats->served : &stats->failed;
    for (int k = 0; k < 200000; k++)
        (*mine)++; /* STATS_WRITE */
}

__attribute__((noinline)) void update_table(int id)
{
    pthread_mutex_lock(&g_table_lock); /* TABLE_LOCK */
    for (int i = 0; i < 256; i++)
        table[i] += (unsigned long)id + 1;
    busy_ns(40000); /* TABLE_WORK */
    pthread_mutex_unlock(&g_table_lock); /* TABLE_UNLOCK */
}

__attribute__((noinline)) struct session *open_session(long id)
{
    struct session *s = check(malloc(sizeof *s)); /* SESSION_LEAK */
    s->id = id;
    snprintf(s->user, sizeof s->user, "user%ld", id);
    return s;
}

__attribute__((noinline)) void handle_request(int id, long round)
{
    for (int i = 0; i < 16; i++) {
        size_t size = 64u << ((round + i) % 7); /* 64 .. 4096 bytes */
        char *buf = check(malloc(size)); /* REQUEST_ALLOC */
        memset(buf, (int)i, size);
        sink = buf;
        free(buf);
    }
    /* The session record is meant to be freed when the session closes;
     * nothing ever closes it. */
    if (result[id].leaked < MAX_SESSIONS / WORKERS) {
        sink = open_session(round); /* SESSION_OPEN */
        result[id].leaked++;
    }
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
    pthread_barrier_wait(&start);
    long n = 0;
    while (now_ns() < until_ns) {
        count_requests(id);
        update_table(id);
        handle_request(id, n);
        n++;
    }
    result[id].rounds = n;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2 || atof(argv[1]) <= 0) {
        fprintf(stderr, "usage: demo SECONDS\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    stats = check(malloc(sizeof *stats)); /* STATS_ALLOC */
    memset(stats, 0, sizeof *stats);
    until_ns = now_ns() + (long)(atof(argv[1]) * 1e9);
    pthread_barrier_init(&start, NULL, WORKERS + 1);
    pthread_t threads[WORKERS];
    for (intptr_t i = 0; i < WORKERS; i++)
        pthread_create(&threads[i], NULL, worker, (void *)i);
    pthread_barrier_wait(&start);
    printf("ready\n");
    for (int i = 0; i < WORKERS; i++)
        pthread_join(threads[i], NULL);
    long total = 0, blocks = 0;
    for (int i = 0; i < WORKERS; i++) {
        total += result[i].rounds;
        blocks += result[i].leaked;
    }
    fprintf(stderr, "rounds %ld leaked_blocks %ld leaked_bytes %ld served %ld failed %ld\n", total,
            blocks, blocks * SESSION_BYTES, stats->served, stats->failed);
    return 0;
}
