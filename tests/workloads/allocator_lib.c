/*
 * allocator_lib: a shared library for the `alloc dlopen` workload. Its
 * allocations must be attributed to this file and the line marked LIBLEAK,
 * in a library loaded after the profiler attached.
 */
#include <stdlib.h>

static void *volatile sink;
static void **kept;

/* Leaks N blocks of 48 bytes (kept in a list, never freed). */
void lib_leak(int n)
{
	for (int i = 0; i < n; i++) {
		sink = malloc(48); // LIBLEAK
		void **block = sink;
		*block = kept;
		kept = block;
	}
}
