"""A table of paths, each answered in a worker thread: the debug view's server (docs/debug.md).

The same server as the metrics port (HTTP/1.1, connection cap, deadlines), another socket,
no registry: its connections are counted in its :class:`~hami_trio.http.server.ServerStats`
only, not on ``/metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final

import trio

from hami_trio.goparse import BindAddress
from hami_trio.http.server import (
    TEXT,
    Handler,
    HttpLimits,
    Request,
    Response,
    ServerStats,
    serve,
)

__all__ = ["Route", "RouteAnswer", "route_handler", "serve_routes"]

_log = logging.getLogger(__name__)

#: What a :data:`Route` answers: status, content type, body.
RouteAnswer = tuple[int, bytes, bytes]
#: One path of :func:`serve_routes`: the query parameters -> the answer.  Runs in a worker
#: thread, so it must only read state that is safe to read from one (immutable views).
Route = Callable[[Mapping[str, list[str]]], RouteAnswer]

_ALLOW: Final = (b"allow", b"GET, HEAD")


def route_handler(routes: Mapping[str, Route], *, max_concurrent: int = 1) -> Handler:
    """The handler of :func:`serve_routes`: ``GET``/``HEAD`` of a path in ``routes``.

    Each answer is made by its route in a worker thread (at most ``max_concurrent`` at
    once; more wait); a route that raises costs that request a 500, never the server.
    ``/healthz`` answers ``ok`` unless a route of that name is given.
    """
    table = dict(routes)
    limiter = trio.CapacityLimiter(max_concurrent)

    async def handle(request: Request) -> Response:
        path = request.path
        route = table.get(path)
        if route is None and path != "/healthz":
            known = ", ".join(sorted({*table, "/healthz"}))
            return Response(404, body=f"not found; paths: {known}\n".encode())
        if request.method not in ("GET", "HEAD"):
            return Response(405, [(b"content-type", TEXT), _ALLOW], b"method not allowed\n")
        if route is None:
            return Response(200, body=b"ok\n")
        try:
            status, content_type, body = await trio.to_thread.run_sync(
                route, request.query, limiter=limiter
            )
        except Exception:
            _log.exception("the debug route %s failed", path)
            return Response(500, body=b"internal error\n")
        return Response(status, [(b"content-type", content_type)], body)

    return handle


async def serve_routes(
    bind: BindAddress,
    routes: Mapping[str, Route],
    *,
    name: str,
    limits: HttpLimits | None = None,
    stats: ServerStats | None = None,
    task_status: trio.TaskStatus[BindAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``routes`` (:func:`route_handler`) on ``bind`` until cancelled: the debug port.

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
    await serve(
        bind,
        route_handler(routes),
        what="debug",
        paths=sorted(routes),
        name=name,
        limits=limits,
        stats=stats,
        task_status=task_status,
    )
