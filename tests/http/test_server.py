"""Tests of the HTTP server itself: binding, limits, answers in parts (the metrics port's
behaviour under load is in tests/metrics/test_endpoint.py, the debug port's in test_routes.py)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio

from hami_trio.errors import ConfigError, HttpServerError
from hami_trio.goparse import BindAddress, parse_bind_address
from hami_trio.http.server import (
    Handler,
    HttpLimits,
    Request,
    Response,
    ServerStats,
    open_listen_socket,
    serve,
)
from tests.http.client import until


def test_unresolvable_host() -> None:
    with pytest.raises(HttpServerError, match="cannot resolve"):
        open_listen_socket(BindAddress("no-such-host.invalid", 0))


def test_all_interfaces_binding() -> None:
    sock = open_listen_socket(parse_bind_address(":0"))
    try:
        assert sock.getsockname()[1] > 0
        if sock.family == socket.AF_INET6:  # dual stack: IPv4 clients reach it too
            assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
    finally:
        sock.close()


async def test_limits_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_connections"):
        HttpLimits(max_connections=0)
    with pytest.raises(ConfigError, match="request_timeout"):
        HttpLimits(request_timeout=0)


# --- answers in parts -----------------------------------------------------------------------


async def serve_handler(nursery: trio.Nursery, handler: Handler, stats: ServerStats) -> int:
    """Serve one ``handler`` with the server on 127.0.0.1; the port."""
    bound: BindAddress = await nursery.start(
        partial(
            serve,
            parse_bind_address("127.0.0.1:0"),
            handler,
            what="test",
            paths=["/"],
            stats=stats,
        )
    )
    return bound.port


async def test_parts_are_sent_as_they_come_and_a_failure_half_way_ends_the_connection(
    nursery: trio.Nursery,
) -> None:
    went_out = trio.Event()
    fail = [False]

    async def second() -> AsyncIterator[bytes]:
        yield b"first "
        await went_out.wait()  # the client has the first part before the second exists
        if fail[0]:
            raise RuntimeError("the answer failed half-way")
        yield b"second"

    async def handler(request: Request) -> Response:
        return Response(200, [(b"content-type", b"text/plain")], parts=second(), length=12)

    stats = ServerStats()
    port = await serve_handler(nursery, handler, stats)

    def first_part_then_rest() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while not data.endswith(b"first "):
                data += sock.recv(4096)
            trio.from_thread.run_sync(went_out.set)
            while chunk := sock.recv(4096):
                data += chunk
                if data.endswith(b"second"):
                    break
        return data

    answer = await trio.to_thread.run_sync(first_part_then_rest)
    assert answer.startswith(b"HTTP/1.1 200")
    assert answer.endswith(b"\r\n\r\nfirst second")
    assert stats.held_bytes == 0
    went_out = trio.Event()
    fail[0] = True
    cut = await trio.to_thread.run_sync(first_part_then_rest)
    assert cut.endswith(b"first ")  # the head and the first part, then the close
    assert stats.held_bytes == 0
    assert stats.open == 0 or await until(lambda: stats.open == 0, seconds=5)
