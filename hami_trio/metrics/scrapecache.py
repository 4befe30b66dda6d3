"""One rendered ``/metrics`` body per freshness window, shared by every scrape in it.

How this works: a scrape asks :class:`ScrapeCache` for the body in the format its ``Accept``
header chooses, plain or gzip.  A body is reused while it is fresh (rendered less than
``window`` seconds ago, in the same ``generation``: the monitor's tick), and a render in
flight is joined by every scrape of the same key.  Renders run in the cache's own nursery
(:meth:`ScrapeCache.serve`), never in a scrape's task, so the server may close any waiting
connection and the render still completes for the others; a gzip body is compressed once
from the plain body of the same window.  Only :data:`CACHEABLE_CONTENT_TYPES` are kept;
anything else (``name[]``, an odd ``Accept``) is rendered for its request alone through a
bounded queue, and past ``max_pending`` refused at once with :class:`RenderQueueFull`
(``503`` with ``Retry-After``).  So a flood of scrapes costs at most one render per cached
key and window, plus the bounded queue.  docs/metrics.md.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final, Literal

import trio
from prometheus_client.exposition import choose_encoder

from hami_trio.http.server import PART as SERVER_PART

__all__ = [
    "CACHEABLE_CONTENT_TYPES",
    "Body",
    "RenderFailedError",
    "RenderQueueFull",
    "ScrapeCache",
    "coalesce",
    "gzip_compress",
]

#: Renders the registry for an ``Accept`` header and ``name[]`` values (in a worker thread):
#: the pieces that join to the body, and its content type.
Render = Callable[[str, list[str]], tuple[list[bytes], str]]
#: How a body came to a scrape: rendered for it, or shared (kept or in flight).
Answer = Literal["rendered", "shared"]

#: Bytes of body compressed in one call: the server's part (sent in one by the endpoint).
PART: Final = SERVER_PART

# What Prometheus (2.x and 3.x) and prometheus-client's own clients ask for.
_CACHED_ACCEPTS: Final = (
    "",
    "application/openmetrics-text",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
)
#: The content types whose bodies are kept for a window (a fixed set, so the kept bodies and
#: the renders per window are bounded whatever ``Accept`` headers arrive).
CACHEABLE_CONTENT_TYPES: Final = frozenset(choose_encoder(a)[1] for a in _CACHED_ACCEPTS)


def coalesce(pieces: Iterable[bytes], size: int = PART) -> Iterator[bytes]:
    """``pieces`` joined into runs of about ``size`` bytes (one piece longer than that on its
    own): what is sent or compressed at once, so no more than about one run is copied."""
    run: list[bytes] = []
    length = 0
    for piece in pieces:
        run.append(piece)
        length += len(piece)
        if length >= size:
            yield b"".join(run)
            run, length = [], 0
    if run:
        yield b"".join(run)


def gzip_compress(pieces: Iterable[bytes]) -> bytes:
    """The gzip container of the joined ``pieces``, compressed run by run (never joined
    whole); fast (level 1): scrapes are frequent and local."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [compressor.compress(run) for run in coalesce(pieces)]
    out.append(compressor.flush())
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class Body:
    """One rendered answer.

    Attributes:
        pieces: what joins to the body (a gzip body is one piece).
        content_type: its ``content-type``.
        gzip: whether it is gzip-encoded.
    """

    pieces: tuple[bytes, ...]
    content_type: str
    gzip: bool = False
    length: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", sum(map(len, self.pieces)))


class RenderQueueFull(Exception):
    """Raised by :meth:`ScrapeCache.body` when a render would have to wait in a full queue.

    The caller answers ``503`` with ``Retry-After: retry_after`` (seconds); nothing waits.
    """

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"render queue full; retry after {retry_after} s")
        self.retry_after = retry_after


class RenderFailedError(Exception):
    """Raised by :meth:`ScrapeCache.body` when the shared render it waited for raised; the
    render's exception is the ``__cause__``.  Costs that window's scrapes of the key, not the
    next: a failed render is never kept."""


_Key = tuple[str, bool]  # content type, gzip


@dataclass(eq=False, slots=True)
class _Job:
    """One render of a key: in flight until ``done``; its body or its error."""

    started: float
    generation: Hashable
    done: trio.Event = field(default_factory=trio.Event)
    body: Body | None = None
    error: Exception | None = None


class ScrapeCache:
    """Bodies of ``/metrics`` by format and encoding, one per freshness window.

    This class is the one place that decides what a body is keyed by (:meth:`_key`) and when
    a kept body is rendered again (:meth:`_fresh`); a scrape that should also refresh what
    the registry reads (an on-demand usage read, once per window) belongs in the render this
    cache runs, so that it too happens once per window and key, whatever the number of
    scrapes.

    Args:
        render: renders the registry (runs in a worker thread): ``(accept, names)`` ->
            ``(pieces, content type)``.
        window: seconds a body is reused after its render started; 0: a body is only
            shared by the scrapes that arrive while it is rendered.
        generation: a value that changes when what the registry reads changes (the monitor's
            tick count); a body of another generation is never reused.  None: time only.
        max_concurrent: renders running at once in worker threads.
        max_pending: renders of uncached requests (``name[]``, other formats) waiting or
            running at once; one more is refused (:class:`RenderQueueFull`).
        clock: the monotonic clock (``trio.current_time``).
    """

    def __init__(
        self,
        render: Render,
        *,
        window: float = 0.0,
        generation: Callable[[], Hashable] | None = None,
        max_concurrent: int = 2,
        max_pending: int = 4,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if not window >= 0:
            raise ValueError(f"window must be >= 0 seconds, got {window!r}")
        self._render = render
        self._window = float(window)
        self._generation = generation or (lambda: None)
        self._limiter = trio.CapacityLimiter(max_concurrent)
        self._max_pending = max_pending
        self._clock = clock
        self._jobs: dict[_Key, _Job] = {}
        self._pending = 0
        self._nursery: trio.Nursery | None = None
        #: Renders started (each collects the registry once), compressions started.
        self.renders = 0
        self.compressions = 0

    @property
    def max_pending(self) -> int:
        """Uncached renders that may be pending at once."""
        return self._max_pending

    @property
    def retry_after(self) -> int:
        """Seconds a refused scrape is told to wait (``Retry-After``): the window, at least 1."""
        return max(1, math.ceil(self._window))

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the shared renders until cancelled (:meth:`body` needs this running)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def _key(self, accept: str, gzip: bool, names: Sequence[str]) -> _Key | None:
        """The cache key of a request, or None when its body is not kept."""
        if names:
            return None
        content_type = choose_encoder(accept)[1]
        if content_type not in CACHEABLE_CONTENT_TYPES:
            return None
        return content_type, gzip

    def _fresh(self, job: _Job, generation: Hashable, now: float) -> bool:
        """Whether ``job``'s body (or its render in flight) serves a scrape now."""
        if job.generation != generation:
            return False
        if not job.done.is_set():
            return True
        return job.error is None and now - job.started < self._window

    async def body(self, accept: str, gzip: bool, names: Sequence[str] = ()) -> tuple[Body, Answer]:
        """The body for a request's ``Accept``, encoding and ``name[]``; how it came.

        Raises:
            RenderQueueFull: an uncached request found ``max_pending`` renders pending.
            RenderFailedError: the shared render it waited for raised.
            Exception: an uncached render raised (its own exception).
        """
        key = self._key(accept, gzip, names)
        if key is None:
            return await self._uncached(accept, gzip, list(names)), "rendered"
        body, started = await self._shared(key, accept)
        return body, "rendered" if started else "shared"

    async def _shared(self, key: _Key, accept: str) -> tuple[Body, bool]:
        generation = self._generation()
        now = self._clock()
        job = self._jobs.get(key)
        started = job is None or not self._fresh(job, generation, now)
        if started:
            if self._nursery is None:
                raise RuntimeError("ScrapeCache.serve is not running")
            job = _Job(now, generation)
            self._forget_stale(generation, now)
            self._jobs[key] = job
            self._nursery.start_soon(self._run, job, key, accept)
        assert job is not None
        await job.done.wait()
        if job.error is not None:
            raise RenderFailedError(f"rendering /metrics as {key[0]} failed") from job.error
        assert job.body is not None
        return job.body, started

    def _forget_stale(self, generation: Hashable, now: float) -> None:
        for key, job in list(self._jobs.items()):
            if not self._fresh(job, generation, now):
                del self._jobs[key]

    async def _run(self, job: _Job, key: _Key, accept: str) -> None:
        try:
            content_type, gzip = key
            if gzip:
                plain, _ = await self._shared((content_type, False), accept)
                self.compressions += 1
                data = await trio.to_thread.run_sync(
                    gzip_compress, plain.pieces, limiter=self._limiter
                )
                job.body = Body((data,), plain.content_type, gzip=True)
            else:
                self.renders += 1
                pieces, rendered_type = await trio.to_thread.run_sync(
                    self._render, accept, [], limiter=self._limiter
                )
                job.body = Body(tuple(pieces), rendered_type)
        except Exception as exc:  # every waiter raises it; the next scrape renders again
            job.error = exc
        finally:
            job.done.set()

    async def _uncached(self, accept: str, gzip: bool, names: list[str]) -> Body:
        if self._pending >= self._max_pending:
            raise RenderQueueFull(self.retry_after)
        self._pending += 1
        try:
            self.renders += 1
            return await trio.to_thread.run_sync(
                partial(_render_alone, self._render, accept, gzip, names), limiter=self._limiter
            )
        finally:
            self._pending -= 1


def _render_alone(render: Render, accept: str, gzip: bool, names: list[str]) -> Body:
    """An uncached request's body (in a worker thread): rendered and, if asked, compressed."""
    pieces, content_type = render(accept, names)
    if gzip:
        return Body((gzip_compress(pieces),), content_type, gzip=True)
    return Body(tuple(pieces), content_type)
