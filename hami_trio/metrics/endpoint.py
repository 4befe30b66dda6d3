"""The metrics port: ``/metrics``, ``/healthz``, ``/readyz`` on the agent's HTTP server.

:func:`make_handler` answers the three paths; :func:`serve_http` runs it on
:func:`hami_trio.http.server.serve` in the agent's nursery, every connection bounded by
:class:`~hami_trio.http.server.HttpLimits`.  ``/metrics`` answers from
:class:`~hami_trio.metrics.scrapecache.ScrapeCache`: one body per format and freshness window,
rendered in a worker thread and shared by every scrape in the window (content negotiation,
gzip); an uncached render (``name[]``) that finds the render queue full is answered ``503``
with ``Retry-After`` at once.  ``/healthz`` and ``/readyz`` never render nor queue;
``/readyz`` runs the injected checks.  Paths, limits and binding: docs/metrics.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping, Sequence
from functools import partial
from typing import Final, Literal, Protocol, cast, get_args

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from hami_trio.goparse import BindAddress
from hami_trio.http.server import (
    OUTCOMES,
    TEXT,
    Handler,
    HttpLimits,
    Request,
    Response,
    ServerStats,
    serve,
)
from hami_trio.logs import RateLimiter
from hami_trio.metrics.scrapecache import (
    PART,
    Body,
    RenderQueueFull,
    ScrapeCache,
    coalesce,
)

__all__ = [
    "SCRAPE_ANSWERS",
    "HttpCollector",
    "HttpStats",
    "ReadinessCheck",
    "ScrapeAnswer",
    "SelfRendering",
    "make_handler",
    "progress_check",
    "render_metrics",
    "render_pieces",
    "serve_http",
]

_log = logging.getLogger(__name__)

#: A readiness check: returns True when its component is ready.  Must not block.
ReadinessCheck = Callable[[], bool]

_EOF: Final = b"# EOF\n"
_LOG_INTERVAL: Final = 60.0
_PATHS: Final = ("/metrics", "/healthz", "/readyz")
_ALLOW: Final = (b"allow", b"GET, HEAD")

#: How a ``/metrics`` request was answered (the ``answer`` label of
#: ``hami_trio_http_scrapes_total``).
ScrapeAnswer = Literal[
    "rendered",  # a render was started for it
    "shared",  # the body of its freshness window (kept, or in flight) was sent
    "busy",  # 503: the render queue was full
    "failed",  # 500: the render raised
]
SCRAPE_ANSWERS: Final[tuple[ScrapeAnswer, ...]] = get_args(ScrapeAnswer)


class HttpStats(ServerStats):
    """The metrics port's counters (read by :class:`HttpCollector`, and by tests).

    Attributes:
        scrapes: ``/metrics`` requests, by how they were answered; the connections' counters
            are :class:`~hami_trio.http.server.ServerStats`'.
    """

    def __init__(self) -> None:
        super().__init__()
        self.scrapes: dict[ScrapeAnswer, int] = dict.fromkeys(SCRAPE_ANSWERS, 0)


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


def _prepared(
    prepare: Callable[[], object], registry: CollectorRegistry, accept: str, names: list[str]
) -> tuple[list[bytes], str]:
    prepare()
    return render_pieces(registry, accept, names)


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


def make_handler(
    cache: ScrapeCache,
    checks: Mapping[str, ReadinessCheck] | None = None,
    *,
    stats: HttpStats | None = None,
) -> Handler:
    """What :func:`serve_http` answers with.

    Args:
        cache: where ``/metrics`` bodies come from (its :meth:`~ScrapeCache.serve` must run).
        checks: readiness checks by name, evaluated in order on every ``/readyz``.  A check
            that raises counts as failed (and is logged).  A failing check with a
            ``reason()`` method has its reason appended to its line; one with a true
            ``informational`` attribute is listed but does not make ``/readyz`` fail.
        stats: where ``/metrics`` answers are counted (``scrapes``).
    """
    checks = dict(checks or {})
    stats = stats or HttpStats()
    # A flood of scrapes must not become a flood of log lines: once a minute, with a count.
    log_limiter = RateLimiter(_LOG_INTERVAL, max_keys=4, clock=trio.current_time)

    async def metrics(request: Request) -> Response:
        headers = request.headers
        try:
            body, answer = await cache.body(
                headers.get("accept", ""),
                gzip_accepted(headers.get("accept-encoding", "")),
                request.query.get("name[]", []),
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
            retry = [(b"content-type", TEXT), (b"retry-after", str(full.retry_after).encode())]
            return Response(503, retry, b"busy: too many renders queued\n")
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
            return Response(500, body=b"internal error while collecting metrics\n")
        stats.scrapes[answer] += 1
        return _body_response(body)

    def readyz() -> Response:
        lines = []
        ready = True
        for name, check in checks.items():
            passed, line = _readiness_line(name, check)
            if not getattr(check, "informational", False):
                ready &= passed
            lines.append(line)
        lines.append("readyz check passed" if ready else "readyz check failed")
        return Response(200 if ready else 503, body=("\n".join(lines) + "\n").encode())

    async def handle(request: Request) -> Response:
        path = request.path
        if path not in _PATHS:
            return Response(404, body=b"not found\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, [_ALLOW], b"method not allowed\n")
        if path == "/metrics":
            return await metrics(request)
        if path == "/healthz":
            return Response(200, body=b"ok\n")
        return readyz()

    return handle


def _body_response(body: Body) -> Response:
    """The 200 answer carrying one rendered ``/metrics`` body."""
    pieces = body.pieces
    content = [(b"content-type", body.content_type.encode())]
    if body.gzip:
        content.append((b"content-encoding", b"gzip"))
    if body.length <= PART:
        return Response(200, content, b"".join(pieces))
    # In runs, each sent before the next is joined: the body is never held whole.
    return Response(200, content, parts=_runs(pieces), length=body.length)


def _readiness_line(name: str, check: ReadinessCheck) -> tuple[bool, str]:
    """Run one readiness check: whether it passed, and its ``/readyz`` line."""
    try:
        passed = bool(check())
    except Exception:
        _log.exception("readiness check %s raised", name)
        passed = False
    line = f"[+]{name} ok" if passed else f"[-]{name} failed"
    reason = getattr(check, "reason", None)
    if not passed and callable(reason):
        try:
            line += f": {' '.join(str(reason()).split())}"  # one line, whatever it says
        except Exception:
            _log.exception("readiness check %s: reason() raised", name)
    return passed, line


async def _runs(pieces: Sequence[bytes]) -> AsyncIterator[bytes]:
    for run in coalesce(pieces):
        yield run


async def serve_http(
    bind: BindAddress,
    registry: CollectorRegistry,
    checks: Mapping[str, ReadinessCheck] | None = None,
    *,
    max_concurrent_scrapes: int = 2,
    freshness: float = 0.0,
    generation: Callable[[], Hashable] | None = None,
    prepare: Callable[[], object] | None = None,
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
        checks: readiness checks for ``/readyz`` (see :func:`make_handler`).
        max_concurrent_scrapes: concurrent ``/metrics`` renders.
        freshness: seconds a rendered body is reused by later scrapes (the agent: its
            monitor interval); 0: only scrapes that arrive during a render share it.
        generation: a body is never reused once this returns another value (the agent:
            the monitor's tick count); see :class:`ScrapeCache`.
        prepare: called at the start of every render, in its worker thread, before the
            registry is collected (the agent: the monitor's usage read, so that its own
            self-metrics describe the read this body shows).
        limits: what one client may cost (default :class:`HttpLimits`).
        stats: where the counters go (tests read them); a new one by default.
        task_status: ``started()`` receives the bound address (the real port when ``bind``
            asked for port 0) once the socket listens.

    Raises:
        HttpServerError: the address cannot be bound (raised before ``started()``).
    """
    limits = limits or HttpLimits()
    stats = stats or HttpStats()
    cache = ScrapeCache(
        partial(render_pieces, registry)
        if prepare is None
        else partial(_prepared, prepare, registry),
        window=freshness,
        generation=generation,
        max_concurrent=max_concurrent_scrapes,
        max_pending=limits.max_pending_renders,
    )
    collector = HttpCollector(stats)

    async def renders(*, task_status: trio.TaskStatus[None]) -> None:
        # Once the socket is bound: a busy port never leaves a collector behind.
        registry.register(collector)
        try:
            await cache.serve(task_status=task_status)
        finally:
            registry.unregister(collector)

    await serve(
        bind,
        make_handler(cache, checks, stats=stats),
        what="metrics",
        paths=_PATHS,
        limits=limits,
        stats=stats,
        start=renders,
        detail=f", bodies kept {freshness:g}s",
        task_status=task_status,
    )
