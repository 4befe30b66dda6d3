"""The host PID broker server on trio.

How this works: every ``trio.socket`` call and task spawn is a trip through the scheduler,
too slow for microsecond exchanges, so the broker drives a raw non-blocking listening socket
itself.  The accept loop waits on it with :func:`trio.lowlevel.wait_readable` and accepts up
to :data:`ACCEPT_BATCH` connections; one whose 8 bytes are already there is answered inline
(the **fast path**: one compare with the only valid request - the measured exception to the
codec's front door - then ``SO_PEERCRED`` and the 12-byte answer, no task, no slot).  The
others, after one retry, take a :class:`trio.CapacityLimiter` token without waiting (full:
closed and counted) and a task reads the rest through the codec's
:class:`~hami_trio.broker.protocol.RequestReader` under one deadline from accept.  Transient
accept errors back off; others end the broker.  :func:`serve_broker` reports a
:class:`BrokerHandle` once the socket listens.  The answers and the connection-pressure
policy: docs/protocol.md and docs/security.md.
"""

from __future__ import annotations

import _socket
import errno
import logging
import math
import resource
import socket
import struct
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import trio
from prometheus_client import CollectorRegistry

from hami_trio._trio import raise_fd_limit
from hami_trio.broker.boundary import (
    DEFAULT_SOCKET_PATH,
    BrokerSocket,
    default_lock_path,
    open_broker_socket,
)
from hami_trio.broker.protocol import (
    INVALID_RESPONSE,
    RESPONSE_SIZE,
    VALID_REQUEST,
    ProtocolError,
    RequestReader,
    encode_response,
)
from hami_trio.broker.stats import DURATION_BUCKETS, BrokerCollector, BrokerStats, Outcome
from hami_trio.errors import BrokerError, ConfigError
from hami_trio.logs import RateLimiter

__all__ = [
    "ACCEPT_BATCH",
    "DEFAULT_EXCHANGE_DEADLINE",
    "DEFAULT_MAX_EXCHANGES",
    "FD_RESERVE",
    "BrokerConfig",
    "BrokerHandle",
    "accept_backoff",
    "exchanges_within",
    "serve_broker",
]

logger = logging.getLogger(__name__)

#: Exchanges that may wait for their request at once.  Sized to the file-descriptor budget,
#: not to a worker pool: a waiting exchange costs one descriptor and one timer.
DEFAULT_MAX_EXCHANGES: Final = 4096
#: Total time one exchange may take, from accept to answer (upstream: 500 ms).
DEFAULT_EXCHANGE_DEADLINE: Final = 0.5
#: Connections accepted per wake-up before the loop yields to other tasks.
ACCEPT_BATCH: Final = 128
#: Descriptors kept free for the rest of the agent beyond one per slot.
FD_RESERVE: Final = 256
#: ``listen()`` backlog; the kernel caps it at ``net.core.somaxconn``.
LISTEN_BACKLOG: Final = 4096

_BACKOFF_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_BACKOFF_FIRST: Final = 0.005
_BACKOFF_MAX: Final = 1.0
# Read a little more than a request so a few trailing bytes (ignored) are drained and the
# close does not turn into ECONNRESET on the client's side.
_RECV_SIZE: Final = 64
_UCRED: Final = struct.Struct("=iII")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_UCRED_SIZE: Final = _UCRED.size
# Plain ints (the socket module's constants are enum members: slower to pass in a hot loop).
_AF_UNIX: Final = int(socket.AF_UNIX)
_SOCK_STREAM: Final = int(socket.SOCK_STREAM)
_SOL_SOCKET: Final = int(socket.SOL_SOCKET)
_SO_PEERCRED: Final = int(socket.SO_PEERCRED)
_SEND_FLAGS: Final = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
_RECV_FLAGS: Final = socket.MSG_DONTWAIT
# How often each kind of dropped exchange may be logged (seconds).
_LOG_INTERVAL: Final = 10.0


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Settings of one broker.

    Attributes:
        socket_path: where to listen (default ``/var/run/hami/hostpid/broker.sock``, which
            requires euid 0).
        lock_path: the lock file that keeps a second broker from starting; ``None`` for the
            socket's: ``<socket dir>-lock/broker.lock``, beside the socket's directory (which
            workloads mount) and never in it.
        max_exchanges: slow exchanges (waiting for their request) allowed at once; a
            connection that needs a slot while all are taken is closed at once.
        exchange_deadline: seconds one exchange may take from accept to answer.
        expected_uid: owner required of the directory, lock and socket; ``None`` for the
            default rule (root for the default path, the current euid otherwise).

    Raises:
        ConfigError: a value is out of range (named in the message).
    """

    socket_path: Path = DEFAULT_SOCKET_PATH
    max_exchanges: int = DEFAULT_MAX_EXCHANGES
    exchange_deadline: float = DEFAULT_EXCHANGE_DEADLINE
    expected_uid: int | None = None
    lock_path: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "socket_path", Path(self.socket_path))
        if self.lock_path is not None:
            object.__setattr__(self, "lock_path", Path(self.lock_path))
        if isinstance(self.max_exchanges, bool) or not isinstance(self.max_exchanges, int):
            raise ConfigError(f"max_exchanges must be an integer, got {self.max_exchanges!r}")
        if self.max_exchanges < 1:
            raise ConfigError(f"max_exchanges must be at least 1, got {self.max_exchanges}")
        if not (math.isfinite(self.exchange_deadline) and self.exchange_deadline > 0):
            raise ConfigError(
                f"exchange_deadline must be a positive number of seconds, "
                f"got {self.exchange_deadline!r}"
            )
        if self.expected_uid is not None and self.expected_uid < 0:
            raise ConfigError(f"expected_uid must be >= 0, got {self.expected_uid}")

    @property
    def resolved_lock_path(self) -> Path:
        """The lock file this broker takes: :attr:`lock_path` or the socket's default."""
        return self.lock_path if self.lock_path is not None else default_lock_path(self.socket_path)


def accept_backoff(previous: float) -> float:
    """The pause after a transient accept error, given the previous pause (0 after a success).

    Returns:
        5 ms after a success, then double the previous pause, capped at 1 s.
    """
    if previous <= 0:
        return _BACKOFF_FIRST
    return min(previous * 2, _BACKOFF_MAX)


def exchanges_within(max_exchanges: int, fd_limit: int) -> int:
    """The slots a broker may use under the descriptor limit ``fd_limit``: ``max_exchanges``,
    at most ``fd_limit - FD_RESERVE`` (and at least 1).

    Each slot holds one descriptor; the reserve is for the rest of the agent (the monitor's
    containers, the metrics connections, the listeners).  With more slots than that, a flood
    of idle connections takes the last descriptors: the monitor cannot open its directory or
    check the MIG lock, and accepts fail with EMFILE for everyone.  ``resource.RLIM_INFINITY``
    (or any limit far above) leaves ``max_exchanges`` as it is.
    """
    if fd_limit == resource.RLIM_INFINITY or fd_limit < 0:
        return max_exchanges
    return max(1, min(max_exchanges, fd_limit - FD_RESERVE))


def _ensure_fd_budget(max_exchanges: int) -> int:
    """Raise the soft descriptor limit (:func:`~hami_trio._trio.raise_fd_limit`) and clamp
    the slots to it (:func:`exchanges_within`), with a warning when that bites.

    Returns:
        The slots the broker runs with.
    """
    soft = raise_fd_limit(max_exchanges + FD_RESERVE)
    slots = exchanges_within(max_exchanges, soft)
    if slots < max_exchanges:
        logger.warning(
            "max_exchanges clamped from %d to %d: the descriptor limit %d keeps %d for the "
            "rest of the agent (raise the hard RLIMIT_NOFILE to max_exchanges + %d for all)",
            max_exchanges,
            slots,
            soft,
            FD_RESERVE,
            FD_RESERVE,
            extra={"event": "broker_slots_clamped"},
        )
    return slots


# The C socket type: on the hot path a ``socket.socket`` wrapper costs Python-level
# ``__init__``/``close`` frames and enum conversions (a fifth of an exchange's CPU time).
_Conn = _socket.socket
_Received = RequestReader  # the codec's accumulator of a request still incomplete


class _Server:
    """State shared by the accept loop and the slow-path tasks of one broker."""

    def __init__(self, config: BrokerConfig, bound: BrokerSocket, stats: BrokerStats) -> None:
        self.config = config
        self.bound = bound
        self.listener = bound.listener
        # socket.socket.accept() is _accept() plus the wrapper above; call the primitive.  The
        # one private name the package keeps: the public accept() adds about 5 us a connection
        # (a Python-level socket object) to an exchange of about 15 us of CPU.
        self.accept_fd: Callable[[], tuple[int, object]] = bound.listener._accept  # type: ignore[attr-defined]  # noqa: SLF001
        self.stats = stats
        self.limiter = trio.CapacityLimiter(config.max_exchanges)
        self.deadline = config.exchange_deadline
        self.accept_scope = trio.CancelScope()
        self.nursery: trio.Nursery | None = None
        self.log_limiter = RateLimiter(_LOG_INTERVAL, max_keys=16, clock=trio.current_time)

    # -- accounting -------------------------------------------------------------------------

    def note_drop(self, outcome: Outcome) -> None:
        """Log a dropped or refused exchange, at most once per outcome per interval."""
        self.log_limiter.log(
            logger,
            logging.INFO if outcome == "eof" else logging.WARNING,
            outcome,
            "broker exchange dropped: %s (%d so far)",
            outcome,
            self.stats.counts[outcome],
        )

    # -- one exchange -----------------------------------------------------------------------

    @staticmethod
    def reply(conn: _Conn, valid: bool) -> Outcome:
        """Answer a complete request, already validated, on ``conn``; does not close it."""
        try:
            if not valid:
                conn.send(INVALID_RESPONSE, _SEND_FLAGS)
                return "invalid"
            # Validated first, then the kernel's credentials of the connected peer.
            pid = _UCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED_SIZE)
            )[0]
            if pid <= 0:
                # The peer lives in a PID namespace the broker cannot see: never guess.
                return "peer_error"
            if conn.send(encode_response(pid), _SEND_FLAGS) != RESPONSE_SIZE:
                return "peer_error"
        except OSError:
            return "peer_error"
        return "ok"

    @classmethod
    def advance(cls, conn: _Conn, received: _Received) -> Outcome | _Received:
        """One non-blocking read on ``conn``; answer if the request is then complete.

        Returns:
            The outcome if the exchange is over (the caller closes ``conn``), else the bytes
            received so far while it still waits for more.
        """
        try:
            chunk = conn.recv(_RECV_SIZE, _RECV_FLAGS)
        except BlockingIOError:
            return received
        except OSError:
            return "peer_error"
        return cls.process(conn, received, chunk)

    @classmethod
    def process(cls, conn: _Conn, received: _Received, chunk: bytes) -> Outcome | _Received:
        """Add a chunk just read (empty: EOF); answer once 8 bytes are there (see advance)."""
        if not chunk:
            return "eof"
        try:
            if received.feed(chunk) is None:
                return received
        except ProtocolError:
            return cls.reply(conn, False)
        return cls.reply(conn, True)

    async def slow_exchange(self, conn: _Conn, received: _Received, accepted_at: float) -> None:
        """Wait for the rest of a request under the exchange deadline; holds a slot.

        An exchange cut short by cancellation of the whole broker (not by its deadline) is
        not counted: it has no outcome of its own, and the broker's metrics end with it.
        """
        outcome: Outcome | None = None
        try:
            with trio.move_on_at(accepted_at + self.deadline) as deadline:
                while True:
                    await trio.lowlevel.wait_readable(conn)
                    result = self.advance(conn, received)
                    if isinstance(result, str):
                        outcome = result
                        break
                    received = result
            if deadline.cancelled_caught:
                outcome = "timeout"
        finally:
            conn.close()
            self.limiter.release_on_behalf_of(conn)
            if outcome is not None:
                self.stats.record(outcome, trio.current_time() - accepted_at)
                if outcome != "ok":
                    self.note_drop(outcome)

    def start_slow(self, conn: _Conn, received: _Received, accepted_at: float) -> None:
        """Give an incomplete exchange a slot and a task, or close it if none is free."""
        try:
            self.limiter.acquire_on_behalf_of_nowait(conn)
        except trio.WouldBlock:
            conn.close()
            self.stats.record("rejected_full", None)
            self.note_drop("rejected_full")
            return
        assert self.nursery is not None
        self.nursery.start_soon(self.slow_exchange, conn, received, accepted_at)

    # -- accepting --------------------------------------------------------------------------

    def accept_batch(self) -> tuple[int, OSError | None]:
        """Accept up to :data:`ACCEPT_BATCH` connections, answering the ready ones inline.

        This is the broker's hot path: the common case (8 valid bytes already there) is
        written out inline (it is :meth:`advance` and :meth:`reply` without the calls), and
        counters are updated in place; everything else goes through :meth:`process`.

        Returns:
            How many connections were accepted, and the accept error that stopped the batch
            (``None`` when the backlog ran empty or the batch was full).
        """
        accept_fd = self.accept_fd
        # The clock's own method: trio.current_time() adds a lookup of the run context.
        now = trio.lowlevel.current_clock().current_time
        buckets = self.stats.bucket_counts
        unpack_ucred = _UCRED.unpack
        encode = encode_response
        valid = VALID_REQUEST
        bounds = DURATION_BUCKETS
        recv_size, recv_flags, send_flags = _RECV_SIZE, _RECV_FLAGS, _SEND_FLAGS
        waiting: list[tuple[_Conn, _Received, float]] = []
        accepted = ok = 0
        ok_time = 0.0
        error: OSError | None = None
        # Each exchange starts where the previous one ended: one clock read per exchange.
        start = now()
        for _ in range(ACCEPT_BATCH):
            try:
                fd, _ = accept_fd()
            except BlockingIOError:
                break
            except OSError as exc:
                error = exc
                break
            accepted += 1
            conn = _Conn(_AF_UNIX, _SOCK_STREAM, 0, fd)
            result: Outcome | _Received
            try:
                chunk = conn.recv(recv_size, recv_flags)
            except BlockingIOError:
                result = RequestReader()
            except OSError:
                result = "peer_error"
            else:
                # The measured exception to the codec's front door: protocol v1 has exactly
                # one valid request, so a prefix compare is parse_request's acceptance
                # (tests/broker/test_protocol.py checks the two agree on every input).
                if chunk.startswith(valid):
                    try:
                        cred = conn.getsockopt(_SOL_SOCKET, _SO_PEERCRED, _UCRED_SIZE)
                        pid = unpack_ucred(cred)[0]
                        if pid > 0 and conn.send(encode(pid), send_flags) == RESPONSE_SIZE:
                            conn.close()
                            end = now()
                            ok += 1
                            ok_time += end - start
                            buckets[bisect_left(bounds, end - start)] += 1
                            start = end
                            continue
                        result = "peer_error"
                    except OSError:
                        result = "peer_error"
                else:
                    result = self.process(conn, RequestReader(), chunk)
            if isinstance(result, str):
                conn.close()
                end = now()
                self.stats.record(result, end - start)
                if result != "ok":
                    self.note_drop(result)
                start = end
            else:
                waiting.append((conn, result, start))
                start = now()
        counts = self.stats.counts
        counts["ok"] += ok
        self.stats.duration_sum += ok_time
        # Second chance after the batch: the writers have had the rest of the batch's time.
        for conn, received, accepted_at in waiting:
            result = self.advance(conn, received)
            if isinstance(result, str):
                conn.close()
                self.stats.record(result, now() - accepted_at)
                if result != "ok":
                    self.note_drop(result)
            else:
                self.start_slow(conn, result, accepted_at)
        return accepted, error

    async def accept_loop(self) -> None:
        """Accept until cancelled.

        Raises:
            BrokerError: an accept error that is not a resource shortage.
        """
        pause = 0.0
        while True:
            await trio.lowlevel.wait_readable(self.listener)
            accepted, error = self.accept_batch()
            if accepted:
                pause = 0.0
            if error is None:
                continue
            if error.errno not in _BACKOFF_ERRNOS:
                raise BrokerError(
                    f"{self.bound.path}: accept failed: {error.strerror or error}"
                ) from error
            pause = accept_backoff(pause)
            self.log_limiter.log(
                logger,
                logging.WARNING,
                "accept",
                "broker accept failed (%s); pausing accepts for %.3f s",
                errno.errorcode.get(error.errno or 0, str(error)),
                pause,
            )
            await trio.sleep(pause)


class BrokerHandle:
    """What :func:`serve_broker` reports once the socket listens.

    Use :meth:`stop` for a graceful shutdown; cancel the surrounding scope for an abrupt one.
    """

    def __init__(self, server: _Server) -> None:
        self._server = server

    @property
    def socket_path(self) -> Path:
        """The absolute path the broker listens on."""
        return self._server.bound.path

    @property
    def identity(self) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of the socket file the broker created."""
        return self._server.bound.identity

    @property
    def stats(self) -> BrokerStats:
        """Live counters (the same numbers the Prometheus collector exports)."""
        return self._server.stats

    @property
    def max_exchanges(self) -> int:
        """The slots the broker runs with (``max_exchanges``, clamped to the descriptor
        limit: :func:`exchanges_within`)."""
        return self._server.config.max_exchanges

    @property
    def in_flight(self) -> int:
        """Exchanges currently holding a slot (waiting for their request)."""
        return int(self._server.limiter.borrowed_tokens)

    def stop(self) -> None:
        """Stop accepting, remove the socket and let in-flight exchanges finish.

        Returns at once; :func:`serve_broker` returns once the last in-flight exchange ended
        (each is bounded by the exchange deadline).  Calling it again does nothing.
        """
        self._server.accept_scope.cancel()


async def serve_broker(
    config: BrokerConfig,
    *,
    registry: CollectorRegistry | None = None,
    task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the host PID broker until stopped or cancelled.

    Start it with ``handle = await nursery.start(serve_broker, config)``: the handle is
    reported only once the socket listens (after :mod:`.boundary` set up the files).  It
    runs until :meth:`BrokerHandle.stop` (graceful: stop accepting, remove the socket, let
    in-flight exchanges finish within their deadline) or cancellation (in-flight exchanges
    are cancelled); either way the socket is removed if it is still ours and the lock
    released.  Process-wide side effect: the soft ``RLIMIT_NOFILE`` is raised to the hard
    limit (:func:`~hami_trio._trio.raise_fd_limit`); when that is below
    ``max_exchanges + FD_RESERVE`` the broker runs with fewer slots (:func:`exchanges_within`,
    a warning says so).

    Args:
        config: where to listen and the connection-pressure settings.
        registry: Prometheus registry for the broker's self-metrics (registered while the
            broker runs, unregistered when it returns); ``None`` exports nothing.
        task_status: trio's start protocol.

    Raises:
        BrokerStartupError: the directory, lock or socket path was refused (before ready).
        BrokerError: the broker failed after it started (a fatal accept error).
        ValueError: ``registry`` already holds metrics of these names (another running
            broker registered in it); raised before ready, nothing is left behind.
    """
    slots = _ensure_fd_budget(config.max_exchanges)
    if slots != config.max_exchanges:
        config = replace(config, max_exchanges=slots)
    bound = open_broker_socket(
        config.socket_path,
        lock_path=config.lock_path,
        expected_uid=config.expected_uid,
        backlog=LISTEN_BACKLOG,
    )
    stats = BrokerStats()
    server = _Server(config, bound, stats)
    collector = BrokerCollector(stats, lambda: int(server.limiter.borrowed_tokens))
    fatal: BrokerError | None = None
    try:
        if registry is not None:
            registry.register(collector)
        try:
            async with trio.open_nursery() as nursery:
                server.nursery = nursery
                logger.info(
                    "broker listening on %s (lock %s, max_exchanges=%d, exchange_deadline=%gs)",
                    bound.path,
                    bound.lock_path,
                    config.max_exchanges,
                    config.exchange_deadline,
                )
                task_status.started(BrokerHandle(server))
                with server.accept_scope:
                    try:
                        await server.accept_loop()
                    except BrokerError as exc:
                        # Leave the nursery without an exception group: cancel the
                        # in-flight exchanges and raise the error itself afterwards.
                        fatal = exc
                        nursery.cancel_scope.cancel()
                # Stopped: refuse new clients right away (they fall back at once instead of
                # waiting in a backlog nobody accepts), then drain the slow exchanges.
                bound.close_listener()
                if server.limiter.borrowed_tokens:
                    logger.info(
                        "broker draining %d in-flight exchanges", server.limiter.borrowed_tokens
                    )
        finally:
            if registry is not None:
                registry.unregister(collector)
    finally:
        bound.close()
    if fatal is not None:
        logger.error("broker failed: %s", fatal)
        raise fatal
    logger.info("broker stopped (%d exchanges served)", stats.total)
