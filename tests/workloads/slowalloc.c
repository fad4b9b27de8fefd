/*
 * slowalloc: an allocator with a known latency, for the tests that check
 * the latencies memprof-ebpf reports. Preloaded (LD_PRELOAD), it defines
 * malloc, which busy-waits SLOWALLOC_MALLOC_NS (2000 ns) measured on
 * CLOCK_MONOTONIC and then takes the block from glibc (__libc_malloc), and
 * free, which hands the block straight back (__libc_free, no wait). So a
 * malloc really takes 2 us plus glibc's few tens of ns, and a free takes
 * glibc's time alone: a profiler that reports much more is reporting its
 * own cost.
 *
 * calloc, realloc and the aligned allocations are left to glibc: the tests
 * count and time malloc and free only.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <time.h>

#define SLOWALLOC_MALLOC_NS 2000

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);

static long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

void *malloc(size_t size)
{
	long until = now_ns() + SLOWALLOC_MALLOC_NS;
	while (now_ns() < until)
		;
	return __libc_malloc(size);
}

void free(void *ptr)
{
	__libc_free(ptr);
}
