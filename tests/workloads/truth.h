/*
 * truth.h: what every test workload shares so that the tests can compare
 * memprof-ebpf's report with the workload's own account of itself.
 *
 * - Ground truth: truth(KEY, VALUE) appends "KEY VALUE" to the file named
 *   by the environment variable WORKLOAD_TRUTH (on stderr when it is
 *   unset). Workloads count their own calls (allocator calls, lock
 *   acquisitions, time held, bytes live) and write them at the end.
 * - A start gate for attach tests: with WORKLOAD_GO_SIGNAL=1 set,
 *   go_gate_arm() (called before any thread starts, so every thread
 *   inherits the blocked signal) blocks SIGUSR1, and go_gate_wait() (after
 *   "ready") waits for it. The test attaches the profiler with -p, waits
 *   until the profiler says it is tracing, then sends SIGUSR1: the whole
 *   measured work then happens while traced, so its counts are exact.
 */
#ifndef MEMPROF_WORKLOAD_TRUTH_H
#define MEMPROF_WORKLOAD_TRUTH_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static inline void truth(const char *key, unsigned long value)
{
	const char *path = getenv("WORKLOAD_TRUTH");
	FILE *f = path ? fopen(path, "a") : NULL;
	fprintf(f ? f : stderr, "%s %lu\n", key, value);
	if (f)
		fclose(f);
}

static inline int go_gate_enabled(void)
{
	const char *v = getenv("WORKLOAD_GO_SIGNAL");
	return v && v[0] == '1';
}

static inline void go_gate_arm(void)
{
	if (!go_gate_enabled())
		return;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
		exit(1);
}

static inline void go_gate_wait(void)
{
	if (!go_gate_enabled())
		return;
	sigset_t set;
	int sig;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	if (sigwait(&set, &sig) != 0)
		exit(1);
}

#endif
