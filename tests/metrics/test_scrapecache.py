"""Tests of the scrape cache: one body per key and freshness window, shared by its scrapes."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable

import pytest
import trio

from hami_trio.metrics.scrapecache import (
    Body,
    RenderFailedError,
    RenderQueueFull,
    ScrapeCache,
    coalesce,
    gzip_compress,
)

OPENMETRICS = "application/openmetrics-text;version=1.0.0"


class Renders:
    """A render that counts its calls, can be held in flight and told to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self, accept: str, names: list[str]) -> tuple[list[bytes], str]:
        self.calls.append((accept, names))
        assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("collector bug")
        n = len(self.calls)
        return [b"# a body\n", f"render {n}\n".encode() * 1000], f"text/x-{bool(accept)}"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def started(
    nursery: trio.Nursery, renders: Renders, **options: object
) -> tuple[ScrapeCache, Clock]:
    clock = Clock()
    cache = ScrapeCache(renders, clock=clock, **options)  # type: ignore[arg-type]
    await nursery.start(cache.serve)
    return cache, clock


async def until(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110 - a worker thread's progress, no event
            await trio.sleep(0.01)


async def test_a_body_is_shared_in_its_window_and_rendered_again_after(
    nursery: trio.Nursery,
) -> None:
    renders = Renders()
    cache, clock = await started(nursery, renders, window=5.0)
    first, answer = await cache.body("", False)
    assert answer == "rendered"
    clock.now += 4.9
    again, answer = await cache.body("", False)
    assert (again, answer) == (first, "shared")
    clock.now += 0.1  # the window runs from the render's start
    later, answer = await cache.body("", False)
    assert answer == "rendered"
    assert later != first
    assert len(renders.calls) == 2


async def test_a_new_generation_is_never_served_the_old_body(nursery: trio.Nursery) -> None:
    renders = Renders()
    ticks = [0]
    cache, _ = await started(nursery, renders, window=60.0, generation=lambda: ticks[0])
    first, _ = await cache.body("", False)
    ticks[0] += 1
    second, answer = await cache.body("", False)
    assert answer == "rendered"
    assert second != first
    assert (await cache.body("", False))[1] == "shared"


async def test_keys_are_the_format_and_the_encoding(nursery: trio.Nursery) -> None:
    renders = Renders()
    cache, _ = await started(nursery, renders, window=5.0)
    text, _ = await cache.body("", False)
    om, _ = await cache.body(OPENMETRICS, False)
    assert text != om
    # Accept headers that choose the same format share its body.
    assert (await cache.body("text/plain;version=0.0.4", False)) == (text, "shared")
    assert (await cache.body(OPENMETRICS + ";q=0.5", False)) == (om, "shared")
    assert len(renders.calls) == 2


async def test_gzip_is_compressed_once_from_the_plain_body_of_the_window(
    nursery: trio.Nursery,
) -> None:
    renders = Renders()
    cache, _ = await started(nursery, renders, window=5.0)
    compressed, answer = await cache.body("", True)
    assert answer == "rendered"
    assert compressed.gzip
    plain, answer = await cache.body("", False)
    assert answer == "shared"  # the gzip render rendered it
    assert gzip.decompress(b"".join(compressed.pieces)) == b"".join(plain.pieces)
    assert compressed.content_type == plain.content_type
    assert (await cache.body("", True)) == (compressed, "shared")
    assert (len(renders.calls), cache.renders, cache.compressions) == (1, 1, 1)


async def test_scrapes_during_a_render_share_it_even_without_a_window(
    nursery: trio.Nursery,
) -> None:
    renders = Renders()
    renders.gate.clear()
    cache, _ = await started(nursery, renders)  # window 0
    got: list[tuple[Body, str]] = []

    async def scrape() -> None:
        got.append(await cache.body("", False))

    async with trio.open_nursery() as scrapes:
        for _ in range(5):
            scrapes.start_soon(scrape)
        await until(lambda: len(renders.calls) == 1)
        await trio.sleep(0.05)
        renders.gate.set()
    assert len(renders.calls) == 1
    assert sorted(answer for _, answer in got) == ["rendered", *["shared"] * 4]
    assert len({id(body) for body, _ in got}) == 1
    assert (await cache.body("", False))[1] == "rendered"  # done: window 0 keeps nothing


async def test_a_waiter_that_goes_away_does_not_stop_the_render(nursery: trio.Nursery) -> None:
    """The server closes waiting connections at its caps: nothing about a render depends on
    the scrape that started it."""
    renders = Renders()
    renders.gate.clear()
    cache, _ = await started(nursery, renders, window=5.0)
    with trio.move_on_after(0.2) as gone:
        await cache.body("", False)
    assert gone.cancelled_caught
    renders.gate.set()
    body, answer = await cache.body("", False)
    assert answer == "shared"
    assert body.length > 0
    assert len(renders.calls) == 1


async def test_uncached_renders_are_refused_at_once_when_the_queue_is_full(
    nursery: trio.Nursery,
) -> None:
    renders = Renders()
    cache, _ = await started(nursery, renders, window=3.0, max_concurrent=1, max_pending=2)
    text, _ = await cache.body("", False)
    renders.gate.clear()
    async with trio.open_nursery() as waiting:
        for name in ("a", "b"):
            waiting.start_soon(cache.body, "", False, [name])
        await until(lambda: len(renders.calls) == 2)  # one renders, one waits for the slot
        with pytest.raises(RenderQueueFull) as full:
            await cache.body("", False, ["c"])
        assert full.value.retry_after == 3
        # An odd format is not kept either: it needs the queue too.
        with pytest.raises(RenderQueueFull):
            await cache.body("application/openmetrics-text;version=9.9.9", False)
        # The kept body is still served: the queue holds up only what it would render.
        assert await cache.body("", False) == (text, "shared")
        renders.gate.set()
    _, answer = await cache.body("", False, ["c"])
    assert answer == "rendered"
    assert renders.calls[-1] == ("", ["c"])


async def test_a_failed_render_fails_its_waiters_and_is_not_kept(nursery: trio.Nursery) -> None:
    renders = Renders()
    renders.fail = True
    cache, _ = await started(nursery, renders, window=5.0)
    with pytest.raises(RenderFailedError) as failed:
        await cache.body("", True)
    assert isinstance(failed.value.__cause__, RenderFailedError)  # the plain one it needed
    assert isinstance(failed.value.__cause__.__cause__, RuntimeError)
    renders.fail = False
    _, answer = await cache.body("", True)
    assert answer == "rendered"


async def test_body_needs_serve() -> None:
    cache = ScrapeCache(Renders())
    with pytest.raises(RuntimeError, match="serve"):
        await cache.body("", False)
    with pytest.raises(ValueError, match="window"):
        ScrapeCache(Renders(), window=-1)


def test_coalesce_and_gzip_keep_the_bytes() -> None:
    pieces = [bytes([i % 256]) * (i * 37 % 9000) for i in range(200)]
    runs = list(coalesce(pieces, size=65536))
    assert b"".join(runs) == b"".join(pieces)
    assert all(len(run) < 65536 + 9000 for run in runs)
    assert gzip.decompress(gzip_compress(pieces)) == b"".join(pieces)
    assert gzip.decompress(gzip_compress([])) == b""
