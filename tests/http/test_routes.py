"""Tests of the debug port's server: a table of paths answered in worker threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import partial

import pytest
import trio

from hami_trio.errors import HttpServerError
from hami_trio.goparse import BindAddress, parse_bind_address
from hami_trio.http.routes import Route, RouteAnswer, serve_routes
from hami_trio.http.server import HttpLimits, ServerStats
from tests.http.client import fetch, until
from tests.procnet import stalled_client

# -- serve_routes: the debug port's server ----------------------------------------------------


async def start_routes(
    nursery: trio.Nursery,
    routes: Mapping[str, Route],
    *,
    limits: HttpLimits | None = None,
    stats: ServerStats | None = None,
) -> int:
    bound: BindAddress = await nursery.start(
        partial(
            serve_routes,
            parse_bind_address("127.0.0.1:0"),
            routes,
            name="--test-bind",
            limits=limits,
            stats=stats,
        )
    )
    return bound.port


async def test_routes_answer_from_a_worker_thread_and_refuse_the_rest(
    nursery: trio.Nursery,
) -> None:
    threads: list[int] = []
    queries: list[Mapping[str, list[str]]] = []

    def state(params: Mapping[str, list[str]]) -> RouteAnswer:
        threads.append(threading.get_ident())
        queries.append(params)
        return 200, b"application/json", b'{"ok": true}\n'

    def broken(params: Mapping[str, list[str]]) -> RouteAnswer:
        raise RuntimeError("route bug")

    port = await start_routes(nursery, {"/debug/state": state, "/debug/broken": broken})
    reply = await fetch(port, "/debug/state?pod=a&pod=b&namespace=team")
    assert (reply.status, reply.body) == (200, b'{"ok": true}\n')
    assert reply.headers["content-type"] == "application/json"
    assert queries == [{"pod": ["a", "b"], "namespace": ["team"]}]
    assert threads
    assert threading.get_ident() not in threads
    head = await fetch(port, "/debug/state", method="HEAD")
    assert (head.status, head.body, head.headers["content-length"]) == (200, b"", "13")
    assert (await fetch(port, "/healthz")).body == b"ok\n"
    missing = await fetch(port, "/metrics")  # never the metrics
    assert missing.status == 404
    assert missing.body == b"not found; paths: /debug/broken, /debug/state, /healthz\n"
    post = await fetch(port, "/debug/state", method="POST")
    assert (post.status, post.headers["allow"]) == (405, "GET, HEAD")
    # A route that fails costs its request, never the server.
    assert (await fetch(port, "/debug/broken")).status == 500
    assert (await fetch(port, "/debug/state")).status == 200


async def test_routes_keep_the_servers_limits(nursery: trio.Nursery) -> None:
    stats = ServerStats()
    limits = HttpLimits(max_connections=4, request_timeout=2.0)
    port = await start_routes(
        nursery,
        {"/x": lambda params: (200, b"text/plain", b"x" * (1 << 20))},
        limits=limits,
        stats=stats,
    )
    socks = [stalled_client(port, "/x")[0] for _ in range(4)]
    try:
        assert await until(lambda: stats.open == 4, seconds=5)
        socks.append(stalled_client(port, "/x")[0])  # one more than the cap: one goes
        assert await until(lambda: stats.counts["evicted"] == 1, seconds=5)
        assert stats.open == 4
        # Clients that never read are closed at the request deadline, their answers freed.
        assert await until(lambda: stats.open == 0, seconds=10)
        assert stats.counts["response_timeout"] == 4
        assert stats.held_bytes == 0
    finally:
        for sock in socks:
            sock.close()
    assert (await fetch(port, "/healthz")).status == 200


async def test_routes_busy_address_names_what_configured_it(nursery: trio.Nursery) -> None:
    port = await start_routes(nursery, {})
    with pytest.raises(
        HttpServerError, match=f"^--test-bind 127.0.0.1:{port}: cannot listen on 127.0.0.1:{port}"
    ):
        await nursery.start(
            partial(serve_routes, BindAddress("127.0.0.1", port), {}, name="--test-bind")
        )
