"""One usage read: every loaded container's memory, utilisation and processes, on demand.

How this works: the tick reads only what the feedback needs and publishes a
:class:`TickView` - its containers, their handles and the blocking counters.  Whoever shows
usage (a ``/metrics`` render, the debug document, ``hami-trio status``) asks
:meth:`UsageReader.read` in a worker thread: it pins every handle of that view
(:meth:`~hami_trio.monitor.region.RegionHandle.pin`, so no read goes through a descriptor
number the kernel gave to another file), reads each tail and live slots
(:meth:`~hami_trio.monitor.region.RegionHandle.read_usage`, the tick's loader rule and
rejection reasons) and builds the insights (:class:`~hami_trio.monitor.explain.Explainer`).

The result is one immutable :class:`UsageView` with the Unix time it was read at; the
:class:`~hami_trio.monitor.loop.Monitor` keeps the latest and reads again only when it is
older than the freshness window or a tick came since.  docs/monitor.md (One usage read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

from hami_trio.errors import CacheFileRejected
from hami_trio.logs import RateLimiter
from hami_trio.monitor.explain import Explainer
from hami_trio.monitor.insight import BlockState, ContainerInsight
from hami_trio.monitor.layout import RejectReason
from hami_trio.monitor.region import RegionHandle
from hami_trio.monitor.snapshot import UsageSnapshot
from hami_trio.monitor.state import (
    ContainerKey,
    ContainerStatus,
    Rejection,
    TickState,
    UsageState,
    new_container_state,
)

__all__ = [
    "EMPTY_TICK",
    "EMPTY_USAGE",
    "YIELD_EVERY",
    "TickView",
    "UsageReader",
    "UsageView",
]

logger = logging.getLogger(__name__)

#: Containers read between two offers of the interpreter lock to other threads (the event
#: loop's above all): the read is Python, and a thread that waits for the lock otherwise
#: gets it only every switch interval (5 ms), after each of its system calls.
YIELD_EVERY = 64


@dataclass(frozen=True, slots=True)
class TickView:
    """What one tick leaves for the usage read (immutable once published).

    Attributes:
        generation: the tick's number (1 for the first).
        states: every container directory of the tick.
        handles: the handle each loaded container was read through.
        blocks: the blocking counters of the containers blocked at least once.
    """

    generation: int
    states: Mapping[ContainerKey, TickState]
    handles: Mapping[ContainerKey, RegionHandle]
    blocks: Mapping[ContainerKey, BlockState]


EMPTY_TICK = TickView(0, MappingProxyType({}), MappingProxyType({}), MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class UsageView:
    """Every container of one tick as of one usage read (immutable; shared by threads).

    Attributes:
        generation: the tick the read followed (0: no tick yet).
        read_at: Unix time the read started; None when there has been none.
        monotonic: ``time.monotonic()`` then (how old the view is); None likewise.
        duration: seconds the read took.
        containers: the tick's container directories; a loaded one carries its
            :class:`~hami_trio.monitor.snapshot.UsageSnapshot` (or the rejection the read
            met), the others their tick state.
        insights: per loaded container: processes by state, the control words as read,
            the tick's blocking counters, sums without exited processes.
    """

    generation: int
    read_at: float | None
    monotonic: float | None
    duration: float
    containers: Mapping[ContainerKey, UsageState]
    insights: Mapping[ContainerKey, ContainerInsight]


EMPTY_USAGE = UsageView(0, None, None, 0.0, MappingProxyType({}), MappingProxyType({}))


class UsageReader:
    """Reads a tick's containers' usage (see the module docstring); one read at a time.

    Args:
        explainer: builds the insights.
        on_reject: called with the reason token when a container the tick loaded starts
            being rejected by the usage read (the rejection counter).
        wall_clock: Unix time (``read_at``).
        log_interval: seconds between two log lines about the same container.
    """

    def __init__(
        self,
        explainer: Explainer,
        *,
        on_reject: Callable[[str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
        log_interval: float = 60.0,
    ) -> None:
        self.explainer = explainer
        self._on_reject = on_reject
        self._wall_clock = wall_clock
        self._limiter = RateLimiter(log_interval, max_keys=4096)
        self._last: dict[ContainerKey, UsageState] = {}
        self._reasons: dict[ContainerKey, RejectReason] = {}

    def read(self, tick: TickView) -> UsageView:
        """Read every loaded container of ``tick`` (blocking: call it in a worker thread)."""
        started, read_at = time.monotonic(), self._wall_clock()
        pinned = [handle for handle in tick.handles.values() if handle.pin()]
        try:
            containers, snapshots = self._read_all(tick)
            insights = self.explainer.update(snapshots, tick.blocks, tick.handles)
        finally:
            for handle in pinned:
                handle.unpin()
        return UsageView(
            tick.generation,
            read_at,
            started,
            time.monotonic() - started,
            MappingProxyType(containers),
            insights,
        )

    def _read_all(
        self, tick: TickView
    ) -> tuple[dict[ContainerKey, UsageState], dict[ContainerKey, UsageSnapshot]]:
        handles, last, reasons = tick.handles, self._last, self._reasons
        containers: dict[ContainerKey, UsageState] = {}
        snapshots: dict[ContainerKey, UsageSnapshot] = {}
        pause = time.sleep
        for count, (key, state) in enumerate(tick.states.items(), 1):
            if not count % YIELD_EVERY:
                pause(0)  # lets a waiting thread (the event loop) take the lock now
            if state.snapshot is None:
                # Nothing to read (no file, or the tick refused it): the tick's word stands.
                containers[key] = cast(UsageState, state)
                continue
            handle = handles.get(key)
            try:
                if handle is None or handle.closed:
                    raise CacheFileRejected(
                        RejectReason.REPLACED,
                        f"{state.directory}: its .cache file was closed by a newer tick "
                        "(replaced or gone) before this usage read reached it",
                    )
                snapshot = handle.read_usage()
            except CacheFileRejected as exc:
                containers[key] = self._rejected(state, exc)
                continue
            if reasons:
                reasons.pop(key, None)
            snapshots[key] = snapshot
            kept = last.get(key)
            if (
                kept is not None
                and kept.snapshot is snapshot
                and kept.cache_file == state.cache_file
                and kept.directory == state.directory
            ):
                containers[key] = kept
            else:  # positional, in field order
                containers[key] = new_container_state(
                    key, state.directory, state.cache_file, ContainerStatus.LOADED, snapshot, None
                )
        self._last = containers
        if len(reasons) > len(containers):
            for key in [k for k in reasons if k not in containers]:
                del reasons[key]
        return containers, snapshots

    def _rejected(self, state: TickState, exc: CacheFileRejected) -> UsageState:
        reason = RejectReason(exc.reason)
        key = state.key
        if self._reasons.get(key) is not reason:
            self._reasons[key] = reason
            if self._on_reject is not None:
                self._on_reject(reason.value)
            self._limiter.log(
                logger,
                logging.WARNING,
                ("reject", key.dirname),
                "container %s (pod %s): usage not read: %s",
                key.dirname,
                key.pod_uid,
                exc,
            )
        rejected: UsageState = new_container_state(
            key,
            state.directory,
            state.cache_file,
            ContainerStatus.REJECTED,
            None,
            Rejection(reason, str(exc)),
        )
        return rejected
