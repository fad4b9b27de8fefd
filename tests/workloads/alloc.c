/*
 * alloc: allocator workloads with known behaviour, for memprof-ebpf's
 * allocator tests and benchmarks.
 *
 *   alloc reuse N            N x malloc(64), free them all; again: phase 2
 *                            gets the addresses of phase 1 back (glibc)
 *   alloc large N SIZE       mallopt(M_MMAP_THRESHOLD, 64 KiB), then N x
 *                            (malloc(SIZE), touch every page, free): one mmap
 *                            in each malloc, one munmap in each free
 *   alloc small N            N x (malloc(16..1024, cycling), free)
 *   alloc mixed THREADS N    N/10 malloc/free pairs on the main thread alone
 *                            (serial, small sizes), then THREADS threads of N
 *                            pairs each, started together (parallel), mixed
 *                            sizes, every 100th 1 MiB (glibc mmaps only the
 *                            first: freeing it raises its dynamic threshold)
 *   alloc leak N             N x leak_some() (malloc(100), never freed, at
 *                            the line marked LEAK), each followed by a
 *                            malloc(200)+free (line marked NOLEAK); then
 *                            sleeps 200 ms
 *   alloc dlopen LIB N       dlopen LIB, call its lib_leak(N) (N x 48 bytes
 *                            leaked in the library); then sleeps 1 s
 *   alloc threads T N        T threads, started together, each making N
 *                            malloc/free pairs of 16..1008 bytes and keeping
 *                            every 64th block (malloc(100) at KEEP, never
 *                            freed): the attach tests' multi-threaded load.
 *                            Truth: malloc, free, live_blocks, live_bytes
 *   alloc hold SECONDS       malloc(64)/free pairs for SECONDS, sleeping
 *                            1 ms every 1000 pairs (a process to attach to)
 *   alloc loop N             N x malloc(64)/free as fast as possible; prints
 *                            "ns_per_pair X" on stderr. With the gate the
 *                            same pairs run, uncounted, until SIGUSR1
 *   alloc sizes N            N blocks of sizes spread over 1..40000 bytes,
 *                            every 100th 300000, all kept: every size class
 *                            of every allocator. Truth: live_usable, the
 *                            sum of malloc_usable_size() of the blocks, the
 *                            allocator's own account
 *   alloc chains SECONDS [SPIN]
 *                            allocations through wrappers, for SECONDS: each
 *                            iteration build_index() takes 8192 bytes
 *                            through xmalloc() (CHAIN_INDEX), parse_record()
 *                            twice 1024 through xmalloc() (CHAIN_RECORD),
 *                            grow_tree() 4 x 512 through node_new(), a
 *                            constructor (CHAIN_TREE), fill_cache() 4096
 *                            with malloc itself (CHAIN_CACHE), keeping every
 *                            other one in a ring of 16384; then SPIN rounds
 *                            of hashing (a moderate load; default 0).
 *                            Prints "ns_per_iter X". Truth:
 *                            chain_iterations, cache_live_blocks
 *   alloc split SECONDS      malloc(64)/free pairs for SECONDS from two
 *                            sites: split_a() three times an iteration
 *                            (SPLIT_A), split_b() once, through xmalloc()
 *                            (SPLIT_B): 3/4 of the allocator's time is
 *                            spent for SPLIT_A. Truth: split_iterations
 *   alloc arena SECONDS      for SECONDS, a thread mallocs blocks into a
 *                            ring that two other threads empty and free:
 *                            free locks the arena of the thread that made
 *                            the block, so the three wait for that arena's
 *                            lock. Truth, written at once (a test may
 *                            end the workload): arena_heap, the start of
 *                            that arena's heap (from the first block's
 *                            chunk, with NON_MAIN_ARENA set), arena_lock,
 *                            where the heap's first word (the arena)
 *                            points
 *   alloc work N [HASH]      a moderate, more realistic load: N iterations
 *                            of (malloc 32..512 bytes, fill it, HASH rounds
 *                            of hashing (default 4096, a few microseconds),
 *                            free the block made
 *                            1024 iterations ago); prints "ns_per_iter X".
 *                            With the gate it runs the same iterations,
 *                            uncounted, until SIGUSR1 (a steady rate
 *                            before and after the attach)
 *
 * Every mode prints "ready" (unbuffered) once started, then exits 0.
 * Ground truth goes where truth.h says (WORKLOAD_TRUTH): every mode writes
 * its own calls (malloc, free), and the bytes and blocks it leaves live;
 * with WORKLOAD_GO_SIGNAL=1 the work starts only on SIGUSR1 (attach
 * tests).
 *
 * Exact call counts matter to the tests, so:
 * - every pointer goes through a volatile sink, so the compiler can neither
 *   delete a malloc/free pair nor merge calls;
 * - stdout is unbuffered (stdio allocates no buffer) and nothing but
 *   "ready" is printed until the work is done; block arrays are static;
 * - ready() (called by start()) makes one malloc(1)+free before "ready":
 *   the profiler excludes the first allocation of a launched process
 *   from its latencies (allocator initialisation), so that one is this
 *   warm-up, and the counted mallocs of each mode are exactly those of
 *   its own work.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "truth.h"

#define MAX_BLOCKS 100000

static void *blocks[MAX_BLOCKS];
static void *leaked[MAX_BLOCKS];
static unsigned long leaked_count;
/* Stores and loads through this cannot be optimised away. */
static void *volatile sink;
/* The same, per thread (threads must not share the sink's cache line). */
static __thread void *volatile thread_sink;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
	fprintf(stderr, "usage: alloc reuse N | large N SIZE | small N | mixed THREADS N"
			" | leak N | dlopen LIB N | threads T N | hold SECONDS | loop N | split SECONDS"
			" | work N [HASH]"
			" | sizes N | chains SECONDS [SPIN] | arena SECONDS\n");
	exit(2);
}

static long count_arg(const char *s, long max)
{
	char *end;
	long n = strtol(s, &end, 10);
	if (*end || n < 1 || n > max)
		usage();
	return n;
}

/* The workload's own count of its allocator calls and live blocks (the
 * warm-up in start() excluded). Threads add theirs at the end. */
static unsigned long n_malloc, n_free, live_blocks, live_bytes;

static void counted(unsigned long mallocs, unsigned long frees, unsigned long blocks,
		    unsigned long bytes)
{
	__atomic_fetch_add(&n_malloc, mallocs, __ATOMIC_RELAXED);
	__atomic_fetch_add(&n_free, frees, __ATOMIC_RELAXED);
	__atomic_fetch_add(&live_blocks, blocks, __ATOMIC_RELAXED);
	__atomic_fetch_add(&live_bytes, bytes, __ATOMIC_RELAXED);
}

static void write_truth(void)
{
	truth("malloc", n_malloc);
	truth("free", n_free);
	truth("live_blocks", live_blocks);
	truth("live_bytes", live_bytes);
}

/* Unbuffered stdout, the allocator warmed up, "ready", then (attach
 * tests) the go signal. */
/* Unbuffered stdout, the warm-up allocation, then "ready". */
static void ready(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	sink = malloc(1);
	free(sink);
	fputs("ready\n", stdout);
}

static void start(void)
{
	ready();
	go_gate_wait();
}

static void alloc_reuse(long n)
{
	for (int phase = 0; phase < 2; phase++) {
		for (long i = 0; i < n; i++) {
			sink = malloc(64);
			blocks[i] = sink;
		}
		for (long i = 0; i < n; i++) {
			sink = blocks[i];
			free(sink);
		}
	}
	counted(2 * n, 2 * n, 0, 0);
}

static void alloc_large(long n, long size)
{
	long page = sysconf(_SC_PAGESIZE);
	for (long i = 0; i < n; i++) {
		sink = malloc(size);
		volatile char *p = sink;
		if (!p)
			exit(1);
		for (long off = 0; off < size; off += page)
			p[off] = 1;
		free(sink);
	}
	counted(n, n, 0, 0);
}

static void alloc_small(long n)
{
	for (long i = 0; i < n; i++) {
		sink = malloc(16 + (i % 64) * 16); /* 16, 32, ..., 1024, 16, ... */
		free(sink);
	}
	counted(n, n, 0, 0);
}

/* One malloc/free pair of the mixed mode: mostly small, every 100th 1 MiB. */
static void mixed_pair(long i)
{
	size_t size = i % 100 == 99 ? 1 << 20 : 16 + (size_t)(i % 32) * 24;
	thread_sink = malloc(size);
	char *p = thread_sink;
	if (!p)
		exit(1);
	*(volatile char *)p = 1;
	free(thread_sink);
}

static long mixed_iterations;
static pthread_barrier_t mixed_start;

static void *mixed_thread(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&mixed_start); /* all start together */
	for (long i = 0; i < mixed_iterations; i++)
		mixed_pair(i);
	counted(mixed_iterations, mixed_iterations, 0, 0);
	return NULL;
}

static void alloc_mixed(long threads, long n)
{
	for (long i = 0; i < n / 10; i++)
		mixed_pair(i % 99); /* serial phase: small blocks only */
	counted(n / 10, n / 10, 0, 0);
	mixed_iterations = n;
	if (pthread_barrier_init(&mixed_start, NULL, threads) != 0)
		exit(1);
	pthread_t tids[64];
	for (long t = 0; t < threads; t++)
		if (pthread_create(&tids[t], NULL, mixed_thread, NULL) != 0)
			exit(1);
	for (long t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
}

__attribute__((noinline)) void leak_some(void)
{
	sink = malloc(100); // LEAK
	leaked[leaked_count++] = sink;
}

__attribute__((noinline)) void churn(void)
{
	sink = malloc(200); // NOLEAK
	free(sink);
}

static void alloc_leak(long n)
{
	for (long i = 0; i < n; i++) {
		leak_some();
		churn();
	}
	counted(2 * n, n, n, 100 * n);
	usleep(200 * 1000);
}

static void alloc_dlopen(const char *lib, long n)
{
	void *handle = dlopen(lib, RTLD_NOW);
	if (!handle) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		exit(1);
	}
	void (*lib_leak)(int) = (void (*)(int))dlsym(handle, "lib_leak");
	if (!lib_leak) {
		fprintf(stderr, "dlsym: %s\n", dlerror());
		exit(1);
	}
	lib_leak((int)n);
	counted(n, 0, n, 48 * n);
	/* Left open: the library stays mapped until exit. Alive 1 s more, so
	 * that a loaded profiler still reads the library in the memory map
	 * (naming the sites of a library whose process exits at once is a
	 * known gap: #17). */
	usleep(1000 * 1000);
}

static void alloc_hold(double seconds)
{
	double until = now() + seconds;
	struct timespec ms = {.tv_nsec = 1000 * 1000};
	unsigned long pairs = 0;
	while (now() < until) {
		for (int i = 0; i < 1000; i++) {
			sink = malloc(64);
			free(sink);
		}
		pairs += 1000;
		nanosleep(&ms, NULL);
	}
	counted(pairs, pairs, 0, 0);
}

/* ---- threads ---- */

static long threads_pairs;
static pthread_barrier_t threads_start;

__attribute__((noinline)) void *keep_block(void)
{
	return malloc(100); // KEEP
}

static void *threads_worker(void *arg)
{
	(void)arg;
	unsigned long kept = 0;
	pthread_barrier_wait(&threads_start);
	for (long i = 0; i < threads_pairs; i++) {
		thread_sink = malloc(16 + (size_t)(i % 63) * 16);
		free(thread_sink);
		if (i % 64 == 63) {
			thread_sink = keep_block(); // KEEP_CALL
			kept++;
		}
	}
	counted(threads_pairs + kept, threads_pairs, kept, 100 * kept);
	return NULL;
}

static void alloc_threads(long threads, long n)
{
	threads_pairs = n;
	if (pthread_barrier_init(&threads_start, NULL, threads) != 0)
		exit(1);
	pthread_t tids[64];
	for (long t = 0; t < threads; t++)
		if (pthread_create(&tids[t], NULL, threads_worker, NULL) != 0)
			exit(1);
	for (long t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
}

static int go_pending(void);

/* "loop": n malloc(64)/free pairs. With the gate, the same pairs run
 * (uncounted) from "ready" until the go signal, as in "work": a profiler
 * attaches to a loop already hot. */
static void alloc_loop(long n)
{
	if (go_gate_enabled()) {
		for (long i = 1; i % 4096 != 0 || !go_pending(); i++) {
			sink = malloc(64);
			free(sink);
		}
		go_gate_wait();
	}
	double started = now();
	for (long i = 0; i < n; i++) {
		sink = malloc(64);
		free(sink);
	}
	double elapsed = now() - started;
	counted(n, n, 0, 0);
	/* The pace the loop kept while traced, for a failing count's
	 * message: the calls' untraced cost is at most this. */
	truth("loop_ps_per_pair", (unsigned long)(elapsed * 1e12 / n));
	fprintf(stderr, "ns_per_pair %.1f\n", elapsed * 1e9 / n);
}

static void alloc_sizes(long n)
{
	unsigned long requested = 0, usable = 0;
	for (long i = 0; i < n; i++) {
		size_t size = i % 100 == 99 ? 300000 : 1 + (size_t)(i * 7919) % 40000;
		blocks[i] = malloc(size);
		if (!blocks[i])
			exit(1);
		requested += size;
		usable += malloc_usable_size(blocks[i]);
	}
	counted(n, 0, n, requested);
	truth("live_usable", usable);
}

/* An allocation wrapper: returns malloc's block, aborts on failure. */
__attribute__((noinline)) void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p)
		abort();
	return p;
}

struct node {
	size_t size;
	struct node *next;
};

/* A constructor: allocates, fills in, returns the block. */
__attribute__((noinline)) struct node *node_new(size_t n)
{
	struct node *p = malloc(n);
	if (!p)
		abort();
	p->size = n;
	p->next = NULL;
	return p;
}

__attribute__((noinline)) void build_index(void)
{
	sink = xmalloc(8192); // CHAIN_INDEX
	free(sink);
}

__attribute__((noinline)) void parse_record(void)
{
	sink = xmalloc(1024); // CHAIN_RECORD
	free(sink);
}

__attribute__((noinline)) void grow_tree(void)
{
	sink = node_new(512); // CHAIN_TREE
	free(sink);
}

enum { CACHE_RING = 16384 };
static void *cache[CACHE_RING];

__attribute__((noinline)) void fill_cache(long i)
{
	sink = malloc(4096); // CHAIN_CACHE
	if (i % 2 == 0) {
		void **slot = &cache[(i / 2) % CACHE_RING];
		free(*slot);
		*slot = sink;
	} else {
		free(sink);
	}
}

static void alloc_chains(double seconds, long spin)
{
	double started = now();
	unsigned long hash = 5381;
	long i = 0;
	while ((i & 63) != 0 || now() - started < seconds) {
		build_index();
		parse_record();
		parse_record();
		for (int j = 0; j < 4; j++)
			grow_tree();
		fill_cache(i);
		for (long k = 0; k < spin; k++)
			hash = hash * 33 + (unsigned long)k;
		i++;
	}
	sink = (void *)hash;
	fprintf(stderr, "ns_per_iter %.1f\n", (now() - started) * 1e9 / (double)i);
	unsigned long live = (unsigned long)((i + 1) / 2);
	if (live > CACHE_RING)
		live = CACHE_RING;
	counted(8 * i, 8 * i - live, live, live * 4096);
	truth("chain_iterations", i);
	truth("cache_live_blocks", live);
}

__attribute__((noinline)) void split_a(void)
{
	sink = malloc(64); free(sink); // SPLIT_A
}

__attribute__((noinline)) void split_b(void)
{
	sink = xmalloc(64); free(sink); // SPLIT_B
}

static void alloc_split(double seconds)
{
	double started = now();
	long i = 0;
	while ((i & 1023) != 0 || now() - started < seconds) {
		split_a();
		split_a();
		split_a();
		split_b();
		i++;
	}
	counted(4 * i, 4 * i, 0, 0);
	truth("split_iterations", i);
}

enum { WORK_LIVE = 1024 };
static void *work_ring[WORK_LIVE];
static unsigned char work_table[4096];
static unsigned long work_hash = 5381;
static long work_rounds = 4096;

/* One step of "work": a malloc, some computing on it, and the free of the
 * block allocated WORK_LIVE steps before (NULL the first time round). */
static void work_step(long i)
{
	size_t size = 32 + (size_t)(i * 37) % 480;
	unsigned char *p = malloc(size);
	memset(p, (int)i, size);
	for (long j = 0; j < work_rounds; j++)
		work_hash = work_hash * 33 + work_table[(work_hash + j) & 4095] + p[j % size];
	work_table[i & 4095] = (unsigned char)work_hash;
	free(work_ring[i % WORK_LIVE]);
	work_ring[i % WORK_LIVE] = p;
}

/* Whether SIGUSR1 (blocked by the gate) is pending, without waiting. */
static int go_pending(void)
{
	sigset_t set;
	return sigpending(&set) == 0 && sigismember(&set, SIGUSR1) == 1;
}

/* "work": n steps at a steady rate, then the ring's blocks freed: n
 * mallocs and n + WORK_LIVE frees counted. With the gate, the same steps
 * run (uncounted) from "ready" until the go signal, so a profiler that
 * attaches meanwhile sees the rate it will see all along, as when
 * attaching to a program in its steady state; the counted steps are
 * those after the signal. */
static void alloc_work(long n)
{
	ready();
	if (go_gate_enabled()) {
		for (long i = 0; i % 64 != 0 || !go_pending(); i++)
			work_step(i);
		go_gate_wait();
	}
	double started = now();
	for (long i = 0; i < n; i++)
		work_step(i);
	for (int i = 0; i < WORK_LIVE; i++)
		free(work_ring[i]);
	counted(n, n + WORK_LIVE, 0, 0);
	sink = (void *)work_hash;
	double elapsed = now() - started;
	fprintf(stderr, "ns_per_iter %.1f\n", elapsed * 1e9 / n);
}

#define ARENA_RING 4096
static void *arena_ring[ARENA_RING];
static int arena_stop;
static unsigned long arena_heap, arena_lock;

/* glibc: a chunk's size word holds NON_MAIN_ARENA (4); such a chunk's heap
 * is 64 MiB-aligned and starts with heap_info, whose first word points at
 * the arena (its first field, the lock). */
static void *arena_producer(void *arg)
{
	(void)arg;
	/* Through the sink: the header is glibc's data, which the compiler
	 * would take for bytes malloc left uninitialised. */
	thread_sink = malloc(64);
	unsigned long *first = (unsigned long *)thread_sink;
	unsigned long size = first[-1];
	if (size & 4) {
		arena_heap = (unsigned long)first & ~((64UL << 20) - 1);
		arena_lock = *(unsigned long *)arena_heap;
	}
	truth("arena_heap", arena_heap);
	truth("arena_lock", arena_lock);
	free(first);
	for (unsigned long i = 0; !__atomic_load_n(&arena_stop, __ATOMIC_RELAXED); i++) {
		void *q = malloc(64 + (i % 8) * 16);
		void *old = __atomic_exchange_n(&arena_ring[i % ARENA_RING], q, __ATOMIC_ACQ_REL);
		free(old);
	}
	return NULL;
}

static void *arena_consumer(void *arg)
{
	(void)arg;
	for (unsigned long i = 0; !__atomic_load_n(&arena_stop, __ATOMIC_RELAXED); i++)
		free(__atomic_exchange_n(&arena_ring[i % ARENA_RING], NULL, __ATOMIC_ACQ_REL));
	return NULL;
}

static void alloc_arena(double seconds)
{
	pthread_t t[3];
	pthread_create(&t[0], NULL, arena_producer, NULL);
	for (int i = 1; i < 3; i++)
		pthread_create(&t[i], NULL, arena_consumer, NULL);
	usleep((useconds_t)(seconds * 1e6));
	__atomic_store_n(&arena_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < ARENA_RING; i++)
		free(arena_ring[i]);
}

int main(int argc, char **argv)
{
	if (argc < 3)
		usage();
	const char *mode = argv[1];
	go_gate_arm();
	if (strcmp(mode, "reuse") == 0 && argc == 3) {
		long n = count_arg(argv[2], MAX_BLOCKS);
		start();
		alloc_reuse(n);
	} else if (strcmp(mode, "large") == 0 && argc == 4) {
		long n = count_arg(argv[2], 1L << 30);
		long size = count_arg(argv[3], 1L << 34);
		/* A fixed threshold: glibc's dynamic one would stop mmapping
		 * these after the first free. */
		if (mallopt(M_MMAP_THRESHOLD, 64 * 1024) != 1)
			return 1;
		start();
		alloc_large(n, size);
	} else if (strcmp(mode, "small") == 0 && argc == 3) {
		long n = count_arg(argv[2], 1L << 40);
		start();
		alloc_small(n);
	} else if (strcmp(mode, "mixed") == 0 && argc == 4) {
		long threads = count_arg(argv[2], 64);
		long n = count_arg(argv[3], 1L << 40);
		start();
		alloc_mixed(threads, n);
	} else if (strcmp(mode, "leak") == 0 && argc == 3) {
		long n = count_arg(argv[2], MAX_BLOCKS);
		start();
		alloc_leak(n);
	} else if (strcmp(mode, "dlopen") == 0 && argc == 4) {
		long n = count_arg(argv[3], 1L << 30);
		start();
		alloc_dlopen(argv[2], n);
	} else if (strcmp(mode, "threads") == 0 && argc == 4) {
		long threads = count_arg(argv[2], 64);
		long n = count_arg(argv[3], 1L << 40);
		start();
		alloc_threads(threads, n);
	} else if (strcmp(mode, "hold") == 0 && argc == 3) {
		double seconds = atof(argv[2]);
		if (seconds <= 0)
			usage();
		start();
		alloc_hold(seconds);
	} else if (strcmp(mode, "loop") == 0 && argc == 3) {
		long n = count_arg(argv[2], 1L << 40);
		ready();
		alloc_loop(n);
	} else if (strcmp(mode, "sizes") == 0 && argc == 3) {
		long n = count_arg(argv[2], MAX_BLOCKS);
		start();
		alloc_sizes(n);
	} else if (strcmp(mode, "chains") == 0 && (argc == 3 || argc == 4)) {
		double seconds = atof(argv[2]);
		long spin = argc == 4 ? count_arg(argv[3], 1L << 30) : 0;
		if (seconds <= 0)
			usage();
		start();
		alloc_chains(seconds, spin);
	} else if (strcmp(mode, "split") == 0 && argc == 3) {
		double seconds = atof(argv[2]);
		if (seconds <= 0)
			usage();
		start();
		alloc_split(seconds);
	} else if (strcmp(mode, "arena") == 0 && argc == 3) {
		double seconds = atof(argv[2]);
		if (seconds <= 0)
			usage();
		start();
		alloc_arena(seconds);
	} else if (strcmp(mode, "work") == 0 && (argc == 3 || argc == 4)) {
		long n = count_arg(argv[2], 1L << 40);
		if (argc == 4)
			work_rounds = count_arg(argv[3], 1L << 20);
		alloc_work(n);
	} else {
		usage();
	}
	write_truth();
	return 0;
}
