/*
 * Minimal C reference server for the host PID broker protocol v1 (docs/protocol.md).
 *
 * It exists only as a yardstick for bench/broker_load.py: the same protocol and the same
 * connection-pressure rules as hami-trio's broker, written the way a careful C programmer
 * would (one thread, epoll, non-blocking sockets), so that "our exchanges/s divided by the
 * reference's" measures what trio and Python cost, not a difference in behaviour.
 *
 *   - one request (8 bytes: "HPID", u16 version 1, u16 command 1) and one response
 *     (12 bytes: "HPID", u16 version 1, u16 status, u32 pid) per connection, big-endian;
 *   - invalid request -> status 1, PID 0; valid -> SO_PEERCRED pid; pid <= 0 -> no reply;
 *   - a connection whose bytes are already there is answered straight after accept; others
 *     wait in epoll, at most MAX_EXCHANGES at once (beyond that: closed at once), each closed
 *     without answer DEADLINE_MS after accept;
 *   - EMFILE/ENFILE/ENOBUFS/ENOMEM on accept back off 5 ms doubling to 1 s.
 *
 * No filesystem boundary (lock file, ownership checks): the benchmark runs it on a fresh
 * temporary path.  Build: gcc -O2 -Wall -o ref_server ref_server.c
 * Usage: ref_server SOCKET_PATH [MAX_EXCHANGES [DEADLINE_MS]]; SIGTERM/SIGINT stop it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536
#define ACCEPT_BATCH 128

struct conn {
    int fd; /* -1 when the slot is free */
    int len;
    uint64_t deadline_ns;
    unsigned char buf[8];
    int prev, next; /* FIFO by deadline (all deadlines are accept + DEADLINE_MS) */
};

static struct conn conns[MAX_FDS];
static int head = -1, tail = -1, active = 0;
static volatile sig_atomic_t stopping = 0;
static int max_exchanges = 4096;
static uint64_t deadline_ns = 500000000ull;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static void reply(int fd, const unsigned char *req) {
    unsigned char out[12];
    uint16_t status = 0;
    uint32_t pid = 0;
    if (memcmp(req, "HPID", 4) != 0 || req[4] != 0 || req[5] != 1 || req[6] != 0 ||
        req[7] != 1) {
        status = 1;
    } else {
        struct ucred cred;
        socklen_t len = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0)
            return; /* no reply */
        pid = (uint32_t)cred.pid;
    }
    uint16_t version_be = htons(1), status_be = htons(status);
    uint32_t pid_be = htonl(pid);
    memcpy(out, "HPID", 4);
    memcpy(out + 4, &version_be, 2);
    memcpy(out + 6, &status_be, 2);
    memcpy(out + 8, &pid_be, 4);
    (void)send(fd, out, sizeof(out), MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void unlink_fifo(int fd) {
    struct conn *c = &conns[fd];
    if (c->prev >= 0) conns[c->prev].next = c->next; else head = c->next;
    if (c->next >= 0) conns[c->next].prev = c->prev; else tail = c->prev;
    c->fd = -1;
    active--;
}

static void drop(int epfd, int fd) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
    unlink_fifo(fd);
    close(fd);
}

/* Read what is there; returns 1 if the exchange ended (fd closed), 0 if it still waits. */
static int advance(int fd, unsigned char *buf, int *len) {
    unsigned char tmp[64];
    ssize_t n = recv(fd, tmp, sizeof(tmp), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) { close(fd); return 1; }
    int take = (int)n < 8 - *len ? (int)n : 8 - *len;
    memcpy(buf + *len, tmp, (size_t)take);
    *len += take;
    if (*len < 8) return 0;
    reply(fd, buf);
    close(fd);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SOCKET_PATH [MAX_EXCHANGES [DEADLINE_MS]]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    if (argc > 2) max_exchanges = atoi(argv[2]);
    if (argc > 3) deadline_ns = (uint64_t)atoll(argv[3]) * 1000000ull;
    for (int i = 0; i < MAX_FDS; i++) conns[i].fd = -1;

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(addr.sun_path)) { fprintf(stderr, "path too long\n"); return 1; }
    strcpy(addr.sun_path, path);
    unlink(path);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) != 0) { perror("bind"); return 1; }
    chmod(path, 0666);
    if (listen(lfd, 4096) != 0) { perror("listen"); return 1; }

    int epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev);
    fprintf(stderr, "ref_server listening on %s\n", path);

    struct epoll_event events[256];
    uint64_t backoff_ns = 0;
    while (!stopping) {
        int timeout_ms = -1;
        if (head >= 0) {
            uint64_t now = now_ns();
            uint64_t dl = conns[head].deadline_ns;
            timeout_ms = dl <= now ? 0 : (int)((dl - now) / 1000000ull) + 1;
        }
        int n = epoll_wait(epfd, events, 256, timeout_ms);
        if (n < 0 && errno != EINTR) { perror("epoll_wait"); return 1; }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd != lfd) {
                if (conns[fd].fd == fd) {
                    int len = conns[fd].len;
                    /* close() in advance() also removes the fd from epoll */
                    if (advance(fd, conns[fd].buf, &len)) unlink_fifo(fd);
                    else conns[fd].len = len;
                }
                continue;
            }
            for (int k = 0; k < ACCEPT_BATCH; k++) {
                int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
                if (cfd < 0) {
                    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                        errno == ENOMEM) {
                        backoff_ns = backoff_ns ? backoff_ns * 2 : 5000000ull;
                        if (backoff_ns > 1000000000ull) backoff_ns = 1000000000ull;
                        struct timespec ts = {0, 0};
                        ts.tv_sec = (time_t)(backoff_ns / 1000000000ull);
                        ts.tv_nsec = (long)(backoff_ns % 1000000000ull);
                        nanosleep(&ts, NULL);
                        break;
                    }
                    if (errno == EINTR) continue;
                    perror("accept4");
                    return 1;
                }
                backoff_ns = 0;
                if (cfd >= MAX_FDS) { close(cfd); continue; }
                unsigned char buf[8];
                int len = 0;
                if (advance(cfd, buf, &len)) continue;
                if (active >= max_exchanges) { close(cfd); continue; }
                struct conn *c = &conns[cfd];
                c->fd = cfd;
                c->len = len;
                memcpy(c->buf, buf, (size_t)len);
                c->deadline_ns = now_ns() + deadline_ns;
                c->next = -1;
                c->prev = tail;
                if (tail >= 0) conns[tail].next = cfd; else head = cfd;
                tail = cfd;
                active++;
                struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                epoll_ctl(epfd, EPOLL_CTL_ADD, cfd, &cev);
            }
        }
        uint64_t now = now_ns();
        while (head >= 0 && conns[head].deadline_ns <= now) drop(epfd, head);
    }
    /* Remove our socket and leave. */
    unlink(path);
    return 0;
}
