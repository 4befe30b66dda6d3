"""Tests of the HTTP endpoint over real HTTP on 127.0.0.1 (urllib in a worker thread)."""

from __future__ import annotations

import gzip
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial

import pytest
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from hami_trio.config import BindAddress, parse_bind_address
from hami_trio.errors import HttpServerError
from hami_trio.monitor.http import (
    ReadinessCheck,
    open_listen_socket,
    progress_check,
    serve_http,
)


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


def _fetch(url: str, method: str, headers: Mapping[str, str]) -> Response:
    request = urllib.request.Request(url, method=method, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return Response(
                reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read()
            )
    except urllib.error.HTTPError as error:
        with error:
            return Response(
                error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()
            )


async def fetch(
    port: int, path: str, *, method: str = "GET", headers: Mapping[str, str] | None = None
) -> Response:
    url = f"http://127.0.0.1:{port}{path}"
    return await trio.to_thread.run_sync(_fetch, url, method, headers or {})


class ThreadRecorder(Collector):
    """A collector that records the thread it runs in, and can be told to fail."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.fail = False

    def collect(self) -> Iterator[Metric]:
        self.threads.add(threading.get_ident())
        if self.fail:
            raise RuntimeError("collector bug")
        family = GaugeMetricFamily("test_info", "a test family", labels=["zone"])
        family.add_metric(["vGPU"], 1)
        yield family


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("test_gauge", "a gauge", ["who"], registry=registry).labels("me").set(3.5)
    Counter("test_events", "a counter", registry=registry).inc(2)
    return registry


async def start(
    nursery: trio.Nursery,
    registry: CollectorRegistry,
    checks: Mapping[str, ReadinessCheck] | None = None,
) -> int:
    bound: BindAddress = await nursery.start(
        partial(serve_http, parse_bind_address("127.0.0.1:0"), registry, checks)
    )
    assert bound.host == "127.0.0.1"
    assert bound.port > 0
    return bound.port


async def test_metrics_text_format(nursery: trio.Nursery, registry: CollectorRegistry) -> None:
    port = await start(nursery, registry)
    reply = await fetch(port, "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}
    assert families["test_gauge"].samples[0].labels == {"who": "me"}
    assert families["test_gauge"].samples[0].value == 3.5
    assert families["test_events"].type == "counter"


async def test_metrics_openmetrics_by_accept(
    nursery: trio.Nursery, registry: CollectorRegistry
) -> None:
    port = await start(nursery, registry)
    accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4"
    reply = await fetch(port, "/metrics", headers={"Accept": accept})
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert reply.body.endswith(b"# EOF\n")
    families = {f.name: f for f in parse_openmetrics(reply.body.decode())}
    assert families["test_events"].samples[0].value == 2


async def test_metrics_gzip_and_name_filter(
    nursery: trio.Nursery, registry: CollectorRegistry
) -> None:
    port = await start(nursery, registry)
    reply = await fetch(port, "/metrics?name[]=test_gauge", headers={"Accept-Encoding": "gzip"})
    assert reply.headers["content-encoding"] == "gzip"
    text = gzip.decompress(reply.body).decode()
    assert [f.name for f in text_string_to_metric_families(text)] == ["test_gauge"]


async def test_scrape_renders_in_a_worker_thread(
    nursery: trio.Nursery, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = ThreadRecorder()
    registry.register(recorder)
    port = await start(nursery, registry)
    assert (await fetch(port, "/metrics")).status == 200
    assert recorder.threads
    assert threading.get_ident() not in recorder.threads
    recorder.fail = True
    reply = await fetch(port, "/metrics")
    assert reply.status == 500
    assert "rendering /metrics failed" in caplog.text
    recorder.fail = False
    assert (await fetch(port, "/metrics")).status == 200  # the endpoint survives


async def test_health_and_readiness(nursery: trio.Nursery, registry: CollectorRegistry) -> None:
    state = {"broker": True, "pod-watch": False}

    def broken() -> bool:
        raise RuntimeError("check bug")

    checks: dict[str, ReadinessCheck] = {
        "broker": lambda: state["broker"],
        "pod-watch": lambda: state["pod-watch"],
    }
    port = await start(nursery, registry, checks)
    health = await fetch(port, "/healthz")
    assert (health.status, health.body) == (200, b"ok\n")
    reply = await fetch(port, "/readyz")
    assert reply.status == 503
    assert reply.body == b"[+]broker ok\n[-]pod-watch failed\nreadyz check failed\n"
    state["pod-watch"] = True
    reply = await fetch(port, "/readyz")
    assert reply.status == 200
    assert reply.body == b"[+]broker ok\n[+]pod-watch ok\nreadyz check passed\n"
    checks["monitor"] = broken  # the app copied the mapping: later changes have no effect
    assert (await fetch(port, "/readyz")).status == 200


async def test_raising_check_fails_readiness(
    nursery: trio.Nursery, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> bool:
        raise RuntimeError("check bug")

    port = await start(nursery, registry, {"monitor": broken})
    reply = await fetch(port, "/readyz")
    assert reply.status == 503
    assert b"[-]monitor failed" in reply.body
    assert "readiness check monitor raised" in caplog.text


async def test_no_checks_is_ready(nursery: trio.Nursery, registry: CollectorRegistry) -> None:
    port = await start(nursery, registry)
    assert (await fetch(port, "/readyz")).status == 200


async def test_methods_and_paths(nursery: trio.Nursery, registry: CollectorRegistry) -> None:
    port = await start(nursery, registry)
    assert (await fetch(port, "/nope")).status == 404
    reply = await fetch(port, "/metrics", method="POST")
    assert reply.status == 405
    assert reply.headers["allow"] == "GET, HEAD"
    head = await fetch(port, "/metrics", method="HEAD")
    assert head.status == 200
    assert head.body == b""
    assert int(head.headers["content-length"]) > 0


async def test_busy_port_fails_before_started(
    nursery: trio.Nursery, registry: CollectorRegistry
) -> None:
    port = await start(nursery, registry)
    with pytest.raises(HttpServerError, match=f"127.0.0.1:{port}"):
        await nursery.start(serve_http, BindAddress("127.0.0.1", port), registry)


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


async def test_all_interfaces_serves_ipv4(
    nursery: trio.Nursery, registry: CollectorRegistry
) -> None:
    bound: BindAddress = await nursery.start(serve_http, parse_bind_address(":0"), registry)
    assert bound.host == ""
    assert (await fetch(bound.port, "/healthz")).status == 200


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_cancel_closes_the_listener(registry: CollectorRegistry) -> None:
    before = _open_fds()
    async with trio.open_nursery() as nursery:
        port = await start(nursery, registry)
        assert (await fetch(port, "/healthz")).status == 200
        nursery.cancel_scope.cancel()
    assert _open_fds() == before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_progress_check() -> None:
    now = [0.0]
    ticks = [0]
    paused = [False]
    check = progress_check(
        lambda: ticks[0], max_stall=15, idle=lambda: paused[0], clock=lambda: now[0]
    )
    assert not check()  # no tick yet
    ticks[0] = 1
    now[0] = 5
    assert check()
    now[0] = 20  # 15 s after the last observed change
    assert check()
    now[0] = 20.5
    assert not check()  # stalled
    paused[0] = True
    now[0] = 100
    assert check()  # paused by the MIG lock: not a stall
    paused[0] = False
    now[0] = 110
    assert check()  # counting restarts after the pause
    now[0] = 116
    assert not check()
    ticks[0] = 2
    assert check()
