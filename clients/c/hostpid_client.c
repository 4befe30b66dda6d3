/*
 * hostpid_client.c - the checks and the exchange described in hostpid_client.h.
 *
 * How it works: the directory is opened once with O_PATH|O_NOFOLLOW and every filesystem
 * check (owner, mode, read-only mount, the socket entry) is made through that descriptor, so
 * the checks all look at the same directory.  The socket itself must be connected by path;
 * between the checks and connect() nothing can be swapped because the directory is
 * root-owned, not writable by group/other and on a read-only mount - which is exactly what
 * was just checked.
 *
 * Deadline: one CLOCK_MONOTONIC deadline is taken before the filesystem checks and covers
 * connect + write + read.  connect() runs in blocking mode with SO_SNDTIMEO set to the time
 * left: on Linux a non-blocking AF_UNIX connect to a listener whose backlog is full fails at
 * once with EAGAIN (poll cannot wait for room), while a blocking one sleeps until there is
 * room or SO_SNDTIMEO expires.  During a storm of simultaneous clients that difference is
 * "everyone answered" versus "spurious failures".  After connect every send/recv uses
 * MSG_DONTWAIT and waits in ppoll() for the time left, so nothing blocks past the deadline.
 */
#define _GNU_SOURCE /* O_PATH, SO_PEERCRED/struct ucred, SOCK_CLOEXEC, ppoll */

#include "hostpid_client.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_LEN 8
#define RESPONSE_LEN 12
#define PROTOCOL_VERSION 1
#define COMMAND_GET_HOST_PID 1
#define STATUS_SUCCESS 0

static const char *const status_names[] = {
    "ok",      "missing",       "stale",         "unsafe_owner", "unsafe_mode", "not_socket",
    "not_read_only", "peer_not_root", "malformed", "timeout",      "refused",     "disabled",
};

const char *hostpid_status_name(hostpid_status status) {
    if ((unsigned)status < sizeof status_names / sizeof status_names[0]) {
        return status_names[status];
    }
    return "unknown";
}

int hostpid_broker_enabled(void) {
    const char *value = getenv(HOSTPID_SWITCH_ENV);
    return value != NULL && strcmp(value, "1") == 0;
}

/* Write a formatted detail line (if the caller wants one) and return status. */
static hostpid_status fail(hostpid_status status, char *detail, size_t detail_len,
                           const char *fmt, ...) {
    if (detail != NULL && detail_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, detail_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* Nanoseconds left before the deadline, at least 0. */
static int64_t left_ns(int64_t deadline) {
    int64_t left = deadline - now_ns();
    return left > 0 ? left : 0;
}

/*
 * Wait until fd is ready for events or the deadline passes.
 * Returns 1 when ready (or in error/hang-up state: the next syscall reports it),
 * 0 on timeout, -1 on a poll error (errno set).
 */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        int64_t left = left_ns(deadline);
        if (left == 0) {
            return 0;
        }
        struct timespec ts = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        struct pollfd pfd = {fd, events, 0};
        int n = ppoll(&pfd, 1, &ts, NULL);
        if (n > 0) {
            return 1;
        }
        if (n == 0) {
            continue; /* ppoll may wake a little early; the loop re-checks the clock */
        }
        if (errno != EINTR) {
            return -1;
        }
    }
}

/* Split "a/b/broker.sock" into its directory ("a/b") and base name; "x" -> ".". */
static int split_path(const char *path, char *dir, size_t dir_len, const char **base) {
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        if (dir_len < 2) {
            return -1;
        }
        strcpy(dir, ".");
        *base = path;
        return 0;
    }
    size_t n = (size_t)(slash - path);
    if (n == 0) {
        n = 1; /* "/broker.sock": the directory is "/" */
    }
    if (n >= dir_len) {
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    *base = slash + 1;
    return 0;
}

/* Connect fd to addr, waiting for backlog room at most until the deadline. */
static hostpid_status connect_by(int fd, const struct sockaddr_un *addr, int64_t deadline,
                                 const char *path, char *detail, size_t detail_len) {
    for (;;) {
        int64_t left = left_ns(deadline);
        if (left < 1000) {
            return fail(HOSTPID_TIMEOUT, detail, detail_len, "%s: deadline expired in connect",
                        path);
        }
        /* SO_SNDTIMEO of zero means "forever"; left >= 1 us keeps it non-zero. */
        struct timeval tv = {(time_t)(left / 1000000000), (suseconds_t)(left % 1000000000 / 1000)};
        if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
            return fail(HOSTPID_REFUSED, detail, detail_len, "%s: setsockopt SO_SNDTIMEO: %s", path,
                        strerror(errno));
        }
        if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0) {
            return HOSTPID_OK;
        }
        switch (errno) {
        case EINTR:
            continue; /* the socket is still unconnected; retry with the time left */
        case ENOENT:
            return fail(HOSTPID_MISSING, detail, detail_len, "%s: socket vanished before connect",
                        path);
        case ECONNREFUSED:
            return fail(HOSTPID_STALE, detail, detail_len,
                        "%s: connection refused (stale socket, no broker listening)", path);
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
        case ETIMEDOUT:
            return fail(HOSTPID_TIMEOUT, detail, detail_len,
                        "%s: deadline expired waiting for the broker's backlog", path);
        default:
            return fail(HOSTPID_REFUSED, detail, detail_len, "%s: connect: %s", path,
                        strerror(errno));
        }
    }
}

/* Send the whole request before the deadline. */
static hostpid_status send_request(int fd, int64_t deadline, const char *path, char *detail,
                                   size_t detail_len) {
    static const unsigned char request[REQUEST_LEN] = {
        'H', 'P', 'I', 'D', 0, PROTOCOL_VERSION, 0, COMMAND_GET_HOST_PID,
    };
    size_t sent = 0;
    while (sent < REQUEST_LEN) {
        ssize_t n = send(fd, request + sent, REQUEST_LEN - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int ready = wait_fd(fd, POLLOUT, deadline);
            if (ready == 0) {
                return fail(HOSTPID_TIMEOUT, detail, detail_len,
                            "%s: deadline expired sending the request", path);
            }
            if (ready < 0) {
                return fail(HOSTPID_REFUSED, detail, detail_len, "%s: poll: %s", path,
                            strerror(errno));
            }
            continue;
        }
        return fail(HOSTPID_REFUSED, detail, detail_len, "%s: send: %s", path,
                    n < 0 ? strerror(errno) : "sent nothing");
    }
    return HOSTPID_OK;
}

/* Read exactly RESPONSE_LEN bytes before the deadline. */
static hostpid_status read_response(int fd, int64_t deadline, unsigned char *buf,
                                    const char *path, char *detail, size_t detail_len) {
    size_t got = 0;
    while (got < RESPONSE_LEN) {
        ssize_t n = recv(fd, buf + got, RESPONSE_LEN - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0) {
            if (got == 0) {
                return fail(HOSTPID_REFUSED, detail, detail_len,
                            "%s: the broker closed the connection without an answer", path);
            }
            return fail(HOSTPID_MALFORMED, detail, detail_len,
                        "%s: short response: %zu of %d bytes before end of stream", path, got,
                        RESPONSE_LEN);
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int ready = wait_fd(fd, POLLIN, deadline);
            if (ready == 0) {
                return fail(HOSTPID_TIMEOUT, detail, detail_len,
                            "%s: deadline expired after %zu of %d response bytes", path, got,
                            RESPONSE_LEN);
            }
            if (ready < 0) {
                return fail(HOSTPID_REFUSED, detail, detail_len, "%s: poll: %s", path,
                            strerror(errno));
            }
            continue;
        }
        if (got > 0) {
            return fail(HOSTPID_MALFORMED, detail, detail_len,
                        "%s: short response: %zu of %d bytes, then %s", path, got, RESPONSE_LEN,
                        strerror(errno));
        }
        return fail(HOSTPID_REFUSED, detail, detail_len, "%s: recv: %s", path, strerror(errno));
    }
    return HOSTPID_OK;
}

static unsigned get_u16(const unsigned char *p) { return (unsigned)p[0] << 8 | (unsigned)p[1]; }

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Accept only magic HPID, version 1, status 0 and 0 < PID <= INT_MAX. */
static hostpid_status parse_response(const unsigned char *buf, pid_t *pid_out, const char *path,
                                     char *detail, size_t detail_len) {
    if (memcmp(buf, "HPID", 4) != 0) {
        return fail(HOSTPID_MALFORMED, detail, detail_len,
                    "%s: bad magic %02x%02x%02x%02x (want 48504944 \"HPID\")", path, buf[0], buf[1],
                    buf[2], buf[3]);
    }
    unsigned version = get_u16(buf + 4);
    if (version != PROTOCOL_VERSION) {
        return fail(HOSTPID_MALFORMED, detail, detail_len, "%s: protocol version %u (want %d)",
                    path, version, PROTOCOL_VERSION);
    }
    unsigned status = get_u16(buf + 6);
    if (status != STATUS_SUCCESS) {
        return fail(HOSTPID_MALFORMED, detail, detail_len,
                    "%s: broker answered status %u%s", path, status,
                    status == 1 ? " (invalid request)" : "");
    }
    uint32_t pid = get_u32(buf + 8);
    if (pid == 0 || pid > (uint32_t)INT_MAX) {
        return fail(HOSTPID_MALFORMED, detail, detail_len, "%s: invalid PID %lu in a success",
                    path, (unsigned long)pid);
    }
    *pid_out = (pid_t)pid;
    return fail(HOSTPID_OK, detail, detail_len, "%s: host PID %lu", path, (unsigned long)pid);
}

/* Every check up to and including the socket entry; see the table in hostpid_client.h. */
static hostpid_status check_paths(const char *path, char *detail, size_t detail_len) {
    char dir[PATH_MAX];
    const char *base;
    if (split_path(path, dir, sizeof dir, &base) != 0 || *base == '\0') {
        return fail(HOSTPID_MISSING, detail, detail_len, "%s: not a socket path", path);
    }
    int dfd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        int err = errno;
        if (err == ENOENT) {
            return fail(HOSTPID_MISSING, detail, detail_len, "%s: directory does not exist", dir);
        }
        if (err == ELOOP || err == ENOTDIR) {
            return fail(HOSTPID_UNSAFE_MODE, detail, detail_len,
                        "%s: not a real directory (symlink or other type)", dir);
        }
        return fail(HOSTPID_REFUSED, detail, detail_len, "%s: open: %s", dir, strerror(err));
    }
    hostpid_status result = HOSTPID_OK;
    struct stat st;
    struct statvfs vfs;
    if (fstat(dfd, &st) != 0) {
        result = fail(HOSTPID_REFUSED, detail, detail_len, "%s: fstat: %s", dir, strerror(errno));
    } else if (st.st_uid != (uid_t)HOSTPID_EXPECTED_UID) {
        result = fail(HOSTPID_UNSAFE_OWNER, detail, detail_len,
                      "%s: directory owned by uid %lu, not %lu", dir, (unsigned long)st.st_uid,
                      (unsigned long)HOSTPID_EXPECTED_UID);
    } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        result = fail(HOSTPID_UNSAFE_MODE, detail, detail_len,
                      "%s: directory mode %04o has group/other write bits", dir,
                      (unsigned)(st.st_mode & 07777));
    } else if (fstatvfs(dfd, &vfs) != 0) {
        result = fail(HOSTPID_REFUSED, detail, detail_len, "%s: fstatvfs: %s", dir,
                      strerror(errno));
    } else if ((vfs.f_flag & ST_RDONLY) == 0) {
        result = fail(HOSTPID_NOT_READ_ONLY, detail, detail_len,
                      "%s: directory is not on a read-only mount", dir);
    } else if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        int err = errno;
        result = err == ENOENT ? fail(HOSTPID_MISSING, detail, detail_len,
                                      "%s: socket does not exist", path)
                               : fail(HOSTPID_REFUSED, detail, detail_len, "%s: lstat: %s", path,
                                      strerror(err));
    } else if (!S_ISSOCK(st.st_mode)) {
        result = fail(HOSTPID_NOT_SOCKET, detail, detail_len, "%s: not a socket (mode %06o)",
                      path, (unsigned)st.st_mode);
    } else if (st.st_uid != (uid_t)HOSTPID_EXPECTED_UID) {
        result = fail(HOSTPID_UNSAFE_OWNER, detail, detail_len,
                      "%s: socket owned by uid %lu, not %lu", path, (unsigned long)st.st_uid,
                      (unsigned long)HOSTPID_EXPECTED_UID);
    }
    close(dfd);
    return result;
}

hostpid_status hostpid_query(const char *socket_path, long deadline_ms, pid_t *pid_out,
                             char *detail, size_t detail_len) {
    if (deadline_ms <= 0) {
        deadline_ms = HOSTPID_DEFAULT_DEADLINE_MS;
    } else if (deadline_ms > 3600L * 1000) {
        deadline_ms = 3600L * 1000; /* keeps the nanosecond arithmetic far from overflow */
    }
    int64_t deadline = now_ns() + (int64_t)deadline_ms * 1000000;
    const char *path = socket_path != NULL ? socket_path : HOSTPID_DEFAULT_SOCKET_PATH;

    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) {
        return fail(HOSTPID_REFUSED, detail, detail_len,
                    "%s: path longer than a Unix socket address (%zu bytes)", path,
                    sizeof addr.sun_path - 1);
    }
    memcpy(addr.sun_path, path, strlen(path) + 1);

    hostpid_status result = check_paths(path, detail, detail_len);
    if (result != HOSTPID_OK) {
        return result;
    }

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return fail(HOSTPID_REFUSED, detail, detail_len, "socket: %s", strerror(errno));
    }
    unsigned char response[RESPONSE_LEN];
    struct ucred cred;
    socklen_t cred_len = sizeof cred;
    result = connect_by(fd, &addr, deadline, path, detail, detail_len);
    if (result != HOSTPID_OK) {
        /* fall through to close */
    } else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 ||
               cred_len != sizeof cred) {
        result = fail(HOSTPID_REFUSED, detail, detail_len, "%s: SO_PEERCRED: %s", path,
                      strerror(errno));
    } else if (cred.uid != (uid_t)HOSTPID_EXPECTED_UID) {
        result = fail(HOSTPID_PEER_NOT_ROOT, detail, detail_len,
                      "%s: broker process runs as uid %lu, not %lu", path,
                      (unsigned long)cred.uid, (unsigned long)HOSTPID_EXPECTED_UID);
    } else if ((result = send_request(fd, deadline, path, detail, detail_len)) != HOSTPID_OK) {
        /* reported by send_request */
    } else if ((result = read_response(fd, deadline, response, path, detail, detail_len)) !=
               HOSTPID_OK) {
        /* reported by read_response */
    } else {
        result = parse_response(response, pid_out, path, detail, detail_len);
    }
    close(fd);
    return result;
}

hostpid_status hostpid_lookup(const char *socket_path, long deadline_ms, pid_t *pid_out,
                              char *detail, size_t detail_len) {
    if (!hostpid_broker_enabled()) {
        return fail(HOSTPID_DISABLED, detail, detail_len,
                    "%s is not exactly \"1\"; the broker is not used", HOSTPID_SWITCH_ENV);
    }
    return hostpid_query(socket_path, deadline_ms, pid_out, detail, detail_len);
}
