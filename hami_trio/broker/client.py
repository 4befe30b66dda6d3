"""The host PID broker's client side: what HAMi-core does, in Python.

How this works: :func:`query_host_pid` trusts the broker only after every check HAMi-core
makes has passed, in HAMi-core's order - the exact ``1`` switch, then the directory (through
one ``O_PATH`` descriptor: a real, root-owned directory without group/other write bits on a
read-only mount), the socket, a listener whose ``SO_PEERCRED`` uid is root, and one
monotonic deadline over connect, write and read - and reports the first failing check as a
:class:`Reason` (the words the C reference client prints) in a :class:`NoAnswer` value,
never an exception.  The decisions are pure functions and :func:`query_host_pid` the thin
I/O around them; stdlib only besides the codec and the switch, so a child dropped to uid
65534 can run it.  The checks, in order, with their reasons: docs/protocol.md.
"""

from __future__ import annotations

import enum
import errno
import math
import os
import socket
import stat
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hami_trio.broker.protocol import (
    RESPONSE_SIZE,
    VALID_REQUEST,
    ProtocolError,
    Status,
    parse_response,
)
from hami_trio.goparse import broker_switch_from_env

__all__ = [
    "DEFAULT_CLIENT_DEADLINE",
    "DEFAULT_CLIENT_SOCKET_PATH",
    "NoAnswer",
    "Reason",
    "check_directory",
    "check_socket",
    "classify_connect_error",
    "classify_response",
    "query_host_pid",
]

#: Where HAMi-core finds the broker inside a container (the read-only nested mount).
DEFAULT_CLIENT_SOCKET_PATH: Final = Path("/tmp/vgpulock/hostpid/broker.sock")
#: Seconds for connect + write + read together (HAMi-core's budget).
DEFAULT_CLIENT_DEADLINE: Final = 0.5
#: Largest PID a client accepts: a ``pid_t`` is a signed 32-bit integer.
_MAX_PID: Final = 2**31 - 1
_ROOT: Final = 0


class Reason(enum.StrEnum):
    """Why the client has no PID; the value is the name both clients print."""

    #: The directory or the socket does not exist (broker off or not mounted).
    MISSING = "missing"
    #: A socket file with no listener behind it (``ECONNREFUSED``).
    STALE = "stale"
    #: The directory or the socket is not owned by root.
    UNSAFE_OWNER = "unsafe_owner"
    #: The directory is writable by group/other, or is not a real directory.
    UNSAFE_MODE = "unsafe_mode"
    #: The socket path is not a socket (a regular file, a symlink, ...).
    NOT_SOCKET = "not_socket"
    #: The directory's filesystem is not mounted read-only.
    NOT_READ_ONLY = "not_read_only"
    #: The listening process is not root (``SO_PEERCRED``).
    PEER_NOT_ROOT = "peer_not_root"
    #: A response that is short, or not magic/version 1/status 0/PID > 0.
    MALFORMED = "malformed"
    #: The deadline expired during connect, write or read.
    TIMEOUT = "timeout"
    #: The broker closed or reset the connection without an answer, or another socket error.
    REFUSED = "refused"
    #: ``LIBVGPU_HOSTPID_BROKER`` is not exactly ``1``.
    DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """The broker gave no usable answer: the caller uses its other discovery path.

    Attributes:
        reason: the first check that failed.
        detail: one human line naming the path and what was found.
    """

    reason: Reason
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def check_directory(
    path: Path, st: os.stat_result, read_only: bool, *, expected_uid: int = _ROOT
) -> NoAnswer | None:
    """Judge the socket's directory from its ``fstat`` and mount flag (pure).

    Args:
        path: the directory, for the message.
        st: its ``stat`` result (not following a symlink).
        read_only: whether ``statvfs`` reports ``ST_RDONLY``.
        expected_uid: the owner to trust; root in production, changed only by tests.

    Returns:
        ``None`` if the directory is trustworthy, else why not.
    """
    if not stat.S_ISDIR(st.st_mode):
        return NoAnswer(Reason.UNSAFE_MODE, f"{path}: not a directory")
    if st.st_uid != expected_uid:
        return NoAnswer(
            Reason.UNSAFE_OWNER, f"{path}: directory owned by uid {st.st_uid}, not {expected_uid}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        return NoAnswer(
            Reason.UNSAFE_MODE, f"{path}: directory mode {mode:04o} has group/other write bits"
        )
    if not read_only:
        return NoAnswer(Reason.NOT_READ_ONLY, f"{path}: directory is not on a read-only mount")
    return None


def check_socket(path: Path, st: os.stat_result, *, expected_uid: int = _ROOT) -> NoAnswer | None:
    """Judge the socket path from its ``lstat`` (pure).

    Returns:
        ``None`` if it is a socket owned by the expected uid, else why not.
    """
    if not stat.S_ISSOCK(st.st_mode):
        kind = "symlink" if stat.S_ISLNK(st.st_mode) else f"mode {st.st_mode:06o}"
        return NoAnswer(Reason.NOT_SOCKET, f"{path}: not a socket ({kind})")
    if st.st_uid != expected_uid:
        return NoAnswer(
            Reason.UNSAFE_OWNER, f"{path}: socket owned by uid {st.st_uid}, not {expected_uid}"
        )
    return None


def classify_connect_error(path: Path, err: int) -> NoAnswer:
    """What a failed ``connect`` means (pure).

    Args:
        path: the socket path, for the message.
        err: the ``errno`` of the failed ``connect``.
    """
    if err == errno.ENOENT:
        return NoAnswer(Reason.MISSING, f"{path}: socket vanished before connect")
    if err == errno.ECONNREFUSED:
        return NoAnswer(Reason.STALE, f"{path}: connection refused (stale socket, no broker)")
    if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ETIMEDOUT):
        return NoAnswer(Reason.TIMEOUT, f"{path}: deadline expired waiting for the backlog")
    return NoAnswer(Reason.REFUSED, f"{path}: connect: {os.strerror(err)}")


def classify_response(path: Path, data: bytes) -> int | NoAnswer:
    """Accept a response only if it is exactly what the protocol allows: 12 bytes, the magic,
    version 1, status 0 and 0 < PID < 2**31 (pure).

    Args:
        path: the socket path, for the message.
        data: the bytes read (12 unless the peer closed early).

    Returns:
        The PID (0 < PID < 2**31), or :class:`NoAnswer` with ``malformed``.
    """
    try:
        response = parse_response(data)
    except ProtocolError as exc:
        return NoAnswer(Reason.MALFORMED, f"{path}: {exc}")
    if response.status is not Status.OK:
        return NoAnswer(Reason.MALFORMED, f"{path}: broker answered status {int(response.status)}")
    if not 0 < response.pid <= _MAX_PID:
        return NoAnswer(Reason.MALFORMED, f"{path}: invalid PID {response.pid} in a success")
    return response.pid


def _check_paths(path: Path, expected_uid: int) -> NoAnswer | None:
    directory = path.parent
    try:
        dfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return NoAnswer(Reason.MISSING, f"{directory}: directory does not exist")
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return NoAnswer(
                Reason.UNSAFE_MODE, f"{directory}: not a real directory (symlink or other type)"
            )
        return NoAnswer(Reason.REFUSED, f"{directory}: open: {exc.strerror}")
    try:
        read_only = bool(os.fstatvfs(dfd).f_flag & os.ST_RDONLY)
        problem = check_directory(directory, os.fstat(dfd), read_only, expected_uid=expected_uid)
        if problem is not None:
            return problem
        try:
            st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return NoAnswer(Reason.MISSING, f"{path}: socket does not exist")
        return check_socket(path, st, expected_uid=expected_uid)
    except OSError as exc:
        return NoAnswer(Reason.REFUSED, f"{directory}: {exc.strerror}")
    finally:
        os.close(dfd)


def _connect(sock: socket.socket, path: Path, deadline: float) -> NoAnswer | None:
    left = deadline - time.monotonic()
    if left < 1e-6:
        return NoAnswer(Reason.TIMEOUT, f"{path}: deadline expired before connect")
    # Blocking connect bounded by SO_SNDTIMEO: it waits for backlog room, where a non-blocking
    # one fails with EAGAIN.  The timeout must not round to 0, which would mean "forever".
    seconds = int(left)
    micros = max(int((left - seconds) * 1e6), 0 if seconds else 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros))
    try:
        sock.connect(os.fspath(path))
    except OSError as exc:
        if exc.errno is None:  # e.g. "AF_UNIX path too long", raised before any syscall
            return NoAnswer(Reason.REFUSED, f"{path}: {exc}")
        return classify_connect_error(path, exc.errno)
    return None


def _exchange(sock: socket.socket, path: Path, deadline: float) -> int | NoAnswer:
    data = b""
    try:
        sock.settimeout(max(deadline - time.monotonic(), 1e-6))
        sock.sendall(VALID_REQUEST)
        while len(data) < RESPONSE_SIZE:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(RESPONSE_SIZE - len(data))
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        return NoAnswer(
            Reason.TIMEOUT,
            f"{path}: deadline expired after {len(data)} of {RESPONSE_SIZE} response bytes",
        )
    except OSError as exc:
        if data:
            return NoAnswer(
                Reason.MALFORMED, f"{path}: short response ({len(data)} bytes), {exc.strerror}"
            )
        return NoAnswer(Reason.REFUSED, f"{path}: {exc.strerror or exc}")
    if not data:
        return NoAnswer(Reason.REFUSED, f"{path}: the broker closed without an answer")
    return classify_response(path, data)


def query_host_pid(
    socket_path: str | os.PathLike[str] = DEFAULT_CLIENT_SOCKET_PATH,
    deadline: float = DEFAULT_CLIENT_DEADLINE,
    *,
    enabled: bool | None = None,
    env: Mapping[str, str] | None = None,
    expected_uid: int = _ROOT,
) -> int | NoAnswer:
    """Ask the broker for the calling process's host PID, as HAMi-core does.

    Args:
        socket_path: the broker socket as the caller sees it (inside a container:
            ``/tmp/vgpulock/hostpid/broker.sock``).
        deadline: seconds for connect + write + read together (must be > 0).
        enabled: ``None`` follows ``LIBVGPU_HOSTPID_BROKER`` (on only for exactly ``"1"``);
            ``True``/``False`` override it (the CLI's ``--ignore-switch``, tests).
        env: the environment to read the switch from (default ``os.environ``).
        expected_uid: the uid that must own the directory and socket and run the broker.
            Root in production; **tests only** may change it.

    Returns:
        The host PID, or :class:`NoAnswer` naming the first check that failed.  Expected
        failures never raise.

    Raises:
        ValueError: ``deadline`` is not a positive number (a programming error).
    """
    if not (math.isfinite(deadline) and deadline > 0):
        raise ValueError(f"deadline must be a finite number of seconds > 0, got {deadline!r}")
    stop = time.monotonic() + deadline
    if enabled is None:
        enabled = broker_switch_from_env(os.environ if env is None else env)
    if not enabled:
        return NoAnswer(Reason.DISABLED, "LIBVGPU_HOSTPID_BROKER is not exactly '1'")
    path = Path(socket_path)
    problem = _check_paths(path, expected_uid)
    if problem is not None:
        return problem
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:  # out of descriptors or memory: no answer, like any other failure
        return NoAnswer(Reason.REFUSED, f"socket: {exc.strerror}")
    with sock:
        try:
            problem = _connect(sock, path, stop)
            if problem is not None:
                return problem
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3I"))
        except OSError as exc:
            return NoAnswer(Reason.REFUSED, f"{path}: {exc.strerror or exc}")
        _pid, peer_uid, _gid = struct.unpack("3I", creds)
        if peer_uid != expected_uid:
            return NoAnswer(
                Reason.PEER_NOT_ROOT,
                f"{path}: broker process runs as uid {peer_uid}, not {expected_uid}",
            )
        return _exchange(sock, path, stop)
