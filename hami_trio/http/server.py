"""A small HTTP/1.1 server of our own (trio and h11) for the metrics port and the debug view.

Every pod can reach the metrics port, so each connection is hostile and bounded
(:class:`HttpLimits`): HTTP/1.1 only, a connection cap per peer and in all (at the cap the
peer holding the most connections loses its longest waiter; an answer that is making progress
is never closed), one deadline per request and a shorter one for its head, bodies never read,
every outcome counted in :class:`ServerStats`.  What is answered is the :data:`Handler`'s: it
gets the parsed :class:`Request` and returns a :class:`Response`, whole or in parts (streamed,
never held whole).  The socket is bound here, Go ``net.Listen`` style, so a busy port fails
start-up with an :class:`~hami_trio.errors.HttpServerError` before ``task_status.started()``.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections import OrderedDict
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args
from urllib.parse import parse_qs, unquote

import h11
import trio

from hami_trio.errors import ConfigError, HttpServerError
from hami_trio.goparse import BindAddress
from hami_trio.logs import RateLimiter

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_PEER",
    "DEFAULT_REQUEST_TIMEOUT",
    "OUTCOMES",
    "PART",
    "TEXT",
    "Handler",
    "HttpLimits",
    "Outcome",
    "Request",
    "Response",
    "ServerStats",
    "open_listen_socket",
    "serve",
]

_log = logging.getLogger(__name__)

#: The content type of the server's own answers (errors, ``ok``).
TEXT: Final = b"text/plain; charset=utf-8"
#: The size of the parts a large body goes out in (and of ``/metrics``' runs).
PART: Final = 65536


@dataclass(frozen=True, slots=True)
class Request:
    """A request's head, as the handler sees it (its body is never read).

    Attributes:
        method: upper case (``GET``, ``HEAD``).
        path: percent-decoded, without the query (an absolute-form target: its path).
        query: the query string's parameters (``parse_qs``).
        headers: by lower-case name (the last of repeated ones), decoded as Latin-1.
    """

    method: str
    path: str
    query: Mapping[str, list[str]] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def head(self) -> bool:
        """A ``HEAD`` request: its answer is sent without its body."""
        return self.method == "HEAD"


@dataclass(frozen=True, slots=True)
class Response:
    """What the handler answers; the server adds ``content-length`` after ``headers``.

    Attributes:
        status: the status code.
        headers: the answer's headers (``content-type`` first), without ``content-length``.
        body: the whole body (when ``parts`` is None).
        parts: a streamed body: each part goes out as it comes, the body is never held
            whole; an iterator that raises half-way ends the connection.
        length: the streamed body's length in bytes (its ``content-length``).
    """

    status: int
    headers: Sequence[tuple[bytes, bytes]] = ((b"content-type", TEXT),)
    body: bytes = b""
    parts: AsyncIterable[bytes] | None = None
    length: int = 0


#: What a server answers with: the request -> the response.  One that raises costs that
#: request a 500, never the server.
Handler = Callable[[Request], Awaitable[Response]]

_INTERNAL_ERROR: Final = Response(500, body=b"internal error\n")

#: Connections served at once; one more closes a waiting one (see :class:`HttpLimits`).
DEFAULT_MAX_CONNECTIONS: Final = 64
#: Connections one peer (client address) may hold at once.
DEFAULT_MAX_CONNECTIONS_PER_PEER: Final = 16
#: Seconds from a request's first byte to the last byte of its answer.  Prometheus' own
#: scrape timeout is at most its scrape interval and 10 s by default.
DEFAULT_REQUEST_TIMEOUT: Final = 10.0
_RECEIVE_SIZE: Final = 16384
_SMALL_BODY: Final = 65536
_LOG_INTERVAL: Final = 60.0
_ACCEPT_BACKOFF: Final = 0.1  # after EMFILE and the like: let connections finish first
#: An answer is making progress while parts of it keep going out: the last one within
#: ``_PROGRESS_GRACE`` seconds (a client that reads takes a 64 KiB part in well under that),
#: after more than ``_PROGRESS_AFTER`` bytes of it went out - more than the kernel's buffers
#: take from a client that never reads (a 64 KiB send buffer, doubled by the kernel, and
#: the client's receive buffer, about 128 KiB until it reads).
_PROGRESS_GRACE: Final = 1.0
_PROGRESS_AFTER: Final = 512 * 1024

#: How a connection ended (the ``outcome`` label of ``hami_trio_http_connections_total``).
Outcome = Literal[
    "closed",  # the client closed, asked to close, or its keep-alive idle time passed
    "evicted",  # closed at the connection cap to make room for a new connection
    "peer_cap",  # closed unread at the accept: its peer held its connection cap
    "rejected",  # closed unread at the accept: the connection cap, and no room to be made
    "header_timeout",  # the request head was not complete within its deadline
    "response_timeout",  # the request was not answered (the client did not read) in time
    "bad_request",  # malformed or oversized head, HTTP/2 preface, unsupported version
    "accept_failed",  # accept() itself failed (descriptor or memory exhaustion)
]
OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may cost the HTTP server.

    Attributes:
        max_connections: connections served at once.  A connection accepted at the cap
            closes one of the peer (client address) holding the most connections, if that
            peer holds at least two more than the new connection's peer (or is its only
            peer): the one whose current request (or accept, or last answer) is oldest,
            never one whose answer is making progress.  Otherwise the new connection is
            closed unread (``rejected``).
        max_connections_per_peer: connections one peer may hold; one more is closed unread
            (``peer_cap``).
        max_pending_renders: ``/metrics`` renders of requests whose body is not kept
            (``name[]``, odd formats) waiting or running at once; one more is answered
            ``503`` with ``Retry-After`` at once.
        request_timeout: seconds from a request's first byte (a connection's first request:
            from the accept) to the last byte of its answer; a client still sending its
            request or not reading the answer by then is closed.
        header_timeout: seconds for the request head (line and headers) to arrive, counted
            like ``request_timeout``; the smaller of the two applies.
        keep_alive_timeout: seconds an idle keep-alive connection waits for its next request.
        max_request_head: bytes the request line and headers may take (431 beyond).
        backlog: the ``listen()`` backlog (the kernel caps it at ``net.core.somaxconn``).
        send_buffer: ``SO_SNDBUF`` of each accepted connection, which bounds the kernel
            memory a client that does not read can hold.
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    header_timeout: float = 5.0
    keep_alive_timeout: float = 5.0
    max_request_head: int = 16384
    backlog: int = 4096
    send_buffer: int = 65536
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    max_pending_renders: int = 4

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_request_head",
            "backlog",
            "send_buffer",
            "max_connections_per_peer",
            "max_pending_renders",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("request_timeout", "header_timeout", "keep_alive_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")


class ServerStats:
    """The server's counters (the metrics port's are on ``/metrics``, see
    :class:`~hami_trio.metrics.endpoint.HttpCollector`; tests read them).

    Attributes:
        counts: connections ended, by outcome.
        open: connections open now.
        held_bytes: bytes of answers not yet sent (freed when sent or closed).
    """

    def __init__(self) -> None:
        self.counts: dict[Outcome, int] = dict.fromkeys(OUTCOMES, 0)
        self.open = 0
        self.held_bytes = 0


def open_listen_socket(bind: BindAddress) -> socket.socket:
    """Create and bind (not listen) a TCP socket the way Go's ``net.Listen`` would.

    An empty host binds ``::`` dual-stack, falling back to ``0.0.0.0`` when the host has no
    IPv6.  Other hosts are resolved and the first address is used.

    Raises:
        HttpServerError: the host does not resolve, or the address cannot be bound (in use,
            not local, no permission).
    """
    if bind.host == "":
        candidates: list[tuple[int, tuple[Any, ...]]] = [
            (socket.AF_INET6, ("::", bind.port)),
            (socket.AF_INET, ("0.0.0.0", bind.port)),
        ]
    else:
        try:
            infos = socket.getaddrinfo(
                bind.host, bind.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except socket.gaierror as exc:
            raise HttpServerError(f"cannot resolve listen host {bind.host!r}: {exc}") from exc
        candidates = [(family, address) for family, _, _, _, address in infos[:1]]
    last: OSError | None = None
    for family, address in candidates:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # EAFNOSUPPORT: the kernel has no IPv6
            last = exc
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and bind.host == "":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
        except OSError as exc:
            sock.close()
            last = exc
            if exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL) and bind.host == "":
                continue  # IPv6 disabled: try IPv4
            break
        return sock
    raise HttpServerError(f"cannot listen on {bind}: {last}") from last


@dataclass(eq=False, slots=True)
class _Connection:
    scope: trio.CancelScope
    peer: str  # address and port, for the logs
    host: str = ""  # the peer's address: what the per-peer cap counts
    evicted: bool = False
    sending: bool = False  # its answer is going out
    answer_sent: int = 0  # bytes of it that went out
    progress_at: float = 0.0  # when the last part of it went out

    def progressing(self, now: float) -> bool:
        """Whether its answer is making progress: never closed at a cap."""
        return (
            self.sending
            and self.answer_sent > _PROGRESS_AFTER
            and now - self.progress_at < _PROGRESS_GRACE
        )

    def start_answer(self) -> None:
        self.sending = True
        self.answer_sent = 0

    def sent(self, size: int) -> None:
        """``size`` bytes of the answer went out."""
        self.answer_sent += size
        self.progress_at = trio.current_time()


class _Server:
    """The accept loop and the connections of one :func:`serve`."""

    def __init__(
        self, handler: Handler, limits: HttpLimits, stats: ServerStats, bound: str, what: str
    ) -> None:
        self.what = what
        self.handler = handler
        self.limits = limits
        self.stats = stats
        self.bound = bound
        # Oldest activity first: a connection moves to the end when accepted and when it
        # starts a request.  The same order per peer address, for the per-peer cap.
        self.connections: OrderedDict[_Connection, None] = OrderedDict()
        self.peers: dict[str, OrderedDict[_Connection, None]] = {}
        self.log_limiter = RateLimiter(_LOG_INTERVAL, max_keys=16, clock=trio.current_time)

    def note(self, outcome: Outcome, peer: str) -> None:
        """Count how a connection ended; log refusals at most once per outcome a minute."""
        self.stats.counts[outcome] += 1
        if outcome == "closed":
            return
        suppressed = self.log_limiter.check(outcome)
        if suppressed is None:
            return
        _log.warning(
            "%s port %s: %s connection from %s (%d in total, %d not logged since the "
            "last; limits: %d connections, %gs per request, %gs for the request head)",
            self.what,
            self.bound,
            outcome,
            peer,
            self.stats.counts[outcome],
            suppressed,
            self.limits.max_connections,
            self.limits.request_timeout,
            min(self.limits.header_timeout, self.limits.request_timeout),
            extra={"event": "http_refused", "outcome": outcome, "peer": peer},
        )

    async def accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM: not fatal, not a spin
                self.note("accept_failed", f"? ({exc})")
                await trio.sleep(_ACCEPT_BACKOFF)
                continue
            try:
                address = stream.socket.getpeername()
                host, peer = str(address[0]), f"{address[0]}:{address[1]}"
            except OSError:
                host = peer = "?"
            refusal = self.make_room(host)
            if refusal is not None:  # closed unread: a refused connection costs an accept
                stream.socket.close()
                self.note(refusal, peer)
                continue
            connection = _Connection(trio.CancelScope(), peer, host)
            self.add(connection)
            nursery.start_soon(self.serve_connection, stream, connection)

    def add(self, connection: _Connection) -> None:
        self.connections[connection] = None
        self.peers.setdefault(connection.host, OrderedDict())[connection] = None

    def remove(self, connection: _Connection) -> None:
        self.connections.pop(connection, None)
        held = self.peers.get(connection.host)
        if held is not None:
            held.pop(connection, None)
            if not held:
                del self.peers[connection.host]

    def touch(self, connection: _Connection) -> None:
        """The connection starts a request: it is the newest of its peer and in all."""
        if connection in self.connections:  # not if evicted (its cancel is pending)
            self.connections.move_to_end(connection)
            self.peers[connection.host].move_to_end(connection)

    def make_room(self, host: str) -> Outcome | None:
        """Make room for one more connection from ``host``, or say why it is refused.

        A peer at its cap is refused (``peer_cap``): serving a flood's newcomer, only to
        close one of its older connections, would cost the agent as much as the flood
        sends.  At the total cap the peer holding the most connections loses its longest
        waiter when it holds at least two more than ``host`` does (so a newcomer never
        takes from a peer about as busy as its own, and peers in a flood cannot churn each
        other's connections), or when ``host`` is the only peer; otherwise, or when all of
        that peer's answers are making progress, the newcomer is refused (``rejected``).
        """
        now = trio.current_time()
        held = self.peers.get(host)
        count = 0 if held is None else len(held)
        if count >= self.limits.max_connections_per_peer:
            return "peer_cap"
        while len(self.connections) >= self.limits.max_connections:
            busiest = max(self.peers.values(), key=len)
            alone = busiest is held and len(self.peers) == 1
            if not (alone or len(busiest) >= count + 2) or not self.evict_from(busiest, now):
                return "rejected"
        return None

    def evict_from(self, held: OrderedDict[_Connection, None], now: float) -> bool:
        """Close the connection of ``held`` that waits the longest and is not making progress."""
        victim = next((c for c in held if not c.progressing(now)), None)
        if victim is None:
            return False
        self.remove(victim)
        victim.evicted = True
        victim.scope.cancel()
        return True

    async def serve_connection(self, stream: trio.SocketStream, connection: _Connection) -> None:
        peer = connection.peer
        self.stats.open += 1
        outcome: Outcome = "closed"
        try:
            with connection.scope:
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer)
                outcome = await self.exchange(stream, connection)
            if connection.evicted:
                outcome = "evicted"
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            outcome = "closed"  # reset by the client
        except h11.LocalProtocolError:
            _log.exception("the %s port's answer is not valid HTTP", self.what)
            outcome = "closed"
        finally:
            self.remove(connection)
            self.stats.open -= 1
            stream.socket.close()  # synchronous: the kernel's buffers go now
        self.note(outcome, peer)

    async def exchange(self, stream: trio.abc.Stream, connection: _Connection) -> Outcome:
        """Serve requests on one connection until it ends; how it ended."""
        limits = self.limits
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_request_head)
        started = trio.current_time()  # the first request's deadlines run from the accept
        first = True
        while True:
            if not first:
                if not conn.trailing_data[0]:  # nothing pipelined: wait for the next request
                    with trio.move_on_after(limits.keep_alive_timeout) as idle:
                        data = await stream.receive_some(_RECEIVE_SIZE)
                    if idle.cancelled_caught or not data:
                        return "closed"  # a keep-alive close, not a refusal
                    conn.receive_data(bytes(data))
                started = trio.current_time()
            first = False
            self.touch(connection)
            head_done = False
            with trio.move_on_at(started + limits.request_timeout):
                try:
                    with trio.fail_at(started + limits.header_timeout):
                        request = await self._read_head(conn, stream)
                except trio.TooSlowError:
                    return "header_timeout"
                except h11.RemoteProtocolError as exc:
                    await self._send_error(conn, stream, exc.error_status_hint)
                    return "bad_request"
                head_done = True
                if request is None:
                    return "closed"
                if request.http_version not in (b"1.0", b"1.1"):
                    await self._send_error(conn, stream, 505)
                    return "bad_request"
                if not await self._answer(conn, stream, request, connection):
                    return "closed"
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return "closed"
                conn.start_next_cycle()
                continue
            return "response_timeout" if head_done else "header_timeout"

    async def _read_head(self, conn: h11.Connection, stream: trio.abc.Stream) -> h11.Request | None:
        """The next request's head, or None when the client closed first.

        Raises:
            h11.RemoteProtocolError: malformed, or longer than ``max_request_head`` (431).
        """
        received = len(conn.trailing_data[0])
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = bytes(await stream.receive_some(_RECEIVE_SIZE))
                received += len(data)
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                # h11 bounds an incomplete head only; a complete one that came in one read
                # is measured here.
                if received - len(conn.trailing_data[0]) > self.limits.max_request_head:
                    raise h11.RemoteProtocolError("request head too large", 431)
                return event
            else:  # ConnectionClosed (h11 raises on anything else before a request)
                return None

    async def _send_error(self, conn: h11.Connection, stream: trio.abc.Stream, status: int) -> None:
        if conn.our_state is not h11.SEND_RESPONSE:
            return
        body = f"{status} {_REASONS.get(status, 'bad request')}\n".encode()
        headers = [
            (b"content-type", TEXT),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await stream.send_all(
            conn.send(h11.Response(status_code=status, headers=headers))
            + conn.send(h11.Data(data=body))
            + conn.send(h11.EndOfMessage())
        )

    async def _answer(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        request: h11.Request,
        connection: _Connection,
    ) -> bool:
        """Run the handler for ``request`` and send its answer; False: close now.

        A whole answer goes out when the handler returned it (a 500 if it raised).  A
        streamed one goes out as it comes: the head, then each part as soon as it is given,
        so a large answer is never held whole (``/metrics`` at N=1000 is 4.5 MB).  Parts that
        fail after the head went out end the connection.
        """
        has_body = any(
            (name == b"content-length" and value.strip() != b"0") or name == b"transfer-encoding"
            for name, value in request.headers
        )
        if not has_body:
            end = conn.next_event()  # a bodiless request's end comes with its head
            if not isinstance(end, h11.EndOfMessage):
                return False
        parsed = _parse(request)
        reply = _Reply(self.stats, conn, stream, connection, close=has_body)
        try:
            # Nothing protects the connection while its answer is made: it waits on the
            # render like any other waiter, and may be the one closed at a cap.
            try:
                response = await self.handler(parsed)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise  # the client went away: a close, not a bug
            except Exception:
                _log.exception("the %s port's handler failed on %s", self.what, parsed.path)
                response = _INTERNAL_ERROR
            if parsed.head:
                length = response.length if response.parts is not None else len(response.body)
                await reply.send_whole(response.status, response.headers, b"", length)
            elif response.parts is None:
                await reply.send_whole(response.status, response.headers, response.body)
            elif not await reply.send_parts(response, self.what, parsed.path):
                return False  # the parts stopped half-way: the answer is cut
        finally:
            connection.sending = False
            reply.release()
        return not has_body


def _parse(request: h11.Request) -> Request:
    target = request.target.decode("latin-1")
    if "://" in target:  # absolute form: keep the path and the query
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    raw_path, _, query = target.partition("?")
    return Request(
        method=request.method.decode("latin-1").upper(),
        path=unquote(raw_path),
        query=parse_qs(query),
        headers={
            key.decode("latin-1").lower(): value.decode("latin-1") for key, value in request.headers
        },
    )


class _Reply:
    """One answer, sent as the server's rules say (see :meth:`_Server._answer`).
    ``held_bytes`` counts an answer until it is sent: a whole one while it goes out, a
    streamed one from its head (its ``content-length``) down as its parts go out."""

    def __init__(
        self,
        stats: ServerStats,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        connection: _Connection,
        *,
        close: bool,
    ) -> None:
        self._stats = stats
        self._conn = conn
        self._stream = stream
        self._connection = connection
        self._close = close  # the request's body is never read: answer, then close
        self._held = 0  # what this answer adds to held_bytes now

    def release(self) -> None:
        """The answer is sent or abandoned: it no longer counts as held."""
        self._hold(-self._held)

    def _hold(self, size: int) -> None:
        self._held += size
        self._stats.held_bytes += size

    def _head(self, status: int, headers: Sequence[tuple[bytes, bytes]], length: int) -> bytes:
        all_headers = [*headers, (b"content-length", str(length).encode())]
        if self._close:
            all_headers.append((b"connection", b"close"))
        return self._conn.send(h11.Response(status_code=status, headers=all_headers))

    async def _data(self, data: bytes) -> None:
        if not data:
            return
        undeclared = len(data) > self._held  # more than its content-length said
        if undeclared:
            self._hold(len(data))
        if len(data) <= _SMALL_BODY:
            await self._stream.send_all(self._conn.send(h11.Data(data=data)))
            self._connection.sent(len(data))
        else:
            await self._passthrough(data)
        self._hold(-len(data))

    async def _passthrough(self, data: bytes) -> None:
        """Send a large piece of body without copying it into the framing, in parts of
        :data:`PART` bytes, each marking the answer as making progress."""
        for chunk in self._conn.send_with_data_passthrough(h11.Data(data=data)) or ():
            view = memoryview(chunk)
            for offset in range(0, len(view), PART):
                part = view[offset : offset + PART]
                await self._stream.send_all(part)
                self._connection.sent(len(part))

    async def send_whole(
        self,
        status: int,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        length: int | None = None,
    ) -> None:
        """Send an answer whose body is all there (``length``: a HEAD's, without it)."""
        self._hold(len(body))
        self._connection.start_answer()
        head = self._head(status, headers, len(body) if length is None else length)
        if len(body) <= _SMALL_BODY:  # one segment for the small answers
            await self._stream.send_all(head + self._conn.send(h11.Data(data=body)))
        else:
            await self._stream.send_all(head)
            await self._passthrough(body)
        await self._stream.send_all(self._conn.send(h11.EndOfMessage()))

    async def send_parts(self, response: Response, what: str, path: str) -> bool:
        """Send a streamed answer, each part as it comes; False: the parts failed half-way."""
        assert response.parts is not None
        self._hold(response.length)
        self._connection.start_answer()
        await self._stream.send_all(self._head(response.status, response.headers, response.length))
        parts = aiter(response.parts)
        try:
            while True:
                try:
                    part = await anext(parts)
                except StopAsyncIteration:
                    break
                except Exception:
                    _log.exception("the %s port's answer to %s failed half-way", what, path)
                    return False
                await self._data(part)
        finally:
            aclose = getattr(parts, "aclose", None)
            if aclose is not None:
                await aclose()
        await self._stream.send_all(self._conn.send(h11.EndOfMessage()))
        return True


_REASONS: Final = {
    400: "bad request",
    408: "request timeout",
    431: "request header fields too large",
    505: "http version not supported",
}


async def serve(
    bind: BindAddress,
    handler: Handler,
    *,
    what: str,
    paths: Sequence[str],
    name: str | None = None,
    limits: HttpLimits | None = None,
    stats: ServerStats | None = None,
    start: Callable[..., Awaitable[Any]] | None = None,
    detail: str = "",
    task_status: trio.TaskStatus[BindAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer the requests of ``bind`` with ``handler`` until cancelled.

    Args:
        bind: the listen address.
        handler: what answers each request.
        what: the server's name in its log lines (``metrics``, ``debug``).
        paths: what it serves, for the start-up line.
        name: what configured the address (``--debug-bind-address``): the bind error's
            message then starts with it.
        limits: what one client may cost (default :class:`HttpLimits`).
        stats: where the counters go (tests read them); a new one by default.
        start: started (``nursery.start``) in the server's nursery before the first accept,
            cancelled with it (the metrics port's render worker).
        detail: appended to the start-up line.
        task_status: ``started()`` receives the bound address (the real port when ``bind``
            asked for port 0) once the socket listens.

    Raises:
        HttpServerError: the address cannot be bound (raised before ``started()``).
    """
    limits = limits or HttpLimits()
    stats = stats or ServerStats()
    try:
        sock = open_listen_socket(bind)
    except HttpServerError as exc:
        if name is None:
            raise
        raise HttpServerError(f"{name} {bind}: {exc}") from exc.__cause__
    try:
        host, port = sock.getsockname()[:2]
        bound = BindAddress(host=bind.host if bind.host == "" else host, port=port)
        sock.listen(limits.backlog)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        server = _Server(handler, limits, stats, str(bound), what)
        async with trio.open_nursery() as nursery:
            if start is not None:
                await nursery.start(start)
            nursery.start_soon(server.accept_loop, listener, nursery)
            _log.info(
                "%s port: serving %s on %s (HTTP/1.1, at most %d connections, %d per peer, "
                "%gs per request%s)",
                what,
                ", ".join(paths),
                bound,
                limits.max_connections,
                limits.max_connections_per_peer,
                limits.request_timeout,
                detail,
            )
            task_status.started(bound)
    finally:
        sock.close()
