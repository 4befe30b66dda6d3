"""A client for the HTTP server's tests: urllib in a worker thread, on 127.0.0.1."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio


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


async def until(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await trio.sleep(0.05)
    return True
