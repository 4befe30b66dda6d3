"""Test-side clients of the broker and a helper to run one broker inside a test."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry

from hami_trio.broker.protocol import VALID_REQUEST
from hami_trio.broker.server import BrokerConfig, BrokerHandle, serve_broker

__all__ = ["exchange", "present", "read_to_eof", "rejected", "running_broker", "send_now"]


@asynccontextmanager
async def running_broker(
    config: BrokerConfig, registry: CollectorRegistry | None = None
) -> AsyncIterator[BrokerHandle]:
    """Start a broker in its own nursery; stop it gracefully when the block ends."""
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(partial(serve_broker, config, registry=registry))
        try:
            yield handle
        finally:
            handle.stop()


async def read_to_eof(sock: trio.socket.SocketType) -> bytes:
    """Everything the server sends until it closes."""
    data = b""
    while chunk := await sock.recv(64):
        data += chunk
    return data


async def exchange(path: Path, payload: bytes = VALID_REQUEST) -> bytes:
    """Connect, send ``payload``, half-close, and return everything until EOF."""
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        await sock.connect(str(path))
        if payload:
            await sock.send(payload)
        sock.shutdown(socket.SHUT_WR)
        return await read_to_eof(sock)


def send_now(path: Path, payload: bytes = VALID_REQUEST) -> trio.socket.SocketType:
    """Connect and send without yielding to trio: the request is there before any accept.

    A Unix-socket connect completes as soon as the connection is queued, so this never blocks
    while the listen backlog has room.  Read the answer with :func:`read_to_eof`.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        if payload:
            sock.sendall(payload)
    except BaseException:
        sock.close()
        raise
    return trio.socket.from_stdlib_socket(sock)


async def rejected(path: Path, count: int = 1) -> None:
    """Open ``count`` idle connections that the broker closes at once (its slots are full).

    They stay open until the broker has seen them (a client that closes first is an ``eof``,
    not a rejection), and each must be closed by the broker without an answer.
    """
    socks = [send_now(path, b"") for _ in range(count)]
    try:
        for sock in socks:
            assert await read_to_eof(sock) == b""
    finally:
        for sock in socks:
            sock.close()


def present(path: Path) -> bool:
    """Whether anything exists at ``path``.

    Synchronous on purpose: a ``trio.Path`` call runs in a thread, and while it does, an
    autojump clock sees an idle loop and jumps (expiring the broker's deadlines).
    """
    return os.path.lexists(path)


def blocking_exchange(path: Path, payload: bytes = VALID_REQUEST, timeout: float = 5.0) -> bytes:
    """A plain blocking client (for forked children, threads and processes outside trio)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(payload)
        data = b""
        while chunk := sock.recv(64):
            data += chunk
        return data
