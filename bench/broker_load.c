/*
 * Load generator for the host PID broker protocol v1 (driven by bench/broker_load.py).
 *
 * Every exchange is real: connect to the Unix socket, send the 8-byte request, read the
 * 12-byte answer, and check it (magic, version 1, status 0, PID == the sending process's
 * PID).  An answer that fails the check, a refused connect or a close without answer counts
 * as a failure.  Latencies (connect to last byte) go into a fixed log-linear histogram
 * (1 us steps to 1 ms, 10 us to 10 ms, 1 ms to 1 s) kept per worker, merged at the end.
 *
 * Modes (one JSON object on stdout):
 *   threads   CONCURRENCY threads in this process, back-to-back exchanges for SECONDS;
 *   procs     CONCURRENCY forked processes, each checking its own PID;
 *   slowloris IDLE idle connections (nothing sent, re-opened as soon as the server drops
 *             them) held by one thread, beside CONCURRENCY legitimate client threads that
 *             each do one exchange per millisecond with a 500 ms deadline, like HAMi-core.
 *   open      CONCURRENCY threads, each on a fixed schedule of one exchange every PERIOD
 *             microseconds (the last argument, default 1000; 500 ms deadline); latency is
 *             counted from the exchange's scheduled time, so a server that stalls is charged
 *             for every exchange due during the stall, not just the one that was waiting (an
 *             open-loop load, like independent HAMi-core processes starting at arbitrary
 *             times; use many threads with a long period, so that one slow answer does not
 *             hold back a thread's next exchanges).
 *
 * Build: gcc -O2 -Wall -pthread -o broker_load broker_load.c
 * Usage: broker_load SOCKET_PATH threads|procs|slowloris|open CONCURRENCY SECONDS [IDLE|PERIOD]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NB 2891 /* histogram buckets, see bucket_of() */

struct worker {
    uint64_t ok, fail;
    uint64_t hist[NB];
};

struct shared {
    atomic_int go, stop;
    struct worker w[];
};

static struct sockaddr_un addr;
static struct shared *shm;
static int legit_deadline_ms = 0; /* 0: blocking, no deadline */
static int pace_us = 0;
static int open_loop = 0; /* latency from the scheduled time (mode "open") */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int bucket_of(uint64_t ns) {
    uint64_t us = ns / 1000;
    if (us < 1000) return (int)us;
    if (us < 10000) return 1000 + (int)((us - 1000) / 10);
    if (us < 1000000) return 1900 + (int)((us - 10000) / 1000);
    return NB - 1;
}

/* Upper bound of a bucket in microseconds. */
static double bucket_upper_us(int b) {
    if (b < 1000) return b + 1;
    if (b < 1900) return 1000 + (b - 1000) * 10.0 + 10;
    if (b < NB - 1) return 10000 + (b - 1900) * 1000.0 + 1000;
    return 1e6;
}

static void set_timeout(int fd, int opt, int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}

/* One checked exchange; returns 0 on a correct answer. */
static int exchange(pid_t expect) {
    static const unsigned char req[8] = {'H', 'P', 'I', 'D', 0, 1, 0, 1};
    unsigned char resp[12];
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    uint64_t start = now_ns();
    if (legit_deadline_ms) {
        set_timeout(fd, SO_SNDTIMEO, legit_deadline_ms); /* bounds a connect into a full backlog */
        set_timeout(fd, SO_RCVTIMEO, legit_deadline_ms);
    }
    int rc = -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) goto out;
    if (send(fd, req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req)) goto out;
    size_t got = 0;
    while (got < sizeof(resp)) {
        if (legit_deadline_ms) {
            long left = legit_deadline_ms - (long)((now_ns() - start) / 1000000ull);
            if (left <= 0) goto out;
            set_timeout(fd, SO_RCVTIMEO, (int)left);
        }
        ssize_t n = recv(fd, resp + got, sizeof(resp) - got, 0);
        if (n <= 0) goto out;
        got += (size_t)n;
    }
    uint32_t pid_be;
    memcpy(&pid_be, resp + 8, 4);
    if (memcmp(resp, "HPID\x00\x01\x00\x00", 8) == 0 && ntohl(pid_be) == (uint32_t)expect) rc = 0;
out:
    close(fd);
    return rc;
}

static void run_worker(struct worker *w) {
    pid_t me = getpid();
    while (!atomic_load(&shm->go)) usleep(100);
    uint64_t due = now_ns();
    while (!atomic_load_explicit(&shm->stop, memory_order_relaxed)) {
        uint64_t t0 = now_ns();
        if (open_loop) {
            if (t0 < due) usleep((useconds_t)((due - t0) / 1000));
            t0 = due; /* charged from when this exchange was due */
            due += (uint64_t)pace_us * 1000u;
        }
        if (exchange(me) == 0) {
            w->ok++;
            w->hist[bucket_of(now_ns() - t0)]++;
        } else {
            w->fail++;
        }
        if (pace_us && !open_loop) usleep((useconds_t)pace_us);
    }
}

static void *thread_main(void *arg) {
    run_worker((struct worker *)arg);
    return NULL;
}

/* ---- slowloris attacker: keeps `idle` connections open, re-opening dropped ones ---- */
static int idle_target;
static atomic_long reopened;
static atomic_int idle_open;

static int open_idle(int epfd) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        return -1; /* EAGAIN: backlog full; retried on the next round */
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    return fd;
}

static void *attacker_main(void *arg) {
    (void)arg;
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event evs[512];
    int open_now = 0;
    while (!atomic_load_explicit(&shm->stop, memory_order_relaxed)) {
        while (open_now < idle_target && open_idle(epfd) >= 0) open_now++;
        atomic_store(&idle_open, open_now);
        int n = epoll_wait(epfd, evs, 512, 1);
        for (int i = 0; i < n; i++) {
            char buf[16];
            ssize_t r = recv(evs[i].data.fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (r < 0 && errno == EAGAIN) continue;
            close(evs[i].data.fd); /* dropped by the server: re-open */
            open_now--;
            atomic_fetch_add(&reopened, 1);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s SOCKET_PATH threads|procs|slowloris|open CONCURRENCY SECONDS [IDLE|PERIOD]\n",
                argv[0]);
        return 2;
    }
    const char *mode = argv[2];
    int conc = atoi(argv[3]);
    double seconds = atof(argv[4]);
    int idle = argc > 5 ? atoi(argv[5]) : 0;
    if (conc < 1 || seconds <= 0) { fprintf(stderr, "bad arguments\n"); return 2; }
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", argv[1]);

    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);

    size_t size = sizeof(struct shared) + (size_t)conc * sizeof(struct worker);
    shm = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED) { perror("mmap"); return 1; }

    pthread_t *threads = calloc((size_t)conc, sizeof(pthread_t));
    pid_t *pids = calloc((size_t)conc, sizeof(pid_t));
    pthread_t attacker;
    int slowloris = strcmp(mode, "slowloris") == 0;
    if (strcmp(mode, "open") == 0) {
        legit_deadline_ms = 500;
        pace_us = idle > 0 ? idle : 1000;
        idle = 0;
        open_loop = 1;
    }
    if (slowloris) {
        legit_deadline_ms = 500;
        pace_us = 1000;
        idle_target = idle;
        pthread_create(&attacker, NULL, attacker_main, NULL);
        /* Let the idle connections pile up before measuring. */
        for (int i = 0; i < 200 && atomic_load(&idle_open) < idle; i++) usleep(10000);
    }
    if (strcmp(mode, "procs") == 0) {
        for (int i = 0; i < conc; i++) {
            pids[i] = fork();
            if (pids[i] == 0) { run_worker(&shm->w[i]); _exit(0); }
        }
    } else if (strcmp(mode, "threads") == 0 || slowloris || open_loop) {
        for (int i = 0; i < conc; i++) pthread_create(&threads[i], NULL, thread_main, &shm->w[i]);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    usleep(20000); /* workers parked on `go` */
    long reopened_before = atomic_load(&reopened);
    uint64_t t0 = now_ns();
    atomic_store(&shm->go, 1);
    usleep((useconds_t)(seconds * 1e6));
    atomic_store(&shm->stop, 1);
    uint64_t t1 = now_ns();
    long reopened_during = atomic_load(&reopened) - reopened_before;
    if (strcmp(mode, "procs") == 0) {
        for (int i = 0; i < conc; i++) waitpid(pids[i], NULL, 0);
    } else {
        for (int i = 0; i < conc; i++) pthread_join(threads[i], NULL);
    }
    if (slowloris) pthread_join(attacker, NULL);

    uint64_t ok = 0, fail = 0;
    static uint64_t hist[NB];
    for (int i = 0; i < conc; i++) {
        ok += shm->w[i].ok;
        fail += shm->w[i].fail;
        for (int b = 0; b < NB; b++) hist[b] += shm->w[i].hist[b];
    }
    double p50 = 0, p99 = 0;
    uint64_t seen = 0;
    int have50 = 0;
    for (int b = 0; b < NB && ok; b++) {
        seen += hist[b];
        if (!have50 && seen * 100 >= ok * 50) { p50 = bucket_upper_us(b); have50 = 1; }
        if (seen * 100 >= ok * 99) { p99 = bucket_upper_us(b); break; }
    }
    double elapsed = (double)(t1 - t0) / 1e9;
    printf("{\"mode\": \"%s\", \"concurrency\": %d, \"idle\": %d, \"seconds\": %.3f, "
           "\"ok\": %llu, \"fail\": %llu, \"rate\": %.1f, \"p50_us\": %.0f, \"p99_us\": %.0f, "
           "\"answered_pct\": %.3f, \"idle_reopened\": %ld}\n",
           mode, conc, idle, elapsed, (unsigned long long)ok, (unsigned long long)fail,
           (double)ok / elapsed, p50, p99, ok + fail ? 100.0 * (double)ok / (double)(ok + fail) : 0.0,
           reopened_during);
    return 0;
}
