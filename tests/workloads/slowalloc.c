/*
 * slowalloc: an allocator with a known latency, for the tests that check
 * the latencies memprof-ebpf reports. Preloaded (LD_PRELOAD), it defines
 * malloc, which busy-waits SLOWALLOC_MALLOC_NS (3000 ns) measured on
 * CLOCK_MONOTONIC and then takes the block from glibc (__libc_malloc), and
 * free, which busy-waits SLOWALLOC_FREE_NS (1000 ns) and hands the block
 * back (__libc_free). So a malloc really takes 3 us and a free 1 us, plus
 * glibc's few tens of ns: a profiler that reports more is reporting its
 * own cost.
 *
 * calloc, realloc and the aligned allocations are left to glibc: the tests
 * count and time malloc and free only.
 *
 * Other latencies: build with -DSLOWALLOC_MALLOC_NS=50 (and _FREE_NS), or
 * set the variables SLOWALLOC_MALLOC_NS / SLOWALLOC_FREE_NS in the
 * environment of one process. The tool's helper that times the
 * allocator untraced does not inherit those (they are not allocator
 * tuning variables), so with them the traced program's calls are slower
 * than the same allocator timed alone: what a program whose calls contend
 * or miss the cache looks like to the tool.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <time.h>

#include <stdlib.h>

#ifndef SLOWALLOC_MALLOC_NS
#define SLOWALLOC_MALLOC_NS 3000
#endif
#ifndef SLOWALLOC_FREE_NS
#define SLOWALLOC_FREE_NS 1000
#endif

static long malloc_ns = SLOWALLOC_MALLOC_NS;
static long free_ns = SLOWALLOC_FREE_NS;

__attribute__((constructor)) static void slowalloc_init(void)
{
	const char *m = getenv("SLOWALLOC_MALLOC_NS");
	const char *f = getenv("SLOWALLOC_FREE_NS");
	if (m)
		malloc_ns = atol(m);
	if (f)
		free_ns = atol(f);
}

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);

static long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void busy_wait(long ns)
{
	long until = now_ns() + ns;
	while (now_ns() < until)
		;
}

void *malloc(size_t size)
{
	busy_wait(malloc_ns);
	return __libc_malloc(size);
}

void free(void *ptr)
{
	if (ptr)
		busy_wait(free_ns);
	__libc_free(ptr);
}
