/*
 * allocapi: allocations through the entry points a program built for a
 * particular allocator calls besides malloc and free, for memprof-ebpf's
 * allocator tests:
 *
 *   allocapi N    for each entry point the allocator that defines malloc
 *                 also defines (found with dlsym, so the same executable
 *                 runs under glibc, jemalloc, tcmalloc and mimalloc
 *                 preloaded), N allocations of sizes spread over 16..4111
 *                 bytes, every other one given back through the matching
 *                 release:
 *                 - C++ operator new / new[] / aligned new (64) / nothrow
 *                   new, released with the sized (C++14), aligned (C++17)
 *                   or plain delete, as g++ emits them for `delete p`;
 *                 - jemalloc's mallocx, every 4th grown with rallocx,
 *                   every 4th (+1) resized in place with xallocx, released
 *                   with sdallocx or dallocx.
 *                 Kept blocks are all kept to the end.
 *
 * Truth: live_usable (the sum of malloc_usable_size() of the kept blocks:
 * the allocator's own account), api_calls (the calls made through these
 * entry points, each allocation, resize and release one), and one
 * "<symbol> 1" line per entry point found. Prints "ready" once
 * started; exits 0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "truth.h"

#define MAX_BLOCKS 200000

static void *kept[MAX_BLOCKS];
static unsigned long kept_count, api_calls;
static void *volatile sink;

typedef void *(*alloc_fn)(size_t);
typedef void *(*alloc2_fn)(size_t, size_t);
typedef void (*free_fn)(void *);
typedef void (*free2_fn)(void *, size_t);
typedef void (*free3_fn)(void *, size_t, size_t);

/* An entry point of the allocator, or NULL: under plain glibc the C++
 * operators are not loaded (this is C) and jemalloc's API does not exist. */
static void *entry(const char *name)
{
	void *f = dlsym(RTLD_DEFAULT, name);
	if (f)
		truth(name, 1);
	return f;
}

static void keep(void *p)
{
	if (!p || kept_count == MAX_BLOCKS)
		exit(1);
	kept[kept_count++] = p;
}

static size_t size_of(long i)
{
	return 16 + (size_t)(i * 7919) % 4096;
}

/* operator new(size) with its sized delete(ptr, size), or plain delete. */
static void cxx(const char *new_name, const char *sized, const char *plain, long n)
{
	alloc_fn nw = (alloc_fn)entry(new_name);
	free2_fn del_sized = (free2_fn)entry(sized);
	free_fn del = (free_fn)entry(plain);
	if (!nw || !del_sized || !del)
		return;
	for (long i = 0; i < n; i++) {
		size_t size = size_of(i);
		void *p = nw(size);
		sink = p;
		api_calls++;
		if (i % 4 == 1)
			del_sized(p, size);
		else if (i % 4 == 3)
			del(p);
		else
			keep(p);
		api_calls += i % 2;
	}
}

/* operator new(size, align) with delete(ptr, size, align). */
static void cxx_aligned(long n)
{
	alloc2_fn nw = (alloc2_fn)entry("_ZnwmSt11align_val_t");
	free3_fn del = (free3_fn)entry("_ZdlPvmSt11align_val_t");
	if (!nw || !del)
		return;
	for (long i = 0; i < n; i++) {
		size_t size = size_of(i);
		void *p = nw(size, 64);
		sink = p;
		api_calls++;
		if (i % 2) {
			del(p, size, 64);
			api_calls++;
		} else {
			keep(p);
		}
	}
}

/* operator new(size, nothrow) with delete(ptr, nothrow). */
static void cxx_nothrow(long n)
{
	static const char nothrow_tag = 0; /* std::nothrow is an empty struct */
	void *(*nw)(size_t, const void *) = (void *(*)(size_t, const void *))entry(
		"_ZnwmRKSt9nothrow_t");
	void (*del)(void *, const void *) = (void (*)(void *, const void *))entry(
		"_ZdlPvRKSt9nothrow_t");
	if (!nw || !del)
		return;
	for (long i = 0; i < n; i++) {
		void *p = nw(size_of(i), &nothrow_tag);
		sink = p;
		api_calls++;
		if (i % 2) {
			del(p, &nothrow_tag);
			api_calls++;
		} else {
			keep(p);
		}
	}
}

/* jemalloc's own API (flags 0: no alignment, no zeroing, the tcache). */
static void jemalloc_api(long n)
{
	void *(*mallocx)(size_t, int) = (void *(*)(size_t, int))entry("mallocx");
	void *(*rallocx)(void *, size_t, int) = (void *(*)(void *, size_t, int))entry("rallocx");
	size_t (*xallocx)(void *, size_t, size_t, int) =
		(size_t(*)(void *, size_t, size_t, int))entry("xallocx");
	void (*sdallocx)(void *, size_t, int) = (void (*)(void *, size_t, int))entry("sdallocx");
	void (*dallocx)(void *, int) = (void (*)(void *, int))entry("dallocx");
	if (!mallocx || !rallocx || !xallocx || !sdallocx || !dallocx)
		return;
	for (long i = 0; i < n; i++) {
		size_t size = size_of(i);
		void *p = mallocx(size, 0);
		api_calls++;
		if (i % 4 == 0) {
			size += 5000;
			p = rallocx(p, size, 0);
			api_calls++;
		} else if (i % 4 == 1) {
			size = xallocx(p, size + 64, 0, 0);
			api_calls++;
		}
		sink = p;
		if (i % 8 == 3) {
			sdallocx(p, size, 0);
			api_calls++;
		} else if (i % 8 == 7) {
			dallocx(p, 0);
			api_calls++;
		} else {
			keep(p);
		}
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: allocapi N\n");
		return 2;
	}
	long n = strtol(argv[1], NULL, 10);
	if (n < 1 || n * 4 > MAX_BLOCKS) {
		fprintf(stderr, "allocapi: N must be 1..%d\n", MAX_BLOCKS / 4);
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	sink = malloc(1);
	free(sink);
	fputs("ready\n", stdout);
	cxx("_Znwm", "_ZdlPvm", "_ZdlPv", n);
	cxx("_Znam", "_ZdaPvm", "_ZdaPv", n);
	cxx_aligned(n);
	cxx_nothrow(n);
	jemalloc_api(n);
	unsigned long usable = 0;
	for (unsigned long i = 0; i < kept_count; i++)
		usable += malloc_usable_size(kept[i]);
	truth("live_usable", usable);
	truth("api_calls", api_calls);
	return 0;
}
