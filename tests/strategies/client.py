"""Hypothesis strategies for the broker client: responses as a client may receive them, and
the file metadata and ``connect`` errors its checks judge."""

from __future__ import annotations

import errno
import os
import stat
import struct

from hypothesis import strategies as st

_RESPONSE = struct.Struct("!4sHHI")


def valid_pids() -> st.SearchStrategy[int]:
    """PIDs a client accepts: 1 .. 2**31-1 (a signed 32-bit ``pid_t``)."""
    return st.integers(min_value=1, max_value=2**31 - 1)


def valid_responses() -> st.SearchStrategy[tuple[bytes, int]]:
    """A response the client must accept, with the PID it carries."""
    return valid_pids().map(lambda pid: (_RESPONSE.pack(b"HPID", 1, 0, pid), pid))


def near_miss_responses() -> st.SearchStrategy[bytes]:
    """12-byte responses built from plausible fields: mostly valid-looking, often not."""
    return st.builds(
        _RESPONSE.pack,
        st.sampled_from([b"HPID", b"HPIX", b"hpid", b"\x00\x00\x00\x00"]),
        st.sampled_from([0, 1, 2, 0xFFFF]),
        st.sampled_from([0, 1, 2, 0xFFFF]),
        st.sampled_from([0, 1, 42, 2**31 - 1, 2**31, 2**32 - 1]),
    )


def any_received_bytes() -> st.SearchStrategy[bytes]:
    """Whatever a hostile server might send before closing: any length, any content."""
    return st.one_of(st.binary(max_size=24), near_miss_responses())


# File types a path can have: the client must accept only a directory (for the socket's
# directory) and only a socket (for the socket path).
_FILE_TYPES = [
    stat.S_IFDIR,
    stat.S_IFSOCK,
    stat.S_IFREG,
    stat.S_IFLNK,
    stat.S_IFIFO,
    stat.S_IFCHR,
    stat.S_IFBLK,
]


def stat_results() -> st.SearchStrategy[os.stat_result]:
    """``lstat``/``fstat`` results a client may see: any file type, mode bits and owner.

    Owners are mostly root (0) or a workload uid, modes mostly the safe 0711/0755 or ones
    with a group/other write bit, so every branch of the client's checks is reached often.
    """
    modes = st.sampled_from([0o711, 0o755, 0o700, 0o775, 0o777, 0o757, 0o1777, 0o666]) | (
        st.integers(0, 0o7777)
    )
    uids = st.sampled_from([0, 65534, 1000]) | st.integers(0, 2**32 - 1)
    return st.builds(
        lambda kind, mode, uid, gid, ino, size: os.stat_result(
            (kind | mode, ino, 2049, 1, uid, gid, size, 0, 0, 0)
        ),
        st.sampled_from(_FILE_TYPES),
        modes,
        uids,
        uids,
        st.integers(1, 2**63 - 1),
        st.integers(0, 2**40),
    )


def errnos() -> st.SearchStrategy[int]:
    """``errno`` values a failed ``connect`` may carry: the meaningful ones, and any other."""
    return st.sampled_from(
        [
            errno.ENOENT,
            errno.ECONNREFUSED,
            errno.EAGAIN,
            errno.ETIMEDOUT,
            errno.EACCES,
            errno.EPERM,
            errno.ENOTSOCK,
            errno.ECONNRESET,
            errno.EINTR,
        ]
    ) | st.integers(0, 4095)
