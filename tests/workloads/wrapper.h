/*
 * wrapper.h: a static inline allocation helper, as projects keep them in
 * headers (out of line at -O0, inlined at -O2). A profiler must name the
 * line that calls it, not its calloc line (HEADER_CALLOC).
 */
#ifndef MEMPROF_WORKLOAD_WRAPPER_H
#define MEMPROF_WORKLOAD_WRAPPER_H

#include <stdlib.h>

static inline void *CALLOC(size_t n, size_t size)
{
	void *p = calloc(n, size); /* HEADER_CALLOC */
	if (!p)
		abort();
	return p;
}

#endif
