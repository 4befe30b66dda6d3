/*
 * hostpid_client.h - reference client of the HAMi host PID broker, protocol version 1.
 *
 * This is what HAMi-core (inside every CUDA container) must do to learn the host PID of the
 * calling process from the broker, written as a small C99 library with no dependencies.  It
 * trusts an answer only after every check below passed; any failure is a
 * "no answer" with a reason, and the caller falls back to its existing discovery path.
 *
 * Checks, in order (the first failing one is the reason reported):
 *   1. switch      LIBVGPU_HOSTPID_BROKER is exactly "1" (hostpid_lookup only)  -> DISABLED
 *   2. directory   the socket's directory exists                                  -> MISSING
 *                  it is a real directory, not a symlink                          -> UNSAFE_MODE
 *                  owned by root                                                  -> UNSAFE_OWNER
 *                  no group/other write bits                                      -> UNSAFE_MODE
 *                  its filesystem is mounted read-only (statvfs ST_RDONLY)        -> NOT_READ_ONLY
 *   3. socket      the socket path exists                                         -> MISSING
 *                  it is a socket (lstat S_ISSOCK; a symlink is not)              -> NOT_SOCKET
 *                  owned by root                                                  -> UNSAFE_OWNER
 *   4. connect     someone listens (ECONNREFUSED = stale socket file)             -> STALE
 *                  the listening peer's SO_PEERCRED uid is root                   -> PEER_NOT_ROOT
 *   5. exchange    send the 8-byte request, read the 12-byte response; one
 *                  monotonic deadline covers connect + write + read               -> TIMEOUT
 *                  the peer closed or reset the connection without any answer     -> REFUSED
 *                  anything but magic "HPID", version 1, status 0, PID > 0        -> MALFORMED
 *
 * "root" is HOSTPID_EXPECTED_UID, 0 unless the library is compiled with
 * -DHOSTPID_EXPECTED_UID=N.  That define exists only for tests of a non-root setup; a client
 * built for production must never change it (see docs/protocol.md, "Client rules").
 */
#ifndef HOSTPID_CLIENT_H
#define HOSTPID_CLIENT_H

#include <stddef.h>
#include <sys/types.h>

#define HOSTPID_DEFAULT_SOCKET_PATH "/tmp/vgpulock/hostpid/broker.sock"
#define HOSTPID_DEFAULT_DEADLINE_MS 500L
#define HOSTPID_SWITCH_ENV "LIBVGPU_HOSTPID_BROKER"

/* TEST ONLY: the uid that must own the directory and the socket and run the broker. */
#ifndef HOSTPID_EXPECTED_UID
#define HOSTPID_EXPECTED_UID 0
#endif

/* The outcome of one query.  The names (hostpid_status_name) are shared with the Python
 * client, hami_trio.broker.client.Reason, so tests and operators see the same words. */
typedef enum {
    HOSTPID_OK = 0,
    HOSTPID_MISSING,       /* the directory or the socket does not exist */
    HOSTPID_STALE,         /* a socket file with no listener (ECONNREFUSED) */
    HOSTPID_UNSAFE_OWNER,  /* directory or socket not owned by root */
    HOSTPID_UNSAFE_MODE,   /* directory writable by group/other, or not a real directory */
    HOSTPID_NOT_SOCKET,    /* the socket path is not a socket (regular file, symlink, ...) */
    HOSTPID_NOT_READ_ONLY, /* the directory's filesystem is not mounted read-only */
    HOSTPID_PEER_NOT_ROOT, /* the listening process is not root (SO_PEERCRED) */
    HOSTPID_MALFORMED,     /* a response that is short or not magic/v1/status 0/PID > 0 */
    HOSTPID_TIMEOUT,       /* the deadline expired during connect, write or read */
    HOSTPID_REFUSED,       /* the broker closed without answering, or another socket error */
    HOSTPID_DISABLED       /* LIBVGPU_HOSTPID_BROKER is not exactly "1" */
} hostpid_status;

/* The stable lower-case name of a status ("ok", "missing", ...). */
const char *hostpid_status_name(hostpid_status status);

/* 1 when LIBVGPU_HOSTPID_BROKER is exactly "1", else 0 ("true", " 1", "01", "" are off). */
int hostpid_broker_enabled(void);

/*
 * Ask the broker at socket_path for the caller's host PID, ignoring the switch.
 *
 * deadline_ms bounds connect + write + read together (a monotonic clock); <= 0 means the
 * default of 500 ms, more than one hour is clamped to one hour.  On HOSTPID_OK *pid_out
 * holds the PID; otherwise it is left untouched.
 * detail (may be NULL) receives a one-line human explanation of the outcome.
 * Never blocks longer than the deadline after the filesystem checks, never raises a signal
 * (SIGPIPE is suppressed), and never returns a PID it did not read from a valid response.
 */
hostpid_status hostpid_query(const char *socket_path, long deadline_ms, pid_t *pid_out,
                             char *detail, size_t detail_len);

/* hostpid_query, but only when hostpid_broker_enabled(); HOSTPID_DISABLED otherwise.  This
 * is the entry point HAMi-core would call. */
hostpid_status hostpid_lookup(const char *socket_path, long deadline_ms, pid_t *pid_out,
                              char *detail, size_t detail_len);

#endif /* HOSTPID_CLIENT_H */
