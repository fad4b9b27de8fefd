/*
 * forkshare: processes that share memory, for memprof-ebpf's
 * multi-process false-sharing tests.
 *
 *   forkshare MODE SECONDS
 *
 * The parent maps shared memory, forks two children and sleeps; child i
 * (0 or 1, pinned to CPU i modulo the CPUs online) increments its own
 * 8-byte counter in that memory until SECONDS have passed. Modes, and
 * what a profiler should report:
 *
 *   anon    MAP_SHARED|MAP_ANONYMOUS, mapped before the fork (the children
 *           use it at the parent's address); counters at bytes 0 and 8 of
 *           one line.                       FALSE sharing across the two pids
 *   shm     a POSIX shared memory object (/dev/shm/forkshare-PID), which
 *           each child maps again itself, at an address of its own;
 *           counters at bytes 0 and 8.      FALSE sharing across the two pids
 *   padded  as anon, counters at bytes 0 and 64.                    nothing
 *
 * The parent prints "ready" on stdout once the children are forked. With
 * WORKLOAD_GO_SIGNAL=1 (truth.h) the children wait until the parent gets
 * SIGUSR1 before they start counting, so a profiler attached to the three
 * pids sees all their work. The truth file (WORKLOAD_TRUTH) gets
 * child0_pid, child1_pid, child{0,1}_addr (where each child's counter is)
 * and child{0,1}_iterations.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "truth.h"

#define CHECK_EVERY 1024
#define BYTES 4096

/* The control words, each on its own line away from the counters. */
struct control {
    volatile int go;
    char pad0[60];
    volatile int stop;
    char pad1[60];
    volatile long done[2];
};

#define COUNTERS_AT 1024 /* the counters' line, 64-byte aligned */

static const char *g_mode;
static char g_shm_name[64];

static void *map_shm(int create)
{
    int fd = shm_open(g_shm_name, O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0 || (create && ftruncate(fd, BYTES) != 0)) {
        perror("forkshare: shm");
        exit(1);
    }
    void *p = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p;
}

static void pin(int cpu)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 1) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu % cpus, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
}

static void child(int id, char *base)
{
    struct control *ctl = (struct control *)base;
    pin(id);
    if (!strcmp(g_mode, "shm")) {
        /* A mapping of its own, at an address the other child does not
         * use: a different-sized region first moves it. */
        if (mmap(NULL, (id + 1) * 2 * BYTES, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
            MAP_FAILED)
            exit(1);
        base = map_shm(0);
    }
    size_t stride = !strcmp(g_mode, "padded") ? 64 : 8;
    volatile long *c = (volatile long *)(base + COUNTERS_AT + id * stride);
    while (!ctl->go)
        ;
    long n = 0;
    do {
        for (int k = 0; k < CHECK_EVERY; k++)
            (*c)++; /* FORKSHARE_WRITE */
        n += CHECK_EVERY;
    } while (!ctl->stop);
    ctl->done[id] = n;
    char key[32];
    snprintf(key, sizeof key, "child%d_addr", id);
    truth(key, (unsigned long)c);
    snprintf(key, sizeof key, "child%d_iterations", id);
    truth(key, (unsigned long)n);
    exit(0);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "anon") && strcmp(argv[1], "shm") &&
                      strcmp(argv[1], "padded"))) {
        fprintf(stderr, "usage: forkshare anon|shm|padded SECONDS\n");
        return 2;
    }
    g_mode = argv[1];
    int seconds = atoi(argv[2]);
    char *base;
    if (!strcmp(g_mode, "shm")) {
        snprintf(g_shm_name, sizeof g_shm_name, "/forkshare-%d", (int)getpid());
        base = map_shm(1);
    } else {
        base = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    }
    if (base == MAP_FAILED) {
        perror("forkshare: mmap");
        return 1;
    }
    go_gate_arm();
    struct control *ctl = (struct control *)base;
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] < 0) {
            perror("forkshare: fork");
            return 1;
        }
        if (pids[i] == 0)
            child(i, base);
        char key[32];
        snprintf(key, sizeof key, "child%d_pid", i);
        truth(key, (unsigned long)pids[i]);
    }
    printf("ready\n");
    fflush(stdout);
    go_gate_wait();
    ctl->go = 1;
    sleep(seconds);
    ctl->stop = 1;
    int failed = 0;
    for (int i = 0; i < 2; i++) {
        int status;
        if (waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
            failed = 1;
    }
    if (g_shm_name[0])
        shm_unlink(g_shm_name);
    fprintf(stderr, "iterations %ld\n", ctl->done[0] + ctl->done[1]);
    return failed;
}
