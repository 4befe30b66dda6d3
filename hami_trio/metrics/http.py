"""The agent's HTTP endpoints: ``/metrics``, ``/healthz``, ``/readyz`` - and the debug port.

How this works: :func:`make_app` is a small ASGI application for the three paths, and
:func:`serve_http` a small HTTP/1.1 server of our own (trio and h11) that runs it in the
agent's nursery.  Every pod can reach the port, so each connection is hostile and bounded
(:class:`HttpLimits`): HTTP/1.1 only, a connection cap per peer and in all (at the cap the
peer holding the most connections loses its longest waiter; an answer that is making progress
is never closed), one deadline per request and a shorter one for its head, bodies never read,
every outcome counted by :class:`HttpCollector`.  ``/metrics`` answers from
:class:`~hami_trio.metrics.scrapecache.ScrapeCache`: one body per format and freshness window,
rendered in a worker thread and shared by every scrape in the window (content negotiation,
gzip); an uncached render (``name[]``) that finds the render queue full is answered ``503``
with ``Retry-After`` at once.  ``/healthz`` and ``/readyz`` never render nor queue;
``/readyz`` runs the injected checks.  The socket is bound
here, Go ``net.Listen`` style, so a busy port fails start-up with an
:class:`~hami_trio.errors.HttpServerError` before ``task_status.started()``.  Paths, limits and
binding: docs/metrics.md.

The same server runs a second, loopback-only instance for the debug view
(:func:`serve_routes`): a table of paths to :data:`Route` callables, each rendered in a
worker thread, with the same limits and deadlines and no registry (docs/debug.md).
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, Protocol, cast, get_args
from urllib.parse import parse_qs, unquote

import h11
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from hami_trio.errors import ConfigError, HttpServerError
from hami_trio.goparse import BindAddress
from hami_trio.logs import RateLimiter
from hami_trio.metrics.scrapecache import (
    PART,
    RenderQueueFull,
    ScrapeCache,
    coalesce,
)

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_PEER",
    "DEFAULT_REQUEST_TIMEOUT",
    "ASGIApp",
    "HttpCollector",
    "HttpLimits",
    "HttpStats",
    "ReadinessCheck",
    "Route",
    "RouteAnswer",
    "SelfRendering",
    "make_app",
    "make_route_app",
    "open_listen_socket",
    "progress_check",
    "render_metrics",
    "serve_http",
    "serve_routes",
]

_log = logging.getLogger("hami_trio.monitor.http")  # the name in the logs (kept across moves)

#: A readiness check: returns True when its component is ready.  Must not block.
ReadinessCheck = Callable[[], bool]

_Scope = Mapping[str, Any]
_Receive = Callable[[], Awaitable[Mapping[str, Any]]]
_Send = Callable[[Mapping[str, Any]], Awaitable[None]]
#: An ASGI 3 application.
ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]
#: What a :data:`Route` answers: status, content type, body.
RouteAnswer = tuple[int, bytes, bytes]
#: One path of :func:`serve_routes`: the query parameters -> the answer.  Runs in a worker
#: thread, so it must only read state that is safe to read from one (immutable views).
Route = Callable[[Mapping[str, list[str]]], RouteAnswer]

_TEXT: Final = b"text/plain; charset=utf-8"
_EOF: Final = b"# EOF\n"

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

#: How a ``/metrics`` request was answered (the ``answer`` label of
#: ``hami_trio_http_scrapes_total``).
ScrapeAnswer = Literal[
    "rendered",  # a render was started for it
    "shared",  # the body of its freshness window (kept, or in flight) was sent
    "busy",  # 503: the render queue was full
    "failed",  # 500: the render raised
]
SCRAPE_ANSWERS: Final[tuple[ScrapeAnswer, ...]] = get_args(ScrapeAnswer)


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


class HttpStats:
    """The HTTP server's counters (read by :class:`HttpCollector`, and by tests).

    Attributes:
        counts: connections ended, by outcome.
        open: connections open now.
        held_bytes: bytes of rendered answers not yet sent (freed when sent or closed).
        scrapes: ``/metrics`` requests, by how they were answered.
    """

    def __init__(self) -> None:
        self.counts: dict[Outcome, int] = dict.fromkeys(OUTCOMES, 0)
        self.scrapes: dict[ScrapeAnswer, int] = dict.fromkeys(SCRAPE_ANSWERS, 0)
        self.open = 0
        self.held_bytes = 0


class HttpCollector(Collector):
    """``hami_trio_http_*``: the metrics port's connections, by outcome."""

    def __init__(self, stats: HttpStats) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        """The families' names, so that ``name[]`` can select them."""
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        total = CounterMetricFamily(
            "hami_trio_http_connections",
            "Metrics-port connections ended, by outcome",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            total.add_metric([outcome], stats.counts[outcome])
        yield total
        yield GaugeMetricFamily(
            "hami_trio_http_connections_open", "Metrics-port connections open now", stats.open
        )
        yield GaugeMetricFamily(
            "hami_trio_http_response_bytes_held",
            "Bytes of rendered metrics-port answers not yet sent",
            stats.held_bytes,
        )
        scrapes = CounterMetricFamily(
            "hami_trio_http_scrapes",
            "Metrics-port /metrics requests, by answer: rendered for it, shared (the body of "
            "its freshness window), busy (503, render queue full), failed (500)",
            labels=["answer"],
        )
        for answer in SCRAPE_ANSWERS:
            scrapes.add_metric([answer], stats.scrapes[answer])
        yield scrapes


class SelfRendering(Protocol):
    """A metric family that writes its own exposition text (``exposition.FastGauge``).

    Gauges write the same lines in both formats; counters (``exposition.FastCounter``) name
    their ``# HELP``/``# TYPE`` lines differently in OpenMetrics, hence ``openmetrics``.
    """

    def encoded(self, openmetrics: bool = False) -> bytes:
        """The family's lines in the chosen format, each ending in a newline, as UTF-8."""
        ...

    def pieces(self, openmetrics: bool = False) -> list[bytes]:
        """:meth:`encoded` in pieces that join to it (kept text is handed over, not copied)."""
        ...


class _OneFamily:
    """A collector of one family, to render it with prometheus-client's encoders."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> list[Metric]:
        return [self._family]


def render_metrics(registry: CollectorRegistry, accept: str, names: list[str]) -> tuple[bytes, str]:
    """The registry's exposition in the format ``accept`` asks for.

    prometheus-client's ``choose_encoder`` picks the format.  Families that render
    themselves (:class:`SelfRendering`) are written directly; every other family goes through
    prometheus-client's encoder, so the output is what ``generate_latest`` would give, only
    faster.  With ``names`` (``name[]``) the registry is restricted and rendered the plain way.

    Returns:
        The body and its content type.
    """
    pieces, content_type = render_pieces(registry, accept, names)
    # Bytes all the way: the kept per-container lines are UTF-8 already.
    return b"".join(pieces), content_type


def render_pieces(
    registry: CollectorRegistry, accept: str, names: list[str]
) -> tuple[list[bytes], str]:
    """:func:`render_metrics` in the pieces that join to its body: a self-rendering family's
    kept lines are handed over as they are, not copied (the endpoint sends them in parts and
    never holds the 4.5 MB of an N=1000 body whole)."""
    encoder, content_type = choose_encoder(accept)
    if names:
        return [encoder(registry.restricted_registry(names))], content_type
    openmetrics = content_type.startswith("application/openmetrics-text")
    parts: list[bytes] = []
    for family in registry.collect():
        if getattr(family, "pieces", None) is not None:
            parts.extend(cast(SelfRendering, family).pieces(openmetrics))
            continue
        text = encoder(cast(Collector, _OneFamily(family)))
        if openmetrics and text.endswith(_EOF):
            text = text[: -len(_EOF)]
        parts.append(text)
    if openmetrics:
        parts.append(_EOF)
    return parts, content_type


def progress_check(
    progress: Callable[[], int],
    *,
    max_stall: float,
    idle: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.monotonic,
) -> ReadinessCheck:
    """A readiness check that fails when a counter stops moving (e.g. the monitor's ticks).

    The check passes while ``idle()`` is true (the monitor paused by the MIG lock), and
    otherwise once ``progress()`` is above 0 and changed within the last ``max_stall``
    seconds as seen by successive calls (a probe every few seconds is enough).

    Args:
        progress: a monotonically increasing counter.
        max_stall: seconds without progress after which the check fails.
        idle: when true, no progress is expected.
        clock: monotonic clock (tests inject one).
    """
    last_value = progress()
    last_change = clock()

    def check() -> bool:
        nonlocal last_value, last_change
        now = clock()
        value = progress()
        if value != last_value:
            last_value, last_change = value, now
        if idle():
            last_change = now  # a pause is not a stall; start counting again after it
            return True
        return value > 0 and now - last_change <= max_stall

    return check


def make_app(
    cache: ScrapeCache,
    checks: Mapping[str, ReadinessCheck] | None = None,
    *,
    stats: HttpStats | None = None,
) -> ASGIApp:
    """The ASGI application behind :func:`serve_http`.

    Args:
        cache: where ``/metrics`` bodies come from (its :meth:`~ScrapeCache.serve` must run).
        checks: readiness checks by name, evaluated in order on every ``/readyz``.  A check
            that raises counts as failed (and is logged).  A failing check with a
            ``reason()`` method has its reason appended to its line; one with a true
            ``informational`` attribute is listed but does not make ``/readyz`` fail.
        stats: where ``/metrics`` answers are counted (``scrapes``).

    Returns:
        An ASGI 3 callable (HTTP and lifespan scopes).
    """
    checks = dict(checks or {})
    stats = stats or HttpStats()
    # A flood of scrapes must not become a flood of log lines: once a minute, with a count.
    log_limiter = RateLimiter(_LOG_INTERVAL, max_keys=4, clock=trio.current_time)

    async def respond(
        send: _Send,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        head: bool = False,
    ) -> None:
        all_headers = [*(headers or [(b"content-type", _TEXT)])]
        all_headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": all_headers})
        await send({"type": "http.response.body", "body": b"" if head else body})

    async def metrics(scope: _Scope, send: _Send, head: bool) -> None:
        request_headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", ())
        }
        params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            body, answer = await cache.body(
                request_headers.get("accept", ""),
                gzip_accepted(request_headers.get("accept-encoding", "")),
                params.get("name[]", []),
            )
        except RenderQueueFull as full:
            # Never a wait: the client is told when to come back, the connection is free.
            stats.scrapes["busy"] += 1
            suppressed = log_limiter.check("busy")
            if suppressed is not None:
                _log.warning(
                    "/metrics answered 503: %d renders of uncached requests (name[], other "
                    "formats) pending (%d in total, %d not logged since the last)",
                    cache.max_pending,
                    stats.scrapes["busy"],
                    suppressed,
                    extra={"event": "http_busy"},
                )
            retry = [(b"content-type", _TEXT), (b"retry-after", str(full.retry_after).encode())]
            await respond(send, 503, b"busy: too many renders queued\n", retry, head=head)
            return
        except Exception:
            # A collector bug must cost one scrape, not the endpoint.
            stats.scrapes["failed"] += 1
            suppressed = log_limiter.check("failed")
            if suppressed is not None:
                _log.exception(
                    "rendering /metrics failed (%d in total, %d not logged since the last)",
                    stats.scrapes["failed"],
                    suppressed,
                )
            await respond(send, 500, b"internal error while collecting metrics\n", head=head)
            return
        stats.scrapes[answer] += 1
        pieces = body.pieces
        headers = [(b"content-type", body.content_type.encode())]
        if body.gzip:
            headers.append((b"content-encoding", b"gzip"))
        if head or body.length <= PART:
            await respond(send, 200, b"".join(pieces), headers, head=head)
            return
        # In runs, each sent before the next is joined: the body is never held whole.
        headers.append((b"content-length", str(body.length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for run in coalesce(pieces):
            await send({"type": "http.response.body", "body": run, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def readyz(send: _Send, head: bool) -> None:
        lines = []
        ready = True
        for name, check in checks.items():
            try:
                passed = bool(check())
            except Exception:
                _log.exception("readiness check %s raised", name)
                passed = False
            if not getattr(check, "informational", False):
                ready &= passed
            line = f"[+]{name} ok" if passed else f"[-]{name} failed"
            reason = getattr(check, "reason", None)
            if not passed and callable(reason):
                try:
                    line += f": {' '.join(str(reason()).split())}"  # one line, whatever it says
                except Exception:
                    _log.exception("readiness check %s: reason() raised", name)
            lines.append(line)
        lines.append("readyz check passed" if ready else "readyz check failed")
        await respond(send, 200 if ready else 503, ("\n".join(lines) + "\n").encode(), head=head)

    async def app(scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return  # websockets: not served
        method = scope["method"]
        head = method == "HEAD"
        path = scope["path"]
        if path not in ("/metrics", "/healthz", "/readyz"):
            await respond(send, 404, b"not found\n", head=head)
        elif method not in ("GET", "HEAD"):
            await respond(send, 405, b"method not allowed\n", [(b"allow", b"GET, HEAD")], head=head)
        elif path == "/metrics":
            await metrics(scope, send, head)
        elif path == "/healthz":
            await respond(send, 200, b"ok\n", head=head)
        else:
            await readyz(send, head)

    return app


def make_route_app(routes: Mapping[str, Route], *, max_concurrent: int = 1) -> ASGIApp:
    """The ASGI application of :func:`serve_routes`: ``GET``/``HEAD`` of a path in ``routes``.

    Each answer is made by its route in a worker thread (at most ``max_concurrent`` at
    once; more wait); a route that raises costs that request a 500, never the server.
    ``/healthz`` answers ``ok`` unless a route of that name is given.
    """
    table = dict(routes)
    limiter = trio.CapacityLimiter(max_concurrent)

    async def respond(
        send: _Send, status: int, content_type: bytes, body: bytes, head: bool
    ) -> None:
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        if status == 405:
            headers.append((b"allow", b"GET, HEAD"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else body})

    async def app(scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            return  # our server sends HTTP scopes only
        method = scope["method"]
        head = method == "HEAD"
        path = scope["path"]
        route = table.get(path)
        if route is None and path != "/healthz":
            known = ", ".join(sorted({*table, "/healthz"}))
            await respond(send, 404, _TEXT, f"not found; paths: {known}\n".encode(), head)
            return
        if method not in ("GET", "HEAD"):
            await respond(send, 405, _TEXT, b"method not allowed\n", head)
            return
        if route is None:
            await respond(send, 200, _TEXT, b"ok\n", head)
            return
        params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            status, content_type, body = await trio.to_thread.run_sync(
                route, params, limiter=limiter
            )
        except Exception:
            _log.exception("the debug route %s failed", path)
            await respond(send, 500, _TEXT, b"internal error\n", head)
            return
        await respond(send, status, content_type, body, head)

    return app


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
    """The accept loop and the connections of one :func:`serve_http`."""

    def __init__(
        self, app: ASGIApp, limits: HttpLimits, stats: HttpStats, bound: str, what: str = "metrics"
    ) -> None:
        self.what = what
        self.app = app
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
            _log.exception("the metrics application's answer is not valid HTTP")
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
            (b"content-type", _TEXT),
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
        """Run the application for ``request`` and send its answer; False: close now.

        An answer in one body message is sent when the application is done (a 500 if it
        failed before answering).  One in several (``more_body``) goes out as it comes: the
        head with the first part, each part as soon as it is given, so a large answer is
        never held whole (``/metrics`` at N=1000 is 4.5 MB).  An application that fails
        after its head went out ends the connection.
        """
        has_body = any(
            (name == b"content-length" and value.strip() != b"0") or name == b"transfer-encoding"
            for name, value in request.headers
        )
        if not has_body:
            end = conn.next_event()  # a bodiless request's end comes with its head
            if not isinstance(end, h11.EndOfMessage):
                return False
        reply = _Reply(self.stats, conn, stream, connection, close=has_body)
        try:
            # Nothing protects the connection while its answer is made: it waits on the
            # render like any other waiter, and may be the one closed at a cap.
            await self._call_app(request, reply)
            if reply.streaming:
                if not reply.ended:  # the application stopped half-way: the answer is cut
                    return False
            else:
                await reply.send_whole()
        finally:
            connection.sending = False
            reply.release()
        return not has_body

    async def _call_app(self, request: h11.Request, reply: _Reply) -> None:
        """Run the ASGI application for ``request``; its answer goes to ``reply``."""
        target = request.target.decode("latin-1")
        if "://" in target:  # absolute form: keep the path and the query
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        raw_path, _, query = target.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"),
            "method": request.method.decode("latin-1").upper(),
            "scheme": "http",
            "path": unquote(raw_path),
            "raw_path": raw_path.encode("latin-1"),
            "query_string": query.encode("latin-1"),
            "root_path": "",
            "headers": list(request.headers),
            "client": None,
            "server": None,
        }

        async def receive() -> Mapping[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        try:
            await self.app(scope, receive, reply.send)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise  # the client went away while its answer went out: a close, not a bug
        except Exception:
            _log.exception("the metrics application failed on %s", raw_path)
            reply.failed()


class _Reply:
    """What the application answers to one request, sent as the server's rules say (see
    :meth:`_Server._answer`): whole at the end, or part by part once it says more parts
    follow.  ``held_bytes`` counts an answer until it is sent: a whole one while it goes
    out, a streamed one from its head (its ``content-length``) down as its parts go out."""

    def __init__(
        self,
        stats: HttpStats,
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
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.started = False  # the application sent its response start
        self.parts: list[bytes] = []
        self.streaming = False  # the head is on the wire
        self.ended = False

    async def send(self, message: Mapping[str, Any]) -> None:
        """The ASGI ``send`` callable."""
        if self.ended:
            return
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            self.started = True
        elif message["type"] == "http.response.body":
            body = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            if not self.streaming:
                if not more:
                    self.parts.append(body)
                    return
                if not self.started:
                    raise RuntimeError("a response body before its start")
                self._hold(self._declared())
                self._connection.start_answer()
                await self._stream.send_all(self._head())
                self.streaming = True
                parts, self.parts = self.parts, []
                for part in parts:  # what came before, in one message each
                    await self._data(part)
            await self._data(body)
            if not more:
                await self._stream.send_all(self._conn.send(h11.EndOfMessage()))
                self.ended = True

    def failed(self) -> None:
        """The application raised: a 500 unless its head is on the wire already."""
        if not self.streaming:
            self.started = False

    def release(self) -> None:
        """The answer is sent or abandoned: it no longer counts as held."""
        self._hold(-self._held)

    def _hold(self, size: int) -> None:
        self._held += size
        self._stats.held_bytes += size

    def _declared(self) -> int:
        for name, value in self.headers:
            if name.lower() == b"content-length" and value.strip().isdigit():
                return int(value)
        return 0

    def _head(self) -> bytes:
        headers = self.headers
        if self._close:
            headers = [*headers, (b"connection", b"close")]
        return self._conn.send(h11.Response(status_code=self.status, headers=headers))

    async def _data(self, data: bytes) -> None:
        if not data:
            return
        undeclared = len(data) > self._held  # an answer without a (true) content-length
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

    async def send_whole(self) -> None:
        """Send an answer that came in one body message (or none: a 500)."""
        if not self.started:
            self.status = 500
            self.headers = [(b"content-type", _TEXT), (b"content-length", b"15")]
            self.parts = [b"internal error\n"]
        body = b"".join(self.parts)
        self.parts = []
        self._hold(len(body))
        self._connection.start_answer()
        head = self._head()
        if len(body) <= _SMALL_BODY:  # one segment for the small answers
            await self._stream.send_all(head + self._conn.send(h11.Data(data=body)))
        else:
            await self._stream.send_all(head)
            await self._passthrough(body)
        await self._stream.send_all(self._conn.send(h11.EndOfMessage()))
        self.ended = True


_REASONS: Final = {
    400: "bad request",
    408: "request timeout",
    431: "request header fields too large",
    505: "http version not supported",
}


async def serve_http(
    bind: BindAddress,
    registry: CollectorRegistry,
    checks: Mapping[str, ReadinessCheck] | None = None,
    *,
    max_concurrent_scrapes: int = 2,
    freshness: float = 0.0,
    generation: Callable[[], Hashable] | None = None,
    limits: HttpLimits | None = None,
    stats: HttpStats | None = None,
    task_status: trio.TaskStatus[BindAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``bind`` until cancelled.

    The server's own counters (:class:`HttpCollector`) are registered in ``registry`` while
    it runs.

    Args:
        bind: the listen address (``parse_bind_address("--metrics-bind-address value")``).
        registry: the registry ``/metrics`` renders.
        checks: readiness checks for ``/readyz`` (see :func:`make_app`).
        max_concurrent_scrapes: concurrent ``/metrics`` renders.
        freshness: seconds a rendered body is reused by later scrapes (the agent: its
            monitor interval); 0: only scrapes that arrive during a render share it.
        generation: a body is never reused once this returns another value (the agent:
            the monitor's tick count); see :class:`ScrapeCache`.
        limits: what one client may cost (default :class:`HttpLimits`).
        stats: where the counters go (tests read them); a new one by default.
        task_status: ``started()`` receives the bound address (the real port when ``bind``
            asked for port 0) once the socket listens.

    Raises:
        HttpServerError: the address cannot be bound (raised before ``started()``).
    """
    limits = limits or HttpLimits()
    stats = stats or HttpStats()
    sock = open_listen_socket(bind)
    try:
        host, port = sock.getsockname()[:2]
        bound = BindAddress(host=bind.host if bind.host == "" else host, port=port)
        sock.listen(limits.backlog)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        cache = ScrapeCache(
            partial(render_pieces, registry),
            window=freshness,
            generation=generation,
            max_concurrent=max_concurrent_scrapes,
            max_pending=limits.max_pending_renders,
        )
        app = make_app(cache, checks, stats=stats)
        server = _Server(app, limits, stats, str(bound))
        collector = HttpCollector(stats)
        registry.register(collector)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(cache.serve)
                nursery.start_soon(server.accept_loop, listener, nursery)
                _log.info(
                    "serving /metrics, /healthz and /readyz on %s (HTTP/1.1, at most %d "
                    "connections, %d per peer, %gs per request, bodies kept %gs)",
                    bound,
                    limits.max_connections,
                    limits.max_connections_per_peer,
                    limits.request_timeout,
                    freshness,
                )
                task_status.started(bound)
        finally:
            registry.unregister(collector)
    finally:
        sock.close()


async def serve_routes(
    bind: BindAddress,
    routes: Mapping[str, Route],
    *,
    name: str,
    limits: HttpLimits | None = None,
    stats: HttpStats | None = None,
    task_status: trio.TaskStatus[BindAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``routes`` (:func:`make_route_app`) on ``bind`` until cancelled: the debug port.

    The same server as :func:`serve_http` (HTTP/1.1, connection cap, deadlines), another
    socket, no registry: its connections are counted in ``stats`` only, not on ``/metrics``.

    Args:
        bind: the listen address.
        routes: path -> :data:`Route`.
        name: what configured the address (``--debug-bind-address``), for the error.
        limits: what one client may cost (default :class:`HttpLimits`).
        stats: where the counters go (tests read them); a new one by default.
        task_status: ``started()`` receives the bound address once the socket listens.

    Raises:
        HttpServerError: the address cannot be bound; the message starts with ``name``
            (raised before ``started()``).
    """
    limits = limits or HttpLimits()
    stats = stats or HttpStats()
    try:
        sock = open_listen_socket(bind)
    except HttpServerError as exc:
        raise HttpServerError(f"{name} {bind}: {exc}") from exc.__cause__
    try:
        host, port = sock.getsockname()[:2]
        bound = BindAddress(host=bind.host if bind.host == "" else host, port=port)
        sock.listen(limits.backlog)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        server = _Server(make_route_app(routes), limits, stats, str(bound), what="debug")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.accept_loop, listener, nursery)
            _log.info(
                "serving %s on %s (HTTP/1.1, at most %d connections, %gs per request)",
                ", ".join(sorted(routes)),
                bound,
                limits.max_connections,
                limits.request_timeout,
            )
            task_status.started(bound)
    finally:
        sock.close()
