/*
 * hostpid_cli.c - the hostpid-client command: query the broker once, or as a storm.
 *
 *   hostpid-client [--ignore-switch] [--deadline SECONDS] [PATH]
 *       Prints the host PID and exits 0, or prints the reason (the same names as
 *       `hami-trio hostpid`: missing, stale, unsafe_owner, ...) on stdout and a detail line
 *       on stderr, and exits 1.  PATH defaults to /tmp/vgpulock/hostpid/broker.sock.
 *
 *   hostpid-client [--ignore-switch] [--deadline SECONDS] --storm N [PATH]
 *       Forks N processes that wait on one pipe; closing its write end releases them all at
 *       the same instant, and each runs one query.  Each child reports its outcome through a
 *       second pipe (24-byte records, atomic below PIPE_BUF).  Prints
 *           clients=N successful=S failed=F wall_ms=W
 *           latency_ms p50=.. p99=.. max=.. distinct_pids=D answers_equal_local_pid=L
 *           failures: reason=count ...          (only when F > 0)
 *       wall_ms runs from the release to the last result; exits 0 only if all succeeded.
 *       distinct_pids must equal S (every process has its own PID); answers_equal_local_pid
 *       is S in the broker's PID namespace and 0 inside a container's own PID namespace.
 *
 * Without --ignore-switch both modes honour LIBVGPU_HOSTPID_BROKER exactly like HAMi-core
 * (on only for "1"), so running it in a pod shows what the library would do there.
 * Exit status 2: bad usage.
 */
#define _GNU_SOURCE

#include "hostpid_client.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_STORM 100000
#define N_STATUSES (HOSTPID_DISABLED + 1)

struct record {
    int32_t status;
    int32_t answer;
    int32_t local_pid;
    int32_t pad;
    int64_t elapsed_ns;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

static void usage(FILE *out) {
    fprintf(out, "usage: hostpid-client [--ignore-switch] [--deadline SECONDS] [--storm N] "
                 "[PATH]\n"
                 "  PATH defaults to " HOSTPID_DEFAULT_SOCKET_PATH "\n");
}

static hostpid_status run_query(int ignore_switch, const char *path, long deadline_ms,
                                pid_t *pid, char *detail, size_t detail_len) {
    if (ignore_switch) {
        return hostpid_query(path, deadline_ms, pid, detail, detail_len);
    }
    return hostpid_lookup(path, deadline_ms, pid, detail, detail_len);
}

static int single(int ignore_switch, const char *path, long deadline_ms) {
    char detail[512] = "";
    pid_t pid = 0;
    hostpid_status status =
        run_query(ignore_switch, path, deadline_ms, &pid, detail, sizeof detail);
    if (status == HOSTPID_OK) {
        printf("%ld\n", (long)pid);
        return 0;
    }
    printf("%s\n", hostpid_status_name(status));
    fprintf(stderr, "hostpid-client: %s: %s\n", hostpid_status_name(status), detail);
    return 1;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a;
    int64_t y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a;
    int32_t y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Read exactly len bytes; returns 1 on success, 0 on end of stream. */
static int read_full(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n > 0) {
            got += (size_t)n;
        } else if (n == 0) {
            return 0;
        } else if (errno != EINTR) {
            return 0;
        }
    }
    return 1;
}

static void storm_child(int gate_fd, int result_fd, int ignore_switch, const char *path,
                        long deadline_ms) {
    char byte;
    /* Blocks until the parent closes the write end: end of stream releases every child. */
    while (read(gate_fd, &byte, 1) < 0 && errno == EINTR) {
    }
    struct record rec;
    memset(&rec, 0, sizeof rec);
    int64_t start = now_ns();
    pid_t pid = 0;
    hostpid_status status = run_query(ignore_switch, path, deadline_ms, &pid, NULL, 0);
    rec.elapsed_ns = now_ns() - start;
    rec.status = (int32_t)status;
    rec.answer = status == HOSTPID_OK ? (int32_t)pid : 0;
    rec.local_pid = (int32_t)getpid();
    ssize_t n = write(result_fd, &rec, sizeof rec);
    _exit(n == (ssize_t)sizeof rec && status == HOSTPID_OK ? 0 : 1);
}

static int storm(long clients, int ignore_switch, const char *path, long deadline_ms) {
    int gate[2];
    int results[2];
    if (pipe(gate) != 0 || pipe(results) != 0) {
        perror("hostpid-client: pipe");
        return 2;
    }
    struct record *recs = calloc((size_t)clients, sizeof *recs);
    pid_t *children = calloc((size_t)clients, sizeof *children);
    if (recs == NULL || children == NULL) {
        fprintf(stderr, "hostpid-client: out of memory for %ld clients\n", clients);
        return 2;
    }
    fflush(stdout);
    fflush(stderr);
    long forked = 0;
    int64_t fork_start = now_ns();
    for (; forked < clients; forked++) {
        pid_t child = fork();
        if (child < 0) {
            fprintf(stderr, "hostpid-client: fork failed after %ld children: %s\n", forked,
                    strerror(errno));
            break;
        }
        if (child == 0) {
            close(gate[1]);
            close(results[0]);
            storm_child(gate[0], results[1], ignore_switch, path, deadline_ms);
        }
        children[forked] = child;
    }
    int64_t fork_ns = now_ns() - fork_start;
    close(gate[0]);
    close(results[1]);
    int64_t release = now_ns();
    close(gate[1]); /* release every child at once */

    long received = 0;
    while (received < forked && read_full(results[0], &recs[received], sizeof recs[0])) {
        received++;
    }
    int64_t wall_ns = now_ns() - release;
    close(results[0]);
    for (long i = 0; i < forked; i++) {
        while (waitpid(children[i], NULL, 0) < 0 && errno == EINTR) {
        }
    }

    long ok = 0;
    long equal_local = 0;
    long by_status[N_STATUSES] = {0};
    int64_t *lat = calloc((size_t)(received > 0 ? received : 1), sizeof *lat);
    int32_t *answers = calloc((size_t)(received > 0 ? received : 1), sizeof *answers);
    if (lat == NULL || answers == NULL) {
        fprintf(stderr, "hostpid-client: out of memory\n");
        return 2;
    }
    for (long i = 0; i < received; i++) {
        lat[i] = recs[i].elapsed_ns;
        if (recs[i].status == HOSTPID_OK) {
            answers[ok++] = recs[i].answer;
            equal_local += recs[i].answer == recs[i].local_pid;
        }
        if (recs[i].status >= 0 && recs[i].status < N_STATUSES) {
            by_status[recs[i].status]++;
        }
    }
    qsort(lat, (size_t)received, sizeof *lat, cmp_i64);
    qsort(answers, (size_t)ok, sizeof *answers, cmp_i32);
    long distinct = 0;
    for (long i = 0; i < ok; i++) {
        distinct += i == 0 || answers[i] != answers[i - 1];
    }
    long failed = clients - ok;
    printf("clients=%ld successful=%ld failed=%ld wall_ms=%.1f\n", clients, ok, failed,
           (double)wall_ns / 1e6);
    if (received > 0) {
        printf("latency_ms p50=%.2f p99=%.2f max=%.2f distinct_pids=%ld "
               "answers_equal_local_pid=%ld fork_ms=%.1f\n",
               (double)lat[received / 2] / 1e6, (double)lat[(received * 99) / 100] / 1e6,
               (double)lat[received - 1] / 1e6, distinct, equal_local, (double)fork_ns / 1e6);
    }
    if (failed > 0) {
        printf("failures:");
        for (int s = 1; s < N_STATUSES; s++) {
            if (by_status[s] > 0) {
                printf(" %s=%ld", hostpid_status_name((hostpid_status)s), by_status[s]);
            }
        }
        if (clients - received > 0) {
            printf(" not_started_or_lost=%ld", clients - received);
        }
        printf("\n");
    }
    free(lat);
    free(answers);
    free(recs);
    free(children);
    return failed == 0 && distinct == ok ? 0 : 1;
}

static int parse_long(const char *text, long *out) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
        return -1;
    }
    *out = value;
    return 0;
}

int main(int argc, char **argv) {
    int ignore_switch = 0;
    long deadline_ms = HOSTPID_DEFAULT_DEADLINE_MS;
    long clients = 0;
    const char *path = HOSTPID_DEFAULT_SOCKET_PATH;
    int have_path = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--ignore-switch") == 0) {
            ignore_switch = 1;
        } else if (strcmp(arg, "--deadline") == 0 && i + 1 < argc) {
            char *end;
            errno = 0;
            double seconds = strtod(argv[++i], &end);
            if (errno != 0 || end == argv[i] || *end != '\0' || !(seconds > 0) ||
                seconds > 3600) {
                fprintf(stderr, "hostpid-client: --deadline: %s is not a number of seconds in "
                                "(0, 3600]\n",
                        argv[i]);
                return 2;
            }
            deadline_ms = (long)(seconds * 1000 + 0.5);
            if (deadline_ms < 1) {
                deadline_ms = 1;
            }
        } else if (strcmp(arg, "--storm") == 0 && i + 1 < argc) {
            if (parse_long(argv[++i], &clients) != 0 || clients < 1 || clients > MAX_STORM) {
                fprintf(stderr, "hostpid-client: --storm: %s is not a count in 1..%d\n", argv[i],
                        MAX_STORM);
                return 2;
            }
        } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (arg[0] == '-' || have_path) {
            fprintf(stderr, "hostpid-client: unexpected argument %s\n", arg);
            usage(stderr);
            return 2;
        } else {
            path = arg;
            have_path = 1;
        }
    }
    if (clients > 0) {
        return storm(clients, ignore_switch, path, deadline_ms);
    }
    return single(ignore_switch, path, deadline_ms);
}
