/*
 * fallback_model.c - a model of HAMi-core's current host-PID fallback path, for
 * bench/concurrent_start.py.
 *
 * Without the broker, HAMi-core learns a process's host PID by creating a CUDA primary
 * context while it holds a node-wide lock (the "post init" lock, a file lock under
 * /tmp/vgpulock shared by every container on the node), so processes that start together
 * pass through that critical section one at a time.
 * Upstream measured the critical section at about 60 ms per process on a cold GPU: primary
 * context retain about 31 ms plus release about 12 ms plus the surrounding work
 * (HAMi issue 1662, https://github.com/Project-HAMi/HAMi/issues/1662).
 *
 * This program reproduces the shape without a GPU: it forks N processes that block on one
 * pipe, releases them at the same instant (exactly like `hostpid-client --storm N`), and
 * each one opens LOCKFILE, takes flock(LOCK_EX), holds it for HOLD_MS (nanosleep: the
 * process waits on the device, it does not spin a CPU), releases it and reports the time
 * from release to unlock.  The output has the storm format of clients/c/hostpid_cli.c:
 *
 *   clients=N successful=S failed=F wall_ms=W
 *   latency_ms p50=.. p99=.. max=.. distinct_pids=D fork_ms=..
 *
 * usage: fallback_model --storm N --hold-ms MS LOCKFILE
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct record {
    int32_t ok;
    int32_t pid;
    int64_t elapsed_ns;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a;
    int64_t y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int read_full(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n > 0) {
            got += (size_t)n;
        } else if (n == 0 || errno != EINTR) {
            return 0;
        }
    }
    return 1;
}

static void child(int gate_fd, int result_fd, const char *lockfile, long hold_ms) {
    char byte;
    while (read(gate_fd, &byte, 1) < 0 && errno == EINTR) {
    }
    struct record rec = {0, (int32_t)getpid(), 0};
    int64_t start = now_ns();
    int fd = open(lockfile, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        int locked;
        while ((locked = flock(fd, LOCK_EX)) != 0 && errno == EINTR) {
        }
        if (locked == 0) {
            struct timespec hold = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
            while (nanosleep(&hold, &hold) != 0 && errno == EINTR) {
            }
            flock(fd, LOCK_UN);
            rec.ok = 1;
        }
        close(fd);
    }
    rec.elapsed_ns = now_ns() - start;
    ssize_t n = write(result_fd, &rec, sizeof rec);
    _exit(n == (ssize_t)sizeof rec && rec.ok ? 0 : 1);
}

int main(int argc, char **argv) {
    long clients = 0;
    long hold_ms = 60;
    const char *lockfile = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--storm") == 0 && i + 1 < argc) {
            clients = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--hold-ms") == 0 && i + 1 < argc) {
            hold_ms = strtol(argv[++i], NULL, 10);
        } else if (argv[i][0] != '-' && lockfile == NULL) {
            lockfile = argv[i];
        } else {
            fprintf(stderr, "fallback_model: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (clients < 1 || clients > 100000 || hold_ms < 0 || lockfile == NULL) {
        fprintf(stderr, "usage: fallback_model --storm N --hold-ms MS LOCKFILE\n");
        return 2;
    }
    int gate[2];
    int results[2];
    if (pipe(gate) != 0 || pipe(results) != 0) {
        perror("fallback_model: pipe");
        return 2;
    }
    struct record *recs = calloc((size_t)clients, sizeof *recs);
    pid_t *children = calloc((size_t)clients, sizeof *children);
    int64_t *lat = calloc((size_t)clients, sizeof *lat);
    if (recs == NULL || children == NULL || lat == NULL) {
        fprintf(stderr, "fallback_model: out of memory\n");
        return 2;
    }
    fflush(stdout);
    long forked = 0;
    int64_t fork_start = now_ns();
    for (; forked < clients; forked++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "fallback_model: fork failed after %ld: %s\n", forked,
                    strerror(errno));
            break;
        }
        if (pid == 0) {
            close(gate[1]);
            close(results[0]);
            child(gate[0], results[1], lockfile, hold_ms);
        }
        children[forked] = pid;
    }
    int64_t fork_ns = now_ns() - fork_start;
    close(gate[0]);
    close(results[1]);
    int64_t release = now_ns();
    close(gate[1]);
    long received = 0;
    while (received < forked && read_full(results[0], &recs[received], sizeof recs[0])) {
        received++;
    }
    int64_t wall_ns = now_ns() - release;
    for (long i = 0; i < forked; i++) {
        while (waitpid(children[i], NULL, 0) < 0 && errno == EINTR) {
        }
    }
    long ok = 0;
    for (long i = 0; i < received; i++) {
        lat[i] = recs[i].elapsed_ns;
        ok += recs[i].ok;
    }
    qsort(lat, (size_t)received, sizeof *lat, cmp_i64);
    printf("clients=%ld successful=%ld failed=%ld wall_ms=%.1f\n", clients, ok, clients - ok,
           (double)wall_ns / 1e6);
    if (received > 0) {
        /* Every process holds the lock under its own PID: distinct_pids counts the records. */
        printf("latency_ms p50=%.2f p99=%.2f max=%.2f distinct_pids=%ld fork_ms=%.1f\n",
               (double)lat[received / 2] / 1e6, (double)lat[(received * 99) / 100] / 1e6,
               (double)lat[received - 1] / 1e6, received, (double)fork_ns / 1e6);
    }
    if (ok < clients) {
        printf("failures: lock=%ld not_started_or_lost=%ld\n", received - ok, clients - received);
    }
    free(recs);
    free(children);
    free(lat);
    return ok == clients ? 0 : 1;
}
