/*
 * locks: lock workloads with known contention, for memprof-ebpf's lock
 * tests and benchmarks.
 *
 *   locks contended THREADS SECONDS   THREADS threads (started together)
 *                                      loop for SECONDS: lock g_hot_lock
 *                                      (line marked WAIT), ~20 us of busy
 *                                      work inside (HOLD), unlock (RELEASE),
 *                                      ~5 us of work outside. The first
 *                                      thread also takes g_quiet_lock every
 *                                      1000 iterations: never contended.
 *                                      Prints "acquisitions N" on stderr at
 *                                      the end (g_hot_lock acquisitions);
 *                                      truth: hot_acquisitions,
 *                                      quiet_acquisitions, hot_hold_ns (lock
 *                                      returned to unlock called, summed),
 *                                      hot_wait_ns (time inside the lock
 *                                      calls, summed).
 *   locks bursty THREADS SECONDS      as contended, in bursts: each second,
 *                                      300 ms of that loop, then the threads
 *                                      sleep to the next second (a program
 *                                      whose call rate between the profiler's
 *                                      windows is not the rate in them).
 *                                      Same output and truth as contended.
 *   locks condvar SECONDS              producer/consumer on g_queue_lock +
 *                                      g_queue_cond: the producer pushes an
 *                                      item every 1 ms (nanosleep between),
 *                                      the consumer waits on the condvar
 *                                      (CONDWAIT). The producer signals after
 *                                      unlocking, so the mutex is essentially
 *                                      uncontended: the waiting is condvar
 *                                      waiting. Prints "consumed N" on stderr;
 *                                      truth: cond_waits (pthread_cond_wait
 *                                      calls), queue_acquisitions.
 *   locks rwlock SECONDS               g_table_lock: one writer takes the
 *                                      write lock for ~2 ms every ~10 ms
 *                                      (WRLOCK); two readers take the read
 *                                      lock briefly (RDLOCK), sleeping
 *                                      ~100 us between, and are blocked by
 *                                      the writer. Prints "reads N writes N"
 *                                      on stderr.
 *   locks many LOCKS THREADS PASSES    LOCKS mutexes in g_many_locks[], each
 *                                      on its own line; THREADS threads walk
 *                                      them PASSES times, meeting before
 *                                      each lock, so each is wanted by all
 *                                      at once (~2 us held): contention
 *                                      spread over LOCKS objects.
 *                                      Truth: many_locks, many_acquisitions.
 *   locks uncontended N                one thread, N x (lock g_solo_lock,
 *                                      tiny work, unlock); prints
 *                                      "ns_per_cs X" on stderr
 *   locks contended_bench THREADS N    as contended, but N acquisitions per
 *                                      thread, ~1 us inside and ~0.25 us
 *                                      outside; prints "ns_per_cs X" (wall
 *                                      time per acquisition, all threads) on
 *                                      stderr
 *   locks yield THREADS SECONDS        THREADS threads loop for SECONDS: lock
 *                                      g_hot_lock (YIELDLOCK), sched_yield()
 *                                      while holding it, unlock: the holder
 *                                      gives up its CPU, so the others wait
 *                                      on the futex nearly every round (and
 *                                      the futex calls run at a high rate).
 *                                      Prints "rounds_per_s X" on stderr;
 *                                      truth: yield_rounds, hot_wait_ns
 *                                      (time inside pthread_mutex_lock).
 *   locks slowholder THREADS SECONDS   g_slow_lock: one thread (slow_holder)
 *                                      takes it (SLOWLOCK) and holds it ~1 ms
 *                                      every 10 ms; THREADS-1 threads
 *                                      (fast_taker) take it (FASTLOCK) for a
 *                                      few ns, sleeping ~50 us between. Nearly
 *                                      all the waiting is caused by the slow
 *                                      holder's section. Truth: slow_sections,
 *                                      fast_sections, slow_hold_ns,
 *                                      fast_wait_ns (time in the fast takers'
 *                                      lock calls).
 *   locks kwait THREADS SECONDS        THREADS threads map, touch, mprotect
 *                                      and unmap anonymous memory in a loop
 *                                      (churn_maps, called from kwait_loop):
 *                                      each of those calls takes the
 *                                      process's mmap_lock for writing, so
 *                                      they wait on a KERNEL lock (the mm's
 *                                      rwsem), not on a futex. Truth:
 *                                      kwait_rounds.
 *   locks roundrobin COUNT THREADS SECONDS
 *                                      COUNT mutexes in a heap array
 *                                      (g_rr_slots), taken in turn by THREADS
 *                                      threads for SECONDS (ROUNDROBIN), each
 *                                      for ~200 ns: threads meet on one when
 *                                      one is preempted holding it, so the
 *                                      contention is spread over the array.
 *                                      Prints "rounds_per_s X"; truth:
 *                                      rr_locks, rr_acquisitions.
 *
 * Every mode prints "ready" (unbuffered) once started, then exits 0.
 * Ground truth goes where truth.h says (WORKLOAD_TRUTH); with
 * WORKLOAD_GO_SIGNAL=1 the work starts only on SIGUSR1 (attach tests).
 * The locks are globals with distinctive names: the profiler names a lock
 * by the symbol that contains its address. They are non-static (global
 * symbols) and each on its own cache line. Lines marked with comments are
 * the ones the tests expect as waiter and holder sites; the lock and
 * unlock calls stand alone on them.
 *
 * Busy work spins on clock_gettime (vDSO: no syscall) so its duration holds
 * on any CPU; the only futex calls are those of the locks themselves (and
 * thread start and join).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "truth.h"

#define MAX_THREADS 256
#define ALIGNED __attribute__((aligned(64)))

pthread_mutex_t g_hot_lock ALIGNED = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_quiet_lock ALIGNED = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_queue_lock ALIGNED = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_queue_cond ALIGNED = PTHREAD_COND_INITIALIZER;
pthread_rwlock_t g_table_lock ALIGNED = PTHREAD_RWLOCK_INITIALIZER;
pthread_mutex_t g_solo_lock ALIGNED = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_slow_lock ALIGNED = PTHREAD_MUTEX_INITIALIZER;

/* What the locks protect. */
static unsigned long hot_counter ALIGNED;
static unsigned long quiet_counter ALIGNED;
static long queue_items ALIGNED;
static int queue_done;
static unsigned long table[64] ALIGNED;
static volatile unsigned long solo_counter ALIGNED;
/* Stores to this cannot be optimised away. */
static volatile unsigned long sink;

/* Results of the threads, added at the end. */
static unsigned long total_acquisitions;
static unsigned long total_reads;
static unsigned long quiet_acquisitions;
static unsigned long hot_hold_ns;
static unsigned long hot_wait_ns;
static unsigned long cond_waits;
static unsigned long queue_acquisitions;

#define MAX_MANY 100000
struct padded_mutex {
	pthread_mutex_t lock;
} ALIGNED;
struct padded_mutex g_many_locks[MAX_MANY];
static unsigned long many_acquisitions;

static pthread_barrier_t start_line;

/* bursty: the loop runs the first g_burst_ns of each second from
 * g_burst_epoch (0: no bursts). */
#define BURST_PERIOD_NS 1000000000L
static long g_burst_ns;
static long g_burst_epoch;

static long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Busy work for about `ns` nanoseconds. */
__attribute__((noinline)) void busy_ns(long ns)
{
	volatile unsigned long acc = 0;
	long until = now_ns() + ns;
	while (now_ns() < until)
		for (int i = 0; i < 16; i++)
			acc += i;
}

static void sleep_ns(long ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L};
	nanosleep(&ts, NULL);
}

/* bursty: past the current second's burst, sleep to the next second. */
static void idle_between_bursts(void)
{
	long phase = (now_ns() - g_burst_epoch) % BURST_PERIOD_NS;
	if (phase >= g_burst_ns)
		sleep_ns(BURST_PERIOD_NS - phase);
}

static void usage(void)
{
	fprintf(stderr, "usage: locks contended THREADS SECONDS | bursty THREADS SECONDS"
			" | condvar SECONDS | rwlock SECONDS"
			" | many LOCKS THREADS PASSES | uncontended N | contended_bench THREADS N"
			" | yield THREADS SECONDS | slowholder THREADS SECONDS | kwait THREADS SECONDS"
			" | roundrobin COUNT THREADS SECONDS | table THREADS SECONDS\n");
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

static double seconds_arg(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (*end || !(v > 0) || v > 3600)
		usage();
	return v;
}

/* Unbuffered stdout, then "ready", then (attach tests) the go signal. */
static void start(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	fputs("ready\n", stdout);
	go_gate_wait();
}

/* Starts `threads` threads running `fn(arg)` and waits for them. */
static void run_threads(long threads, void *(*fn)(void *), void *args, size_t arg_size)
{
	pthread_t tids[MAX_THREADS];
	if (pthread_barrier_init(&start_line, NULL, threads) != 0)
		exit(1);
	for (long t = 0; t < threads; t++)
		if (pthread_create(&tids[t], NULL, fn, (char *)args + t * arg_size) != 0)
			exit(1);
	for (long t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	pthread_barrier_destroy(&start_line);
}

/* ---- contended, contended_bench ---- */

struct worker {
	long until_ns;   /* stop at this time (contended) ... */
	long count;      /* ... or after this many acquisitions (bench) */
	long hold_ns;    /* busy work inside the critical section */
	long outside_ns; /* busy work between critical sections */
	int quiet;       /* also take g_quiet_lock every 1000 iterations */
} ALIGNED;

__attribute__((noinline)) long contend_hot(const struct worker *w, long *quiet, long *held,
					    long *waited)
{
	long done = 0;
	while (w->count ? done < w->count : now_ns() < w->until_ns) {
		long asked = now_ns();
		pthread_mutex_lock(&g_hot_lock); // WAIT
		long got = now_ns();
		busy_ns(w->hold_ns); // HOLD
		hot_counter++;
		long released = now_ns();
		pthread_mutex_unlock(&g_hot_lock); // RELEASE
		*waited += got - asked;
		*held += released - got;
		done++;
		if (w->quiet && done % 1000 == 0) {
			pthread_mutex_lock(&g_quiet_lock); // QUIET
			quiet_counter++;
			pthread_mutex_unlock(&g_quiet_lock);
			++*quiet;
		}
		busy_ns(w->outside_ns); // OUTSIDE
		if (g_burst_ns)
			idle_between_bursts();
	}
	return done;
}

static void *contend_thread(void *arg)
{
	long quiet = 0, held = 0, waited = 0;
	pthread_barrier_wait(&start_line);
	long done = contend_hot(arg, &quiet, &held, &waited);
	__atomic_fetch_add(&total_acquisitions, done, __ATOMIC_RELAXED);
	__atomic_fetch_add(&quiet_acquisitions, quiet, __ATOMIC_RELAXED);
	__atomic_fetch_add(&hot_hold_ns, held, __ATOMIC_RELAXED);
	__atomic_fetch_add(&hot_wait_ns, waited, __ATOMIC_RELAXED);
	return NULL;
}

static void locks_contended(long threads, long until_ns, long count, long hold_ns, long outside_ns)
{
	struct worker workers[MAX_THREADS];
	for (long t = 0; t < threads; t++)
		workers[t] = (struct worker){
			.until_ns = until_ns,
			.count = count,
			.hold_ns = hold_ns,
			.outside_ns = outside_ns,
			.quiet = t == 0,
		};
	run_threads(threads, contend_thread, workers, sizeof workers[0]);
	if (hot_counter != total_acquisitions) {
		fprintf(stderr, "counter %lu != acquisitions %lu\n", hot_counter, total_acquisitions);
		exit(1);
	}
	truth("hot_acquisitions", total_acquisitions);
	truth("quiet_acquisitions", quiet_acquisitions);
	truth("hot_hold_ns", hot_hold_ns);
	truth("hot_wait_ns", hot_wait_ns);
}

/* ---- many ---- */

static long many_count;
static long many_passes;
static long many_threads;
static long many_arrived;
static long many_phase;

/* All threads meet here before each lock, so that every lock is wanted by
 * all of them at once (left alone, they would fall into step, one lock
 * apart, and never wait). */
static void many_meet(void)
{
	long phase = __atomic_load_n(&many_phase, __ATOMIC_ACQUIRE);
	if (__atomic_add_fetch(&many_arrived, 1, __ATOMIC_ACQ_REL) == many_threads) {
		__atomic_store_n(&many_arrived, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&many_phase, phase + 1, __ATOMIC_RELEASE);
	} else {
		while (__atomic_load_n(&many_phase, __ATOMIC_ACQUIRE) == phase)
			;
	}
}

__attribute__((noinline)) long walk_many(void)
{
	long done = 0;
	for (long pass = 0; pass < many_passes; pass++) {
		for (long i = 0; i < many_count; i++) {
			many_meet();
			pthread_mutex_lock(&g_many_locks[i].lock); // MANY
			busy_ns(2000);
			pthread_mutex_unlock(&g_many_locks[i].lock);
			done++;
		}
	}
	return done;
}

static void *many_thread(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&start_line);
	__atomic_fetch_add(&many_acquisitions, walk_many(), __ATOMIC_RELAXED);
	return NULL;
}

static void locks_many(long count, long threads, long passes)
{
	many_count = count;
	many_threads = threads;
	many_passes = passes;
	for (long i = 0; i < count; i++)
		pthread_mutex_init(&g_many_locks[i].lock, NULL);
	run_threads(threads, many_thread, NULL, 0);
	truth("many_locks", count);
	truth("many_acquisitions", many_acquisitions);
}

/* ---- condvar ---- */

static long condvar_until_ns;

__attribute__((noinline)) long produce(void)
{
	long produced = 0;
	while (now_ns() < condvar_until_ns) {
		pthread_mutex_lock(&g_queue_lock); // PRODUCE
		queue_acquisitions++;
		queue_items++;
		pthread_mutex_unlock(&g_queue_lock);
		/* Signalled after unlocking: the woken consumer finds the mutex
		 * free. */
		pthread_cond_signal(&g_queue_cond); // SIGNAL
		produced++;
		sleep_ns(1000 * 1000);
	}
	pthread_mutex_lock(&g_queue_lock);
	queue_acquisitions++;
	queue_done = 1;
	pthread_mutex_unlock(&g_queue_lock);
	pthread_cond_broadcast(&g_queue_cond);
	return produced;
}

__attribute__((noinline)) long consume(void)
{
	long consumed = 0;
	pthread_mutex_lock(&g_queue_lock); // CONSUME
	queue_acquisitions++;
	for (;;) {
		while (queue_items == 0 && !queue_done) {
			pthread_cond_wait(&g_queue_cond, &g_queue_lock); // CONDWAIT
			cond_waits++;
		}
		if (queue_items == 0)
			break; /* done, and drained */
		queue_items--;
		consumed++;
		pthread_mutex_unlock(&g_queue_lock);
		busy_ns(2000); /* handle the item */
		pthread_mutex_lock(&g_queue_lock);
		queue_acquisitions++;
	}
	pthread_mutex_unlock(&g_queue_lock);
	return consumed;
}

static void *consumer_thread(void *arg)
{
	*(long *)arg = consume();
	return NULL;
}

static void locks_condvar(double seconds)
{
	condvar_until_ns = now_ns() + (long)(seconds * 1e9);
	long consumed = 0;
	pthread_t consumer;
	if (pthread_create(&consumer, NULL, consumer_thread, &consumed) != 0)
		exit(1);
	long produced = produce();
	pthread_join(consumer, NULL);
	if (consumed != produced) {
		fprintf(stderr, "produced %ld, consumed %ld\n", produced, consumed);
		exit(1);
	}
	fprintf(stderr, "consumed %ld\n", consumed);
	truth("cond_waits", cond_waits);
	truth("queue_acquisitions", queue_acquisitions);
}

/* ---- rwlock ---- */

static long rwlock_until_ns;

__attribute__((noinline)) long write_table(void)
{
	long writes = 0;
	while (now_ns() < rwlock_until_ns) {
		pthread_rwlock_wrlock(&g_table_lock); // WRLOCK
		for (int i = 0; i < 64; i++)
			table[i]++;
		busy_ns(2 * 1000 * 1000);
		pthread_rwlock_unlock(&g_table_lock); // WRUNLOCK
		writes++;
		sleep_ns(8 * 1000 * 1000);
	}
	return writes;
}

__attribute__((noinline)) long read_table(void)
{
	long reads = 0;
	unsigned long sum = 0;
	while (now_ns() < rwlock_until_ns) {
		pthread_rwlock_rdlock(&g_table_lock); // RDLOCK
		for (int i = 0; i < 64; i++)
			sum += table[i];
		busy_ns(1000);
		pthread_rwlock_unlock(&g_table_lock); // RDUNLOCK
		reads++;
		sleep_ns(100 * 1000);
	}
	sink = sum; /* the reads are used */
	return reads;
}

static void *rwlock_thread(void *arg)
{
	long writer = *(long *)arg;
	pthread_barrier_wait(&start_line);
	if (writer) {
		*(long *)arg = write_table();
	} else {
		long reads = read_table();
		__atomic_fetch_add(&total_reads, reads, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void locks_rwlock(double seconds)
{
	rwlock_until_ns = now_ns() + (long)(seconds * 1e9);
	/* One slot per thread; cache-line apart. */
	long roles[3 * 8] = {[0] = 1, [8] = 0, [16] = 0};
	run_threads(3, rwlock_thread, roles, 8 * sizeof roles[0]);
	fprintf(stderr, "reads %lu writes %ld\n", total_reads, roles[0]);
	truth("reads", total_reads);
	truth("writes", (unsigned long)roles[0]);
}

/* ---- uncontended ---- */

__attribute__((noinline)) void solo(long n)
{
	for (long i = 0; i < n; i++) {
		pthread_mutex_lock(&g_solo_lock); // SOLO
		solo_counter++;
		pthread_mutex_unlock(&g_solo_lock);
	}
}

static void locks_uncontended(long n)
{
	long started = now_ns();
	solo(n);
	fprintf(stderr, "ns_per_cs %.1f\n", (double)(now_ns() - started) / n);
}

/* ---- yield ---- */

struct timed {
	long until_ns;
	unsigned long done; /* result */
} ALIGNED;

/* Lock, give up the CPU while holding the lock, unlock: whoever runs next
 * finds the lock taken and waits on its futex, so nearly every round is a
 * futex wait and a futex wake. */
__attribute__((noinline)) unsigned long yield_loop(long until_ns, long *waited)
{
	unsigned long rounds = 0;
	long now;
	while ((now = now_ns()) < until_ns) {
		pthread_mutex_lock(&g_hot_lock); // YIELDLOCK
		*waited += now_ns() - now;
		hot_counter++;
		sched_yield();
		pthread_mutex_unlock(&g_hot_lock); // YIELDUNLOCK
		rounds++;
	}
	return rounds;
}

static void *yield_thread(void *arg)
{
	struct timed *t = arg;
	long waited = 0;
	pthread_barrier_wait(&start_line);
	t->done = yield_loop(t->until_ns, &waited);
	__atomic_fetch_add(&hot_wait_ns, waited, __ATOMIC_RELAXED);
	return NULL;
}

/* Runs `threads` threads of `fn` (a `struct timed` each) for `seconds`;
 * returns their rounds, summed, and prints the rate. */
static unsigned long run_timed(long threads, void *(*fn)(void *), double seconds)
{
	struct timed slots[MAX_THREADS];
	long started = now_ns();
	for (long t = 0; t < threads; t++)
		slots[t] = (struct timed){.until_ns = started + (long)(seconds * 1e9)};
	run_threads(threads, fn, slots, sizeof slots[0]);
	double elapsed = (double)(now_ns() - started) / 1e9;
	unsigned long rounds = 0;
	for (long t = 0; t < threads; t++)
		rounds += slots[t].done;
	fprintf(stderr, "rounds %lu\n", rounds);
	fprintf(stderr, "rounds_per_s %.0f\n", (double)rounds / elapsed);
	return rounds;
}

static void locks_yield(long threads, double seconds)
{
	unsigned long rounds = run_timed(threads, yield_thread, seconds);
	if (hot_counter != rounds) {
		fprintf(stderr, "counter %lu != rounds %lu\n", hot_counter, rounds);
		exit(1);
	}
	truth("yield_rounds", rounds);
	truth("hot_wait_ns", hot_wait_ns);
}

/* ---- slowholder ---- */

static long slow_until_ns;
static unsigned long slow_counter ALIGNED;
static unsigned long slow_sections;
static unsigned long slow_hold_ns;
static unsigned long fast_sections;
static unsigned long fast_wait_ns;

/* Every 10 ms: takes g_slow_lock and holds it ~1 ms. */
__attribute__((noinline)) void slow_holder(void)
{
	long next = now_ns();
	while (now_ns() < slow_until_ns) {
		pthread_mutex_lock(&g_slow_lock); // SLOWLOCK
		long got = now_ns();
		busy_ns(1000 * 1000);
		slow_counter++;
		long released = now_ns();
		pthread_mutex_unlock(&g_slow_lock); // SLOWUNLOCK
		slow_sections++;
		slow_hold_ns += released - got;
		next += 10 * 1000 * 1000;
		long left = next - now_ns();
		if (left > 0)
			sleep_ns(left);
	}
}

/* Takes g_slow_lock for a moment, sleeps ~50 us, again. */
__attribute__((noinline)) void fast_taker(unsigned long *sections, unsigned long *waited)
{
	while (now_ns() < slow_until_ns) {
		long asked = now_ns();
		pthread_mutex_lock(&g_slow_lock); // FASTLOCK
		long got = now_ns();
		slow_counter++;
		pthread_mutex_unlock(&g_slow_lock); // FASTUNLOCK
		++*sections;
		*waited += got - asked;
		sleep_ns(50 * 1000);
	}
}

static void *slowholder_thread(void *arg)
{
	long role = *(long *)arg;
	pthread_barrier_wait(&start_line);
	if (role == 0) {
		slow_holder();
	} else {
		unsigned long sections = 0, waited = 0;
		fast_taker(&sections, &waited);
		__atomic_fetch_add(&fast_sections, sections, __ATOMIC_RELAXED);
		__atomic_fetch_add(&fast_wait_ns, waited, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void locks_slowholder(long threads, double seconds)
{
	slow_until_ns = now_ns() + (long)(seconds * 1e9);
	/* One role per thread, cache-line apart: 0 is the slow holder. */
	long roles[MAX_THREADS * 8];
	for (long t = 0; t < threads; t++)
		roles[t * 8] = t;
	run_threads(threads, slowholder_thread, roles, 8 * sizeof roles[0]);
	if (slow_counter != slow_sections + fast_sections) {
		fprintf(stderr, "counter %lu != sections %lu\n", slow_counter,
			slow_sections + fast_sections);
		exit(1);
	}
	fprintf(stderr, "slow %lu fast %lu\n", slow_sections, fast_sections);
	truth("slow_sections", slow_sections);
	truth("fast_sections", fast_sections);
	truth("slow_hold_ns", slow_hold_ns);
	truth("fast_wait_ns", fast_wait_ns);
}

/* ---- kwait ---- */

#define KWAIT_BYTES (64 * 1024)

/* Maps 64 KiB, touches each page, makes it read-only and unmaps it: mmap,
 * mprotect and munmap each take the mm's mmap_lock for writing, which the
 * other threads hold as often: they wait in the kernel. */
__attribute__((noinline)) void churn_maps(void)
{
	int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
	char *p = mmap(NULL, KWAIT_BYTES, prot, flags, -1, 0); // KWAITMMAP
	if (p == MAP_FAILED)
		exit(1);
	for (long i = 0; i < KWAIT_BYTES; i += 4096)
		p[i] = 1;
	if (mprotect(p, KWAIT_BYTES, PROT_READ) != 0) // KWAITMPROTECT
		exit(1);
	sink = p[0];
	munmap(p, KWAIT_BYTES); // KWAITMUNMAP
}

__attribute__((noinline)) unsigned long kwait_loop(long until_ns)
{
	unsigned long rounds = 0;
	while (now_ns() < until_ns) {
		churn_maps(); // KWAITCALL
		rounds++;
	}
	return rounds;
}

static void *kwait_thread(void *arg)
{
	struct timed *t = arg;
	pthread_barrier_wait(&start_line);
	t->done = kwait_loop(t->until_ns);
	return NULL;
}

/* ---- roundrobin ---- */

struct rr_slot {
	pthread_mutex_t lock;
	unsigned long count;
};
struct rr_slot *g_rr_slots;
static long rr_count;

/* Takes every lock of the array in turn, ~200 ns each. */
__attribute__((noinline)) unsigned long walk_round_robin(long until_ns)
{
	unsigned long rounds = 0;
	for (long i = 0; (rounds & 63) || now_ns() < until_ns; i = i + 1 == rr_count ? 0 : i + 1) {
		pthread_mutex_lock(&g_rr_slots[i].lock); // ROUNDROBIN
		g_rr_slots[i].count++;
		for (int k = 0; k < 40; k++)
			sink = k;
		pthread_mutex_unlock(&g_rr_slots[i].lock);
		rounds++;
	}
	return rounds;
}

static void *rr_thread(void *arg)
{
	struct timed *t = arg;
	pthread_barrier_wait(&start_line);
	t->done = walk_round_robin(t->until_ns);
	return NULL;
}

static void locks_roundrobin(long count, long threads, double seconds)
{
	rr_count = count;
	g_rr_slots = calloc(count, sizeof *g_rr_slots);
	if (!g_rr_slots)
		exit(1);
	for (long i = 0; i < count; i++)
		pthread_mutex_init(&g_rr_slots[i].lock, NULL);
	unsigned long rounds = run_timed(threads, rr_thread, seconds);
	unsigned long counted = 0;
	for (long i = 0; i < count; i++)
		counted += g_rr_slots[i].count;
	if (counted != rounds) {
		fprintf(stderr, "counted %lu != rounds %lu\n", counted, rounds);
		exit(1);
	}
	truth("rr_locks", count);
	truth("rr_acquisitions", rounds);
	free(g_rr_slots);
}

/* ---- table ---- */

/* A mutex inside a heap struct, 48 bytes in: a profiler should name it
 * `struct table.lock`, from the pointer the lock call was made from. */
struct table {
	long entries[6];
	pthread_mutex_t lock;
	unsigned long count;
};
struct table *g_table; /* TABLE_DECLARED */

/* Locks the table through a pointer held in a variable, yields while
 * holding it (so the others wait on its futex), unlocks. */
__attribute__((noinline)) unsigned long table_loop(struct table *tb, long until_ns)
{
	unsigned long rounds = 0;
	while (now_ns() < until_ns) {
		pthread_mutex_lock(&tb->lock); // TABLELOCK
		tb->count++;
		sched_yield();
		pthread_mutex_unlock(&tb->lock);
		rounds++;
	}
	return rounds;
}

static void *table_thread(void *arg)
{
	struct timed *t = arg;
	pthread_barrier_wait(&start_line);
	t->done = table_loop(g_table, t->until_ns);
	return NULL;
}

static void locks_table(long threads, double seconds)
{
	g_table = calloc(1, sizeof *g_table); /* TABLE_CALLOC */
	if (!g_table)
		exit(1);
	pthread_mutex_init(&g_table->lock, NULL);
	unsigned long rounds = run_timed(threads, table_thread, seconds);
	if (g_table->count != rounds) {
		fprintf(stderr, "count %lu != rounds %lu\n", g_table->count, rounds);
		exit(1);
	}
	truth("table_rounds", rounds);
	free(g_table);
}

int main(int argc, char **argv)
{
	if (argc < 3)
		usage();
	const char *mode = argv[1];
	go_gate_arm();
	if (strcmp(mode, "contended") == 0 && argc == 4) {
		long threads = count_arg(argv[2], MAX_THREADS);
		double seconds = seconds_arg(argv[3]);
		start();
		locks_contended(threads, now_ns() + (long)(seconds * 1e9), 0, 20 * 1000, 5 * 1000);
		fprintf(stderr, "acquisitions %lu\n", total_acquisitions);
	} else if (strcmp(mode, "bursty") == 0 && argc == 4) {
		long threads = count_arg(argv[2], MAX_THREADS);
		double seconds = seconds_arg(argv[3]);
		start();
		g_burst_ns = 300 * 1000 * 1000;
		g_burst_epoch = now_ns();
		locks_contended(threads, now_ns() + (long)(seconds * 1e9), 0, 20 * 1000, 5 * 1000);
		fprintf(stderr, "acquisitions %lu\n", total_acquisitions);
	} else if (strcmp(mode, "condvar") == 0 && argc == 3) {
		double seconds = seconds_arg(argv[2]);
		start();
		locks_condvar(seconds);
	} else if (strcmp(mode, "rwlock") == 0 && argc == 3) {
		double seconds = seconds_arg(argv[2]);
		start();
		locks_rwlock(seconds);
	} else if (strcmp(mode, "many") == 0 && argc == 5) {
		long count = count_arg(argv[2], MAX_MANY);
		long threads = count_arg(argv[3], MAX_THREADS);
		long passes = count_arg(argv[4], 1000000);
		start();
		locks_many(count, threads, passes);
	} else if (strcmp(mode, "uncontended") == 0 && argc == 3) {
		long n = count_arg(argv[2], 1L << 40);
		start();
		locks_uncontended(n);
	} else if (strcmp(mode, "contended_bench") == 0 && argc == 4) {
		long threads = count_arg(argv[2], MAX_THREADS);
		long n = count_arg(argv[3], 1L << 40);
		start();
		long started = now_ns();
		locks_contended(threads, 0, n, 1000, 250);
		fprintf(stderr, "ns_per_cs %.1f\n",
			(double)(now_ns() - started) / (double)total_acquisitions);
	} else if (strcmp(mode, "yield") == 0 && argc == 4) {
		long threads = count_arg(argv[2], MAX_THREADS);
		double seconds = seconds_arg(argv[3]);
		start();
		locks_yield(threads, seconds);
	} else if (strcmp(mode, "slowholder") == 0 && argc == 4) {
		long threads = count_arg(argv[2], MAX_THREADS);
		double seconds = seconds_arg(argv[3]);
		if (threads < 2)
			usage();
		start();
		locks_slowholder(threads, seconds);
	} else if (strcmp(mode, "kwait") == 0 && argc == 4) {
		long threads = count_arg(argv[2], MAX_THREADS);
		double seconds = seconds_arg(argv[3]);
		start();
		truth("kwait_rounds", run_timed(threads, kwait_thread, seconds));
	} else if (strcmp(mode, "roundrobin") == 0 && argc == 5) {
		long count = count_arg(argv[2], 10 * 1000 * 1000);
		long threads = count_arg(argv[3], MAX_THREADS);
		double seconds = seconds_arg(argv[4]);
		start();
		locks_roundrobin(count, threads, seconds);
	} else if (strcmp(mode, "table") == 0 && argc == 4) {
		long threads = count_arg(argv[2], MAX_THREADS);
		double seconds = seconds_arg(argv[3]);
		start();
		locks_table(threads, seconds);
	} else {
		usage();
	}
	return 0;
}
