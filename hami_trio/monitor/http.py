"""The agent's HTTP endpoint: ``/metrics``, ``/healthz`` and ``/readyz``.

How this works.  A small ASGI application (:func:`make_app`) is served by hypercorn's trio
worker in the agent's nursery (:func:`serve_http`); we do not write HTTP ourselves.

- ``/metrics`` renders the injected Prometheus registry in the format the ``Accept`` header
  asks for (Prometheus text 0.0.4 by default, OpenMetrics for Prometheus servers that prefer
  it; prometheus-client's ``choose_encoder`` decides), gzip-compressed when accepted, and
  ``name[]`` restricts the output like prometheus-client's own handlers.  Rendering walks every
  collector - at a few thousand containers that is tens of milliseconds of CPU - so it runs in
  a worker thread (at most ``max_concurrent_scrapes`` at once) and the trio loop keeps serving
  the broker meanwhile.  prometheus-client's own ASGI app would render on the event loop,
  which is why we do not mount it directly.
- ``/healthz`` answers 200 while the event loop runs (liveness).
- ``/readyz`` runs the injected readiness checks (name -> callable returning bool; for
  instance broker listening, pod source synced, monitor ticking) and answers 200 when all
  pass, else 503; the body lists each check like Kubernetes' own ``/readyz?verbose``.

Binding follows Go's ``net.Listen`` for the ``--metrics-bind-address`` value: ``:9394`` listens
on every interface (IPv6 dual-stack, or IPv4 only where the host has no IPv6), ``host:port`` on
one address, port 0 on a free port.  We create and bind the socket ourselves so that a busy
port fails start-up with a clear :class:`~hami_trio.errors.HttpServerError` before
``task_status.started()``, and the started value reports the port actually bound.
"""

from __future__ import annotations

import errno
import gzip
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol, cast
from urllib.parse import parse_qs

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from hami_trio.config import BindAddress
from hami_trio.errors import HttpServerError

__all__ = [
    "ASGIApp",
    "ReadinessCheck",
    "SelfRendering",
    "make_app",
    "open_listen_socket",
    "progress_check",
    "render_metrics",
    "serve_http",
]

_log = logging.getLogger(__name__)

#: A readiness check: returns True when its component is ready.  Must not block.
ReadinessCheck = Callable[[], bool]

_Scope = Mapping[str, Any]
_Receive = Callable[[], Awaitable[Mapping[str, Any]]]
_Send = Callable[[Mapping[str, Any]], Awaitable[None]]
#: An ASGI 3 application.
ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

_TEXT: Final = b"text/plain; charset=utf-8"
_EOF: Final = "# EOF\n"


class SelfRendering(Protocol):
    """A metric family that writes its own exposition text (see ``metrics.FastGauge``).

    The text must be valid in both the Prometheus text format and OpenMetrics (true for
    gauges: ``# HELP``, ``# TYPE`` and ``name{labels} value`` lines).
    """

    def exposition(self) -> str:
        """The family's lines, each ending in a newline."""
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
    encoder, content_type = choose_encoder(accept)
    if names:
        return encoder(registry.restricted_registry(names)), content_type
    openmetrics = content_type.startswith("application/openmetrics-text")
    parts: list[str] = []
    for family in registry.collect():
        exposition = getattr(family, "exposition", None)
        if exposition is not None:
            parts.append(cast(SelfRendering, family).exposition())
            continue
        text = encoder(cast(Collector, _OneFamily(family))).decode("utf-8")
        if openmetrics and text.endswith(_EOF):
            text = text[: -len(_EOF)]
        parts.append(text)
    if openmetrics:
        parts.append(_EOF)
    return "".join(parts).encode("utf-8"), content_type


def _render(
    registry: CollectorRegistry, accept: str, encoding: str, names: list[str]
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """Render the registry (runs in a worker thread)."""
    body, content_type = render_metrics(registry, accept, names)
    headers = [(b"content-type", content_type.encode())]
    if gzip_accepted(encoding):
        body = gzip.compress(body, compresslevel=1)  # fast: scrapes are frequent and local
        headers.append((b"content-encoding", b"gzip"))
    return body, headers


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
    registry: CollectorRegistry,
    checks: Mapping[str, ReadinessCheck] | None = None,
    *,
    max_concurrent_scrapes: int = 2,
) -> ASGIApp:
    """The ASGI application behind :func:`serve_http`.

    Args:
        registry: what ``/metrics`` renders.
        checks: readiness checks by name, evaluated in order on every ``/readyz``.  A check
            that raises counts as failed (and is logged).  A failing check with a
            ``reason()`` method has its reason appended to its line; one with a true
            ``informational`` attribute is listed but does not make ``/readyz`` fail.
        max_concurrent_scrapes: renders running at once in worker threads; more wait.

    Returns:
        An ASGI 3 callable (HTTP and lifespan scopes).
    """
    checks = dict(checks or {})
    limiter = trio.CapacityLimiter(max_concurrent_scrapes)

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
            body, headers = await trio.to_thread.run_sync(
                _render,
                registry,
                request_headers.get("accept", ""),
                request_headers.get("accept-encoding", ""),
                params.get("name[]", []),
                limiter=limiter,
            )
        except Exception:
            # A collector bug must cost one scrape, not the endpoint.
            _log.exception("rendering /metrics failed")
            await respond(send, 500, b"internal error while collecting metrics\n", head=head)
            return
        await respond(send, 200, body, headers, head=head)

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


async def serve_http(
    bind: BindAddress,
    registry: CollectorRegistry,
    checks: Mapping[str, ReadinessCheck] | None = None,
    *,
    max_concurrent_scrapes: int = 2,
    task_status: trio.TaskStatus[BindAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``bind`` until cancelled.

    Args:
        bind: the listen address (``parse_bind_address("--metrics-bind-address value")``).
        registry: the registry ``/metrics`` renders.
        checks: readiness checks for ``/readyz`` (see :func:`make_app`).
        max_concurrent_scrapes: concurrent ``/metrics`` renders.
        task_status: ``started()`` receives the bound address (the real port when ``bind``
            asked for port 0) once the socket listens.

    Raises:
        HttpServerError: the address cannot be bound (raised before ``started()``).
    """
    sock = open_listen_socket(bind)
    host, port = sock.getsockname()[:2]
    bound = BindAddress(host=bind.host if bind.host == "" else host, port=port)
    # hypercorn takes the listening socket as "fd://N" and closes it itself; give it a
    # duplicate so that our own object stays valid and is closed exactly once below.
    handed_over = os.dup(sock.fileno())
    identity = os.fstat(handed_over).st_ino
    config = Config()
    config.bind = [f"fd://{handed_over}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hami_trio.monitor.http.server")
    config.read_timeout = 30  # a client that stalls mid-request is dropped
    config.keep_alive_timeout = 5
    config.graceful_timeout = 1
    app = make_app(registry, checks, max_concurrent_scrapes=max_concurrent_scrapes)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, app, config)
            _log.info("serving /metrics, /healthz and /readyz on %s", bound)
            task_status.started(bound)
    finally:
        sock.close()
        # If we were cancelled before hypercorn adopted the duplicate, close it here; a
        # reused descriptor number would point at another inode and is left alone.
        try:
            if os.fstat(handed_over).st_ino == identity:
                os.close(handed_over)
        except OSError:
            pass
