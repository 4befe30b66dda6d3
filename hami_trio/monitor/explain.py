"""Each usage read's :class:`~hami_trio.monitor.insight.ContainerInsight` of every container.

How this works: during a usage read (:mod:`~hami_trio.monitor.usage`, in a worker thread),
:meth:`Explainer.update` decides once which host PIDs of the node are dead (the pure
:class:`~hami_trio.monitor.insight.ProcessClassifier` with
:func:`~hami_trio.monitor.liveness.pid_alive` and
:func:`~hami_trio.monitor.liveness.live_pids`, only in the host PID namespace), classifies
every loaded container's live slots, attaches the blocking counters the latest tick left
(:class:`~hami_trio.monitor.insight.BlockTracker`), and - only with
``--exclude-exited-processes`` and only for a container with exited slots - re-reads its
slots once per changed snapshot to sum them without the exited ones
(:meth:`~hami_trio.monitor.region.RegionHandle.totals_without`).  The result is one
immutable mapping per read; a container whose snapshot, processes and counters did not
change keeps the same insight object.  docs/monitor.md (Processes and feedback state).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType

from hami_trio.errors import CacheFileRejected
from hami_trio.logs import RateLimiter
from hami_trio.monitor.insight import (
    NEVER_BLOCKED,
    BlockState,
    ContainerInsight,
    ProcessClassifier,
    ProcessCounts,
)
from hami_trio.monitor.region import RegionHandle
from hami_trio.monitor.snapshot import DeviceUsage, UsageSnapshot
from hami_trio.monitor.state import ContainerKey

__all__ = ["YIELD_EVERY", "Explainer"]

#: Containers explained between two offers of the interpreter lock to other threads.
YIELD_EVERY = 64

logger = logging.getLogger(__name__)

_new_tuple = tuple.__new__


class Explainer:
    """Builds each usage read's insights (see the module docstring).  One caller at a time.

    Args:
        alive: the liveness check, None outside the host PID namespace (nothing is exited).
        live_pids: every live PID at once, for reads with many distinct host PIDs.
        exclude_exited: sum memory and utilisation without the exited slots.
    """

    def __init__(
        self,
        alive: Callable[[int], bool] | None,
        live_pids: Callable[[], AbstractSet[int]] | None = None,
        *,
        exclude_exited: bool = False,
    ) -> None:
        self.classifier = ProcessClassifier(alive, live_pids)
        self._exclude = exclude_exited
        # key -> (snapshot, exited host PIDs, devices without them) of the last re-read
        self._without: dict[
            ContainerKey, tuple[UsageSnapshot, frozenset[int], tuple[DeviceUsage, ...] | None]
        ] = {}
        self._last: dict[ContainerKey, ContainerInsight] = {}
        self._last_dead: frozenset[int] = frozenset()
        self._view: Mapping[ContainerKey, ContainerInsight] = MappingProxyType(self._last)
        self._limiter = RateLimiter(600.0, max_keys=4096)

    def insights(self) -> Mapping[ContainerKey, ContainerInsight]:
        """The latest read's insights (immutable)."""
        return self._view

    def update(
        self,
        snapshots: Mapping[ContainerKey, UsageSnapshot],
        blocks: Mapping[ContainerKey, BlockState],
        handles: Mapping[ContainerKey, RegionHandle],
    ) -> Mapping[ContainerKey, ContainerInsight]:
        """One usage read: ``snapshots`` as read, ``blocks`` the latest tick's counters.

        Args:
            snapshots: every container the read loaded.
            blocks: the blocking counters of the containers blocked at least once
                (:meth:`~hami_trio.monitor.insight.BlockTracker.states`); others were never.
            handles: the pinned handles the snapshots were read through (for the re-read of
                ``--exclude-exited-processes``).
        """
        classifier, previous = self.classifier, self._last
        # The slots' host PIDs as last read (a churning region rewrites its counters, rarely
        # its PIDs): the set of PIDs to check is reused.
        unchanged = len(previous) == len(snapshots) and all(
            (last := previous.get(key)) is not None
            and (last.snapshot is snapshot or last.snapshot.host_pids == snapshot.host_pids)
            for key, snapshot in snapshots.items()
        )
        classifier.begin_tick(
            [snapshot.host_pids for snapshot in snapshots.values()], unchanged=unchanged
        )
        # the dead PIDs the published insights were counted with
        same_dead = classifier.dead is self._last_dead
        view: dict[ContainerKey, ContainerInsight] = {}
        pause = time.sleep
        for count, (key, snapshot) in enumerate(snapshots.items(), 1):
            if not count % YIELD_EVERY:
                pause(0)  # offer the interpreter lock to the event loop (see usage.py)
            recent, switch = snapshot.recent_kernel, snapshot.utilization_switch
            block = blocks.get(key, NEVER_BLOCKED)
            last = previous.get(key)
            if (
                same_dead
                and last is not None
                and (last.snapshot is snapshot or last.snapshot.host_pids == snapshot.host_pids)
            ):
                processes = last.processes  # same host PIDs, same dead PIDs: same counts
            else:
                processes = classifier.classify(snapshot.host_pids)
            devices = None
            if self._exclude:
                devices = self._devices_without(key, snapshot, processes, handles.get(key))
            if (
                last is not None
                and last.snapshot is snapshot
                and last.processes is processes
                and last.block is block
                and last.devices is devices
            ):
                view[key] = last
            else:  # the named tuple's own __new__ is a Python function: skip it
                view[key] = _new_tuple(
                    ContainerInsight, (snapshot, processes, switch, recent, block, devices)
                )
        if self._without:
            for key in [k for k in self._without if k not in snapshots]:
                del self._without[key]
        self._last, self._last_dead = view, classifier.dead
        self._view = MappingProxyType(view)
        return self._view

    def _devices_without(
        self,
        key: ContainerKey,
        snapshot: UsageSnapshot,
        processes: ProcessCounts,
        handle: RegionHandle | None,
    ) -> tuple[DeviceUsage, ...] | None:
        if not processes.exited:
            self._without.pop(key, None)
            return None
        exited = processes.exited_host_pids
        cached = self._without.get(key)
        if cached is not None and cached[0] is snapshot and cached[1] == exited:
            return cached[2]
        devices: tuple[DeviceUsage, ...] | None = None
        if handle is not None:
            try:
                devices = handle.totals_without(snapshot, exited).devices
            except CacheFileRejected as exc:
                self._limiter.log(
                    logger,
                    logging.WARNING,
                    ("exclude-exited", key.dirname),
                    "container %s: exited processes left in its sums this read: %s",
                    key.dirname,
                    exc,
                )
        self._without[key] = (snapshot, exited, devices)
        return devices
