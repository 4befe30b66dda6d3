"""The monitor's per-tick :class:`~hami_trio.monitor.insight.ContainerInsight` of every container.

How this works: after each tick's writes, :meth:`Explainer.update` decides once which host
PIDs of the node are dead (the pure :class:`~hami_trio.monitor.insight.ProcessClassifier`
with :func:`~hami_trio.monitor.liveness.pid_alive` and
:func:`~hami_trio.monitor.liveness.live_pids`, only when the agent is in the host PID
namespace), classifies every loaded container's live slots, advances the blocking counters,
and - only with ``--exclude-exited-processes`` and only for a container with exited slots -
re-reads its slots once per changed snapshot to sum them without the exited ones
(:func:`~hami_trio.monitor.region.read_totals_without`).  The result is one immutable
mapping per tick; a container whose snapshot, processes, control words and counters did not
change keeps the same insight object.  docs/monitor.md (Processes and feedback state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType

import trio

from hami_trio.errors import CacheFileRejected
from hami_trio.logs import RateLimiter
from hami_trio.monitor.feedback import Write
from hami_trio.monitor.insight import (
    BlockTracker,
    ContainerInsight,
    ProcessClassifier,
    ProcessCounts,
)
from hami_trio.monitor.layout import ControlField
from hami_trio.monitor.lister import WORK_PER_CHECKPOINT, ContainerKey
from hami_trio.monitor.region import RegionHandle, read_totals_without
from hami_trio.monitor.snapshot import DeviceUsage, UsageSnapshot

__all__ = ["Explainer"]

logger = logging.getLogger("hami_trio.monitor.loop")

_RECENT_KERNEL = ControlField.RECENT_KERNEL

_new_tuple = tuple.__new__

#: Containers classified between two checkpoints (a few milliseconds of work at most).
EXPLAIN_BATCH = 256


class Explainer:
    """Builds the per-tick insights (see the module docstring).

    Args:
        alive: the liveness check, None outside the host PID namespace (nothing is exited).
        live_pids: every live PID at once, for ticks with many distinct host PIDs.
        exclude_exited: sum memory and utilisation without the exited slots.
        handle_of: the lister's open handle of a container directory (for the re-read).
    """

    def __init__(
        self,
        alive: Callable[[int], bool] | None,
        live_pids: Callable[[], AbstractSet[int]] | None = None,
        *,
        exclude_exited: bool = False,
        handle_of: Callable[[str], RegionHandle | None] = lambda _name: None,
    ) -> None:
        self.classifier = ProcessClassifier(alive, live_pids)
        self._blocks: BlockTracker[ContainerKey] = BlockTracker()
        self._exclude = exclude_exited
        self._handle_of = handle_of
        # key -> (snapshot, exited host PIDs, devices without them) of the last re-read
        self._without: dict[
            ContainerKey, tuple[UsageSnapshot, frozenset[int], tuple[DeviceUsage, ...] | None]
        ] = {}
        self._last: dict[ContainerKey, ContainerInsight] = {}
        self._last_dead: frozenset[int] = frozenset()
        self._view: Mapping[ContainerKey, ContainerInsight] = MappingProxyType(self._last)
        self._limiter = RateLimiter(600.0, max_keys=4096)
        self._reread = 0  # bytes re-read since the last checkpoint

    def insights(self) -> Mapping[ContainerKey, ContainerInsight]:
        """The latest tick's insights (immutable)."""
        return self._view

    async def update(
        self,
        now: float,
        snapshots: Mapping[ContainerKey, UsageSnapshot],
        written: Iterable[Write[ContainerKey]] = (),
    ) -> Mapping[ContainerKey, ContainerInsight]:
        """One tick: ``snapshots`` as read, ``written`` the writes this tick applied.

        Checkpoints every :data:`EXPLAIN_BATCH` containers and after re-reads
        (``--exclude-exited-processes``) worth
        :data:`~hami_trio.monitor.lister.WORK_PER_CHECKPOINT` bytes, like the lister's read;
        the new insights are published at the end, so a cancelled update publishes nothing.

        Args:
            now: monotonic seconds (the tick's clock).
            snapshots: every loaded container of this tick.
            written: the feedback writes that were stored this tick (none while the MIG lock
                holds the writes back).
        """
        # (recent_kernel, utilization_switch) written this tick, None where not written
        controls: dict[ContainerKey, list[int | None]] = {}
        for write in written:
            words = controls.get(write.key)
            if words is None:
                words = controls[write.key] = [None, None]
            words[0 if write.field is _RECENT_KERNEL else 1] = write.value
        classifier, blocks, previous = self.classifier, self._blocks, self._last
        # The slots' host PIDs as last tick (a churning region rewrites its counters, rarely
        # its PIDs): the set of PIDs to check is reused.
        unchanged = len(previous) == len(snapshots) and all(
            (last := previous.get(key)) is not None
            and (last.snapshot is snapshot or last.snapshot.host_pids == snapshot.host_pids)
            for key, snapshot in snapshots.items()
        )
        classifier.begin_tick(
            [snapshot.host_pids for snapshot in snapshots.values()], unchanged=unchanged
        )
        # the dead PIDs the published insights were counted with (not an abandoned tick's)
        same_dead = classifier.dead is self._last_dead
        blocks.begin(now)
        view: dict[ContainerKey, ContainerInsight] = {}
        batch = 0
        for key, snapshot in snapshots.items():
            batch += 1
            if batch >= EXPLAIN_BATCH:
                batch = 0
                await trio.lowlevel.checkpoint()
            recent, switch = snapshot.recent_kernel, snapshot.utilization_switch
            wrote = controls.get(key) if controls else None
            if wrote is not None:
                if wrote[0] is not None:
                    recent = wrote[0]
                if wrote[1] is not None:
                    switch = wrote[1]
            block = blocks.step(key, recent < 0)
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
                devices = self._devices_without(key, snapshot, processes)
                if self._reread >= WORK_PER_CHECKPOINT:
                    self._reread = batch = 0
                    await trio.lowlevel.checkpoint()
            if (
                last is not None
                and last.snapshot is snapshot
                and last.processes is processes
                and last.block is block
                and last.recent_kernel == recent
                and last.utilization_switch == switch
                and last.devices is devices
            ):
                view[key] = last
            else:  # the named tuple's own __new__ is a Python function: skip it
                view[key] = _new_tuple(
                    ContainerInsight, (snapshot, processes, switch, recent, block, devices)
                )
        blocks.finish()
        if self._without:
            for key in [k for k in self._without if k not in snapshots]:
                del self._without[key]
        self._last, self._last_dead = view, classifier.dead
        self._view = MappingProxyType(view)
        return self._view

    def _devices_without(
        self, key: ContainerKey, snapshot: UsageSnapshot, processes: ProcessCounts
    ) -> tuple[DeviceUsage, ...] | None:
        if not processes.exited:
            self._without.pop(key, None)
            return None
        exited = processes.exited_host_pids
        cached = self._without.get(key)
        if cached is not None and cached[0] is snapshot and cached[1] == exited:
            return cached[2]
        handle = self._handle_of(key.dirname)
        devices: tuple[DeviceUsage, ...] | None = None
        if handle is not None:
            try:
                handle.read_bytes = 0
                devices = read_totals_without(handle, snapshot, exited).devices
                self._reread += handle.read_bytes
            except CacheFileRejected as exc:
                self._limiter.log(
                    logger,
                    logging.WARNING,
                    ("exclude-exited", key.dirname),
                    "container %s: exited processes left in its sums this tick: %s",
                    key.dirname,
                    exc,
                )
        self._without[key] = (snapshot, exited, devices)
        return devices
