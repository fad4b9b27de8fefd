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
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <time.h>

#define SLOWALLOC_MALLOC_NS 3000
#define SLOWALLOC_FREE_NS 1000

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
	busy_wait(SLOWALLOC_MALLOC_NS);
	return __libc_malloc(size);
}

void free(void *ptr)
{
	if (ptr)
		busy_wait(SLOWALLOC_FREE_NS);
	__libc_free(ptr);
}
