/*
 * fscorpus: false-sharing kernels in the shapes real code has, each with a
 * known answer, for the corpus of `cargo xtask bench --only sharing`.
 *
 *   fscorpus MODE packed|padded THREADS ITERS [ROUNDS]
 *
 * THREADS workers (1..16) each do ITERS iterations of MODE's loop in all,
 * split over ROUNDS rounds (default 1); every round creates new threads
 * over the same data, as thread pools that re-create their workers per
 * phase do. "packed" lays the per-thread data out as plain code does;
 * "padded" gives each thread's data its own cache line(s), the fix. Prints
 * "ready" on stdout, then "elapsed_ns N" on stderr (first round's start to
 * the last join). Worker i is pinned to CPU i modulo the CPUs online, so
 * the line really moves between caches. Each per-thread loop also reads a
 * private array of longs: a store through a `long *` may alias it, so
 * even at -O2 the accumulators are loaded and stored every iteration, as
 * in real code that sums through pointers. Modes (packed answer):
 *
 *   stats24   pointer chasing: each worker walks its own linked list, looks
 *             each node's key up in its input array and counts into
 *             w->st->{hits,bytes}, a 24-byte struct in one calloc'd array
 *             (the calloc line).                           FALSE, heap
 *   pool40    40-byte job structs in one malloc'd array (the malloc line),
 *             updated by the workers (run it with ROUNDS > 1). FALSE, heap
 *   slots64   64-byte slots after a 48-byte header in the global g_slots:
 *             slot 0's hits and slot 1's value share a line. FALSE, g_slots
 *   rec72     global array g_recs of 72-byte records, hits at 0 and misses
 *             at 64: record 0's misses and record 1's hits share a line.
 *                                                        FALSE, g_recs
 *   accum     one global struct of accumulators g_totals: even workers add
 *             to .produced*, odd ones to .consumed*.     FALSE, g_totals
 *   lookup    all workers read the shared 8-line table g_lookup, eight
 *             probes per iteration; worker 0 writes one entry every 65536
 *             probes (read-mostly).                               nothing
 *   refcount  all workers take and drop a reference on one heap object
 *             (the malloc line) with atomics.              TRUE, heap
 *   forkshare THREADS forked processes increment neighbouring longs of one
 *             MAP_SHARED anonymous mapping (the mmap line).
 *                                                    FALSE, mapped (shared)
 *
 * "padded" has no sharing in any mode but lookup and refcount (which have
 * no padded layout: the flag is ignored). The lines a profiler should name
 * (allocations, hot accesses) carry marker comments named FS_MODE_WHAT,
 * each on its line only.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 16
#define LINE 64
#define ALIGNED __attribute__((aligned(LINE)))
/* Longs in each worker's private input array (a power of two). */
#define IN_LONGS 256
/* Nodes in each worker's list (stats24). */
#define NODES 64

static int g_padded;
static long g_iters; /* per worker and round */
static long *g_in[MAX_THREADS];
static pthread_barrier_t g_start;

/* Bytes from one thread's data to the next: packed size or whole lines. */
static size_t stride(size_t size)
{
	return g_padded ? (size + LINE - 1) / LINE * LINE : size;
}

/* ---- stats24: pointer chasing into a calloc'd array of 24-byte structs */

/* Hot fields first and last: whatever the block's 16-byte alignment, one
 * struct's last hot word and the next one's first share a line. */
struct stats24 {
	long hits;
	long misses;
	long bytes;
};
_Static_assert(sizeof(struct stats24) == 24, "stats24 must be 24 bytes");

struct node {
	struct node *next;
	long key;
};

struct chase {
	struct node *head;
	struct stats24 *st;
};
static struct chase g_chase[MAX_THREADS];

static void setup_stats24(int threads)
{
	char *block;
	if (g_padded)
		block = aligned_alloc(LINE, threads * stride(sizeof(struct stats24))); /* FS_STATS24_PADDED_ALLOC */
	else
		block = calloc(threads, sizeof(struct stats24)); /* FS_STATS24_ALLOC */
	if (!block)
		exit(1);
	memset(block, 0, threads * stride(sizeof(struct stats24)));
	for (int t = 0; t < threads; t++) {
		struct node *nodes = aligned_alloc(LINE, NODES * sizeof(struct node));
		if (!nodes)
			exit(1);
		for (int i = 0; i < NODES; i++)
			nodes[i].key = i * 3 + t;
		/* A permutation walk: node k links to (37k+1) mod 64, and the
		 * walk ends after NODES steps at the node that links to NULL. */
		for (int i = 0, k = 0; i < NODES; i++) {
			int next = (k * 37 + 1) % NODES;
			nodes[k].next = i + 1 < NODES ? &nodes[next] : NULL;
			k = next;
		}
		g_chase[t].head = &nodes[0];
		g_chase[t].st = (struct stats24 *)(block + t * stride(sizeof(struct stats24)));
	}
}

static void run_stats24(int id)
{
	struct chase *w = &g_chase[id];
	const long *in = g_in[id];
	for (long done = 0; done < g_iters; done += NODES)
		for (struct node *n = w->head; n; n = n->next) {
			w->st->hits++;                                  /* FS_STATS24_HITS */
			w->st->bytes += in[n->key & (IN_LONGS - 1)];    /* FS_STATS24_BYTES */
		}
}

/* ---- pool40: a malloc'd array of 40-byte job structs, re-created workers */

/* As stats24: hot fields first and last, so neighbours always share. */
struct job40 {
	long done;
	int id;
	int state;
	char name[16];
	long sum;
};
_Static_assert(sizeof(struct job40) == 40, "job40 must be 40 bytes");
static char *g_jobs;

static void setup_pool40(int threads)
{
	if (g_padded)
		g_jobs = aligned_alloc(LINE, threads * stride(sizeof(struct job40))); /* FS_POOL40_PADDED_ALLOC */
	else
		g_jobs = malloc(threads * sizeof(struct job40)); /* FS_POOL40_ALLOC */
	if (!g_jobs)
		exit(1);
	memset(g_jobs, 0, threads * stride(sizeof(struct job40)));
}

static void run_pool40(int id)
{
	struct job40 *j = (struct job40 *)(g_jobs + id * stride(sizeof(struct job40)));
	const long *in = g_in[id];
	j->state = 1;
	for (long i = 0; i < g_iters; i++) {
		j->sum += in[i & (IN_LONGS - 1)]; /* FS_POOL40_SUM */
		j->done++;                        /* FS_POOL40_DONE */
	}
	j->state = 2;
}

/* ---- slots64: 64-byte slots after a 48-byte header, in one global */

struct slot64 {
	long key;
	long value;
	long hits;
	long spare[5];
};
_Static_assert(sizeof(struct slot64) == 64, "slot64 must be 64 bytes");

struct slot_table {
	long count, capacity, seed, flags, generation, reserved;
	struct slot64 s[MAX_THREADS];
};
struct slot_table g_slots ALIGNED; /* FS_SLOTS64_GLOBAL */
struct slot64 g_slots_padded[MAX_THREADS] ALIGNED;

static void run_slots64(int id)
{
	struct slot64 *s = g_padded ? &g_slots_padded[id] : &g_slots.s[id];
	const long *in = g_in[id];
	for (long i = 0; i < g_iters; i++) {
		s->value += in[i & (IN_LONGS - 1)]; /* FS_SLOTS64_VALUE */
		s->hits++;                          /* FS_SLOTS64_HITS */
	}
}

/* ---- rec72: a global array of 72-byte records */

struct rec72 {
	long hits;
	char name[56];
	long misses;
};
_Static_assert(sizeof(struct rec72) == 72, "rec72 must be 72 bytes");
struct rec72 g_recs[MAX_THREADS] ALIGNED; /* FS_REC72_GLOBAL */

struct rec72_padded {
	struct rec72 r;
} __attribute__((aligned(128)));
struct rec72_padded g_recs_padded[MAX_THREADS];

static void run_rec72(int id)
{
	struct rec72 *r = g_padded ? &g_recs_padded[id].r : &g_recs[id];
	const long *in = g_in[id];
	for (long i = 0; i < g_iters; i++) {
		long v = in[i & (IN_LONGS - 1)];
		if (v & 1)
			r->misses++; /* FS_REC72_MISSES */
		else
			r->hits++; /* FS_REC72_HITS */
	}
}

/* ---- accum: one global struct of accumulators */

struct totals {
	long produced;
	long produced_bytes;
	long consumed;
	long consumed_bytes;
};
struct totals g_totals ALIGNED; /* FS_ACCUM_GLOBAL */

struct totals_padded {
	long produced;
	long produced_bytes;
	long consumed ALIGNED;
	long consumed_bytes;
};
struct totals_padded g_totals_padded ALIGNED;

static void run_accum(int id)
{
	long *count, *bytes;
	if (g_padded) {
		count = id % 2 ? &g_totals_padded.consumed : &g_totals_padded.produced;
		bytes = id % 2 ? &g_totals_padded.consumed_bytes : &g_totals_padded.produced_bytes;
	} else {
		count = id % 2 ? &g_totals.consumed : &g_totals.produced;
		bytes = id % 2 ? &g_totals.consumed_bytes : &g_totals.produced_bytes;
	}
	const long *in = g_in[id];
	for (long i = 0; i < g_iters; i++) {
		*count += 1;                        /* FS_ACCUM_COUNT */
		*bytes += in[i & (IN_LONGS - 1)];   /* FS_ACCUM_BYTES */
	}
}

/* ---- lookup: a read-mostly shared table */

long g_lookup[64] ALIGNED; /* FS_LOOKUP_GLOBAL */
struct {
	long value;
	char pad[LINE - sizeof(long)];
} g_lookup_sums[MAX_THREADS] ALIGNED;

static void run_lookup(int id)
{
	volatile long *table = g_lookup;
	unsigned long h = 0x9e3779b97f4a7c15ul * (id + 1);
	long sum = 0;
	for (long i = 0; i < g_iters; i += 8) {
		h = h * 6364136223846793005ul + 1442695040888963407ul;
		unsigned idx = h >> 58;
		/* Eight probes per hash, one on each line of the table. */
		for (unsigned k = 0; k < 64; k += 8)
			sum += table[(idx + k) & 63]; /* FS_LOOKUP_READ */
		if (id == 0 && (i & 0xffff) == 0)
			table[(i >> 16) & 63] = i; /* FS_LOOKUP_WRITE */
	}
	g_lookup_sums[id].value = sum;
}

/* ---- refcount: one heap object's reference count, taken by all */

struct session {
	long refcnt;
	long id;
	char name[48];
};
static struct session *g_session;
static long g_session_uses[MAX_THREADS * 8];

static void run_refcount(int id)
{
	struct session *s = g_session;
	long uses = 0;
	for (long i = 0; i < g_iters; i++) {
		__atomic_add_fetch(&s->refcnt, 1, __ATOMIC_ACQUIRE); /* FS_REFCOUNT_GET */
		uses += s->id;
		__atomic_sub_fetch(&s->refcnt, 1, __ATOMIC_RELEASE); /* FS_REFCOUNT_PUT */
	}
	g_session_uses[id * 8] = uses;
}

/* ---- the modes, the threads and the processes */

struct mode {
	const char *name;
	void (*setup)(int threads);
	void (*run)(int id);
};

static void setup_none(int threads)
{
	(void)threads;
}

static void setup_refcount(int threads)
{
	(void)threads;
	g_session = malloc(sizeof *g_session); /* FS_REFCOUNT_ALLOC */
	if (!g_session)
		exit(1);
	memset(g_session, 0, sizeof *g_session);
	g_session->id = 7;
}

static const struct mode MODES[] = {
	{"stats24", setup_stats24, run_stats24},
	{"pool40", setup_pool40, run_pool40},
	{"slots64", setup_none, run_slots64},
	{"rec72", setup_none, run_rec72},
	{"accum", setup_none, run_accum},
	{"lookup", setup_none, run_lookup},
	{"refcount", setup_refcount, run_refcount},
};
static const struct mode *g_mode;

static void pin(int id)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	if (cpus > 1) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(id % cpus, &set);
		sched_setaffinity(0, sizeof set, &set);
	}
}

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	pin(id);
	pthread_barrier_wait(&g_start);
	g_mode->run(id);
	return NULL;
}

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void make_inputs(int threads)
{
	for (int t = 0; t < threads; t++) {
		g_in[t] = aligned_alloc(LINE, IN_LONGS * sizeof(long));
		if (!g_in[t])
			exit(1);
		for (int i = 0; i < IN_LONGS; i++)
			g_in[t][i] = (i * 2654435761u + t) % 1000;
	}
}

static double run_threads(int threads, int rounds)
{
	double start = now_ns();
	for (int r = 0; r < rounds; r++) {
		pthread_t tids[MAX_THREADS];
		pthread_barrier_init(&g_start, NULL, threads);
		for (int i = 0; i < threads; i++)
			if (pthread_create(&tids[i], NULL, worker, (void *)(intptr_t)i))
				exit(1);
		for (int i = 0; i < threads; i++)
			pthread_join(tids[i], NULL);
		pthread_barrier_destroy(&g_start);
	}
	return now_ns() - start;
}

/* forkshare: processes, not threads, on one MAP_SHARED mapping. */
static double run_forkshare(int procs, int rounds)
{
	char *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0); /* FS_FORKSHARE_MAP */
	if (map == MAP_FAILED)
		exit(1);
	/* The start gate lives on its own line, far from the counters. */
	volatile int *ready = (volatile int *)(map + 2048);
	volatile int *go = (volatile int *)(map + 2048 + LINE);
	double start = now_ns();
	for (int r = 0; r < rounds; r++) {
		*ready = 0;
		*go = 0;
		pid_t pids[MAX_THREADS];
		for (int i = 0; i < procs; i++) {
			pids[i] = fork();
			if (pids[i] < 0)
				exit(1);
			if (pids[i] == 0) {
				pin(i);
				volatile long *c = (volatile long *)(map + i * (g_padded ? LINE : sizeof(long)));
				__atomic_add_fetch(ready, 1, __ATOMIC_SEQ_CST);
				while (!*go)
					;
				for (long k = 0; k < g_iters; k++)
					(*c)++; /* FS_FORKSHARE_WRITE */
				_exit(0);
			}
		}
		while (*ready < procs)
			;
		*go = 1;
		for (int i = 0; i < procs; i++)
			waitpid(pids[i], NULL, 0);
	}
	return now_ns() - start;
}

static int usage(void)
{
	fprintf(stderr, "usage: fscorpus stats24|pool40|slots64|rec72|accum|lookup|refcount|forkshare "
			"packed|padded THREADS ITERS [ROUNDS]\n");
	return 2;
}

int main(int argc, char **argv)
{
	if (argc < 5 || argc > 6)
		return usage();
	if (strcmp(argv[2], "packed") && strcmp(argv[2], "padded"))
		return usage();
	g_padded = !strcmp(argv[2], "padded");
	int threads = atoi(argv[3]);
	long iters = atol(argv[4]);
	int rounds = argc == 6 ? atoi(argv[5]) : 1;
	if (threads < 1 || threads > MAX_THREADS || iters < 1 || rounds < 1)
		return usage();
	g_iters = iters / rounds;
	int forkshare = !strcmp(argv[1], "forkshare");
	for (size_t i = 0; i < sizeof MODES / sizeof *MODES; i++)
		if (!strcmp(argv[1], MODES[i].name))
			g_mode = &MODES[i];
	if (!g_mode && !forkshare)
		return usage();
	setvbuf(stdout, NULL, _IONBF, 0);
	double ns;
	if (forkshare) {
		puts("ready");
		ns = run_forkshare(threads, rounds);
	} else {
		make_inputs(threads);
		g_mode->setup(threads);
		puts("ready");
		ns = run_threads(threads, rounds);
	}
	fprintf(stderr, "elapsed_ns %.0f\n", ns);
	return 0;
}
