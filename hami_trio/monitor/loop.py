"""The monitor's tick loop: refresh, Observe, write back - paused while the MIG lock exists.

How this works: :class:`Monitor` runs a tick every ``interval`` seconds under its own
deadline - ``lister.update()``, the pure :func:`~hami_trio.monitor.feedback.observe`, then
the writes in batches of :data:`WRITE_BATCH` containers, each after a checkpoint and a last
``lstat`` of the MIG lock, with no checkpoint between that check and ``lister.apply(batch)``
(shielded: a deadline never cuts the writes half-way; a lock stops the remaining batches) -
and runs the lister's removals beside it.  While the MIG lock exists (watched with
inotify and checked before every tick and every batch of writes) the loop's cancel scope is
cancelled and no region is touched; a lock directory that root or the agent does not
control is refused and never followed (:mod:`~hami_trio.monitor.miglock` checks and
watches it).  :func:`serve_monitor` reports the :class:`Monitor` once the first tick is
done.  Self-metrics, the MIG pause and the API: docs/monitor.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import trio

from hami_trio._trio import raise_fd_limit
from hami_trio.errors import ConfigError
from hami_trio.logs import RateLimiter
from hami_trio.monitor.explain import Explainer
from hami_trio.monitor.feedback import Write, observe
from hami_trio.monitor.foreign import CLEAR_TICKS, ForeignWriterDetector
from hami_trio.monitor.insight import BlockTracker
from hami_trio.monitor.layout import ControlField
from hami_trio.monitor.lister import ContainerLister
from hami_trio.monitor.liveness import in_host_pid_namespace, live_pids, pid_alive
from hami_trio.monitor.miglock import (
    DEFAULT_MIG_LOCK_PATH,
    LockWatch,
    MigLockProblem,
    probe_mig_lock,
)
from hami_trio.monitor.scope import Claim, FeedbackScope, GrantsOf
from hami_trio.monitor.snapshot import TickSnapshot, UsageSnapshot
from hami_trio.monitor.state import ContainerKey, TickState
from hami_trio.monitor.stats import MonitorCollector, MonitorStats
from hami_trio.monitor.usage import EMPTY_TICK, EMPTY_USAGE, TickView, UsageReader, UsageView
from hami_trio.pods.source import PodSource

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_RESYNC_INTERVAL",
    "WRITE_BATCH",
    "Monitor",
    "MonitorConfig",
    "serve_monitor",
]

logger = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)

DEFAULT_INTERVAL = 5.0
DEFAULT_RESYNC_INTERVAL = 300.0
HOOK_PATH_ENV = "HOOK_PATH"
RESYNC_ENV = "HAMI_RESYNC_INTERVAL"


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """Everything the monitor needs to run (the agent builds it from its own configuration).

    ``tick_deadline`` None means "the interval".  ``exclude_exited_processes`` leaves the
    slots of exited processes out of the exported memory and utilisation sums (never out of
    the feedback).  ``host_pid_namespace`` says whether slots' host PIDs can be checked for
    liveness here; None: detect it (``/proc/self/ns/pid`` is the initial PID namespace).
    """

    hook_path: Path
    interval: float = DEFAULT_INTERVAL
    resync_interval: float = DEFAULT_RESYNC_INTERVAL
    mig_lock_path: Path = field(default=DEFAULT_MIG_LOCK_PATH)
    tick_deadline: float | None = None
    exclude_exited_processes: bool = False
    host_pid_namespace: bool | None = None

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ConfigError(f"MonitorConfig.interval: must be > 0 seconds, got {self.interval}")
        if self.tick_deadline is not None and not self.tick_deadline > 0:
            raise ConfigError(f"tick deadline must be > 0 seconds, got {self.tick_deadline}")
        if self.resync_interval < 0:
            raise ConfigError(f"{RESYNC_ENV}: must not be negative, got {self.resync_interval}")

    @property
    def containers_dir(self) -> Path:
        """``$HOOK_PATH/containers``."""
        return self.hook_path / "containers"


#: Containers whose control words one batch of writes stores (the tick checkpoints and
#: checks the MIG lock before each batch): a few milliseconds of ``fstat`` + ``pwrite``.
WRITE_BATCH = 256


def _batches(writes: Sequence[Write[K]], containers: int) -> list[Sequence[Write[K]]]:
    """``writes`` cut into runs of about ``containers`` containers each, never between two
    writes of one container (Observe emits those next to each other)."""
    batches: list[Sequence[Write[K]]] = []
    start, seen, last = 0, 0, None
    for i, write in enumerate(writes):
        if write.key != last:
            if seen == containers:
                batches.append(writes[start:i])
                start, seen = i, 0
            seen += 1
            last = write.key
    if start < len(writes):
        batches.append(writes[start:])
    return batches


class Monitor:
    """The vGPU monitor: one lister, the feedback loop and the MIG pause.

    Args:
        config: see :class:`MonitorConfig`.
        pod_source: the live pods (Kubernetes watch, or ``StaticPodSource``).
        registry: where the self-metrics' collector is registered
            (:class:`~hami_trio.monitor.stats.MonitorCollector`; None: not exported).
        wall_clock: Unix time for directory ages (tests inject one).
        grants: what each pod gives its containers, for the feedback
            (:mod:`hami_trio.monitor.scope`); None: the files alone count, as upstream.
    """

    def __init__(
        self,
        config: MonitorConfig,
        *,
        pod_source: PodSource,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
        grants: GrantsOf | None = None,
    ) -> None:
        self._config = config
        self._wall_clock = wall_clock
        self._last_tick_time: float | None = None
        stats = self._stats = MonitorStats()
        if registry is not None:
            registry.register(MonitorCollector(stats))
        self._scope = FeedbackScope(pod_source, grants, stats.strays, clock=trio.current_time)
        self._lister = ContainerLister(
            config.containers_dir,
            pod_source,
            resync_interval=config.resync_interval,
            on_reject=stats.count_rejected,
            wall_clock=wall_clock,
            on_removal=stats.count_removal,
            on_watch_fallback=stats.count_watch_fallback,
            on_no_descriptors=lambda: stats.count_no_descriptors("containers"),
        )
        stats.resync_interval = config.resync_interval
        self._watch = LockWatch(config.mig_lock_path, self._lock_changed)
        self._reader = UsageReader(
            _explainer(config),
            on_reject=stats.count_rejected_by_usage,
            wall_clock=wall_clock,
        )
        stats.liveness = 1 if self.checks_liveness else 0
        self._blocks: BlockTracker[ContainerKey] = BlockTracker()
        # What the latest tick leaves for the usage read, and the latest usage read (each
        # replaced whole, never changed: safe to read from any thread).
        self._tick_view: TickView = EMPTY_TICK
        self._usage: UsageView = EMPTY_USAGE
        self._usage_lock = threading.Lock()  # one usage read at a time
        self._paused = False
        self._stop = False
        self._serving = False
        self._ticks = 0
        self._running: trio.CancelScope | None = None
        self._wakeup = trio.Event()
        self._limiter = RateLimiter(60.0, clock=trio.current_time)
        self._limiter_threadsafe = RateLimiter(60.0)  # the usage read's (any thread)
        self._lock_error_logged = False
        self._lock_unchecked: OSError | None = None  # why the latest lock check did not run
        self._paused_unchecked = False  # paused because the check could not run
        self._mig_problem: MigLockProblem | None = None
        self._mig_limiter = RateLimiter(600.0, clock=trio.current_time)
        self._foreign: ForeignWriterDetector[ContainerKey] = ForeignWriterDetector()

    # -- read-only state ------------------------------------------------------------------

    @property
    def config(self) -> MonitorConfig:
        """The configuration this monitor runs with."""
        return self._config

    def containers(self) -> Mapping[ContainerKey, TickState]:
        """The latest completed tick's containers (what the feedback read of each region);
        never touches a file.  Usage is :meth:`usage`'s."""
        return self._lister.containers()

    @property
    def lister(self) -> ContainerLister:
        """The lister this monitor ticks: what it tracks, its handles, its removals."""
        return self._lister

    def usage(self, max_age: float | None = None) -> UsageView:
        """Every container's usage, read no longer than ``max_age`` seconds ago (default:
        the interval) and after the latest tick; blocking: call it in a worker thread
        (:meth:`read_usage` from trio).

        One read at a time: callers that ask together share one read.  While the MIG lock
        exists (or cannot be checked) no region is read: the last view comes back, its
        ``read_at`` saying how old it is.  See :mod:`~hami_trio.monitor.usage`.
        """
        window = self._config.interval if max_age is None else max_age
        with self._usage_lock:
            view, tick = self._usage, self._tick_view
            if (
                view.monotonic is not None
                and view.generation == tick.generation
                and time.monotonic() - view.monotonic < window
            ):
                return view
            if tick.generation == 0 or self._paused or self._reading_locked():
                return view
            classifier = self._reader.explainer.classifier
            checks, listings = classifier.checks, classifier.listings
            try:
                view = self._reader.read(tick)
            except OSError as exc:  # /proc cannot be listed: the last view stays
                self._limiter_threadsafe.log(
                    logger, logging.WARNING, "liveness", "usage not read: %s", exc
                )
                return view
            self._usage = view
            assert view.read_at is not None
            # Written only here, under the usage lock (one read at a time).
            stats = self._stats
            stats.usage_read = view.read_at
            stats.usage_reads += 1
            stats.usage_duration.observe(view.duration)
            if classifier.checks > checks:
                stats.liveness_checks += classifier.checks - checks
            if classifier.listings > listings:
                stats.liveness_listings += classifier.listings - listings
            return view

    async def read_usage(self, max_age: float | None = None) -> UsageView:
        """:meth:`usage` from trio: in a worker thread."""
        return await trio.to_thread.run_sync(self.usage, max_age)

    def latest_usage(self) -> UsageView:
        """The latest usage read as it is (no read)."""
        return self._usage

    def _reading_locked(self) -> bool:
        """The MIG lock exists or cannot be checked (from the usage read's thread)."""
        probe = probe_mig_lock(self._config.mig_lock_path)
        return probe.present or probe.unchecked is not None

    def claim(self, key: ContainerKey, snapshot: TickSnapshot | UsageSnapshot) -> Claim:
        """How the latest tick's feedback counted this container: whose GPUs, whose
        priority, what its file claims beyond its pod's grant (``snapshot``: that tick's)."""
        return self._scope.claim(key, snapshot)

    @property
    def checks_liveness(self) -> bool:
        """Whether exited processes are told from running ones (host PID namespace)."""
        return self._reader.explainer.classifier.checks_liveness

    @property
    def paused(self) -> bool:
        """True while the MIG lock holds the feedback loop."""
        return self._paused

    @property
    def mig_lock_problem(self) -> MigLockProblem | None:
        """Why the MIG lock directory is refused right now (None: it is safe or missing)."""
        return self._mig_problem

    @property
    def foreign_writer(self) -> bool:
        """True while another monitor is judged to be writing feedback into the same
        regions (see :mod:`hami_trio.monitor.foreign`)."""
        return self._foreign.active

    @property
    def ticks(self) -> int:
        """Ticks completed since start."""
        return self._ticks

    @property
    def last_tick_time(self) -> float | None:
        """Unix time at which the latest tick completed (None before the first)."""
        return self._last_tick_time

    # -- control --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop after the current tick (or at once if idle or paused); ``serve`` returns."""
        self._stop = True
        self._wakeup.set()

    def close(self) -> None:
        """Close every file handle.  :meth:`serve` does this on exit; call it yourself only
        after driving :meth:`tick` directly (benchmarks, tests)."""
        self._lister.close()

    def _stopping(self) -> bool:
        # A method, not the attribute: the loop re-reads it after every await.
        return self._stop

    def _lock_changed(self) -> None:
        if self._lock_present() and self._running is not None:
            self._running.cancel()
        self._wakeup.set()

    def _lock_present(self) -> bool:
        """The MIG lock exists in a safe directory (see :func:`probe_mig_lock`).

        Called before every tick and every batch of writes, so a directory that is fixed,
        replaced or made unsafe later is noticed within one interval.
        """
        probe = probe_mig_lock(self._config.mig_lock_path, create=True)
        self._lock_unchecked = probe.unchecked
        if probe.unchecked is not None:
            # A check that cannot run is never "no lock": paused, and the directory's last
            # verdict (safe or refused) stays as it was.
            self._stats.count_no_descriptors("mig_lock")
            self._limiter.log(
                logger,
                logging.WARNING,
                "mig-unchecked",
                "cannot check the MIG lock %s (%s): the monitor holds its writes as if it "
                "existed until the check runs again",
                self._config.mig_lock_path,
                probe.unchecked.strerror or probe.unchecked,
            )
            return True
        self._note_mig_problem(probe.problem)
        return probe.present

    def _note_mig_problem(self, problem: MigLockProblem | None) -> None:
        previous, self._mig_problem = self._mig_problem, problem
        if problem is None:
            if previous is not None:
                self._stats.mig_dir_unsafe = 0
                logger.info(
                    "MIG lock directory %s is safe again: MIG locks in it pause the monitor",
                    self._config.mig_lock_path.parent,
                    extra={"event": "mig_lock_dir_safe"},
                )
            return
        self._stats.mig_dir_unsafe = 1
        if previous is None or previous.reason != problem.reason:
            self._stats.count_mig_refusal(problem.reason)
        muted = self._mig_limiter.check(problem.reason) is None
        if not muted or previous is None or previous.reason != problem.reason:
            logger.warning(
                "%s",
                problem.message,
                extra={"event": "mig_lock_dir_unsafe", "reason": problem.reason},
            )

    # -- one tick --------------------------------------------------------------------------

    async def tick(self) -> int:
        """Refresh every container, run Observe and apply the writes, once.

        :meth:`serve` calls this every interval; call it directly only when not serving.

        Returns:
            The number of control words written.
        """
        started = time.perf_counter()
        view = await self._lister.update()
        stats = self._stats
        stats.watched = self._lister.watched_directories
        stats.unwatched = self._lister.unwatched_directories
        stats.removals_pending = self._lister.removals.pending
        stats.removal_oldest = self._lister.removals.oldest_age()
        snapshots: dict[ContainerKey, TickSnapshot] = {
            key: state.snapshot for key, state in view.items() if state.snapshot is not None
        }
        # With Kubernetes: the grants of the files that claim more than their pods give them.
        writes = observe(snapshots, self._scope.update(snapshots))
        self._check_foreign(snapshots)
        written = 0
        applied: list[Write[ContainerKey]] = []  # the batches written, for the insights
        # Shielded: a deadline or a stop never cuts a tick's writes half-way; a MIG lock is
        # seen by the check before each batch.
        with trio.CancelScope(shield=True):
            for batch in _batches(writes, WRITE_BATCH):
                # Observe (or the batch before) held the loop: let others run, then make sure
                # the MIG lock has not appeared meanwhile; no checkpoint between that check
                # and the batch's writes.
                await trio.lowlevel.checkpoint()
                if self._lock_present():
                    break
                count = self._lister.apply(batch)
                if count:
                    applied.extend(batch)
                written += count
            self._foreign.record(snapshots, applied)
        self._count_blocks(snapshots, applied)
        self._ticks += 1
        self._tick_view = TickView(self._ticks, view, self._lister.handles(), self._blocks.states())
        self._last_tick_time = self._wall_clock()
        stats.last_tick = self._last_tick_time
        stats.tick.observe(time.perf_counter() - started)
        return written

    def _check_foreign(self, snapshots: Mapping[ContainerKey, TickSnapshot]) -> None:
        """Judge the control words against what the previous tick left; log a change of
        verdict once.  Never alters what this tick writes."""
        was = self._foreign.active
        seen = self._foreign.check(snapshots)
        if seen:
            self._stats.foreign_writes += len(seen)
        if self._foreign.active == was:
            return
        self._stats.foreign_writer = 1 if self._foreign.active else 0
        if self._foreign.active:
            first = self._foreign.last_seen[0]
            logger.warning(
                "another monitor is writing feedback into the regions under %s "
                "(%s of container %s held %d, this monitor left %d): two monitors fight over "
                "recent_kernel and utilization_switch. Switch off HAMi's vgpu-monitor "
                "container on this node (docs/migration.md); hami-trio does not fight back",
                self._config.containers_dir,
                first.field.name.lower(),
                first.key.dirname,
                first.found,
                first.left,
                extra={
                    "event": "foreign_writer",
                    "containers_dir": str(self._config.containers_dir),
                },
            )
        else:
            logger.info(
                "no other monitor has changed the control words for %d ticks: this monitor's "
                "feedback is the only one",
                CLEAR_TICKS,
                extra={"event": "foreign_writer_gone"},
            )

    def _count_blocks(
        self, snapshots: Mapping[ContainerKey, TickSnapshot], applied: Sequence[Write[ContainerKey]]
    ) -> None:
        """Advance the blocking counters: blocked after this tick means ``recent_kernel`` < 0
        as written this tick, else as read."""
        blocks = self._blocks
        before = blocks.states()  # the containers blocked at least once, last tick
        blocks.begin(trio.current_time())
        step = blocks.step
        wrote = {w.key: w.value for w in applied if w.field is ControlField.RECENT_KERNEL}
        # Only a container that was ever blocked carries counters; any other one needs a
        # step only when this tick leaves it blocked (stepping the rest changes nothing).
        for key in before:
            snapshot = snapshots.get(key)
            if snapshot is not None:
                step(key, wrote.get(key, snapshot.recent_kernel) < 0)
        for key, value in wrote.items():
            if value < 0 and key not in before:
                step(key, True)
        for key, snapshot in snapshots.items():
            if snapshot.recent_kernel < 0 and key not in before and key not in wrote:
                step(key, True)
        blocks.finish()

    async def _guarded_tick(self) -> None:
        deadline = self._config.tick_deadline or self._config.interval
        with trio.move_on_after(deadline) as scope:
            await self.tick()
        if scope.cancelled_caught:
            self._limiter.log(
                logger,
                logging.WARNING,
                "deadline",
                "monitor tick exceeded its %gs deadline and was abandoned",
                deadline,
            )

    async def _wait_until(self, deadline: float, done: Callable[[], bool]) -> None:
        """Sleep until ``done()`` or ``deadline``; re-checks ``done`` on every wake-up.

        The event is replaced *before* ``done`` is evaluated, so a wake-up that races with
        the check is never lost.
        """
        while True:
            self._wakeup = trio.Event()
            if done() or trio.current_time() >= deadline:
                return
            with trio.move_on_at(deadline):
                await self._wakeup.wait()

    async def _wait_paused(self) -> None:
        """Wait for the lock to go (inotify wake-up, or a re-check every interval)."""
        while not self._stop and self._lock_present():
            await self._wait_until(
                trio.current_time() + self._config.interval,
                lambda: self._stop or not self._lock_present(),
            )
            self._watch.ensure()

    # -- the loop --------------------------------------------------------------------------

    def _set_paused(self, paused: bool) -> None:
        if paused == self._paused:
            return
        self._paused = paused
        self._stats.paused = 1 if paused else 0
        unchecked, self._paused_unchecked = self._paused_unchecked, self._lock_unchecked is not None
        if paused and self._lock_unchecked is not None:
            logger.warning(
                "MIG apply lock %s cannot be checked (%s): monitor paused, shared regions "
                "untouched",
                self._config.mig_lock_path,
                self._lock_unchecked.strerror or self._lock_unchecked,
            )
        elif paused:
            logger.warning(
                "MIG apply lock %s exists: monitor paused, shared regions untouched",
                self._config.mig_lock_path,
            )
        elif unchecked:
            logger.info(
                "MIG apply lock %s can be checked again and does not exist: monitor resumed",
                self._config.mig_lock_path,
            )
        else:
            logger.info("MIG apply lock %s removed: monitor resumed", self._config.mig_lock_path)

    async def serve(
        self, *, task_status: trio.TaskStatus[Monitor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until :meth:`request_stop` (returns) or cancellation; closes every handle.

        Calls ``task_status.started(self)`` after the first tick, or at once when the MIG
        lock holds the loop paused at start-up.

        Raises:
            RuntimeError: the monitor is already serving.
        """
        if self._serving:
            raise RuntimeError("this Monitor is already serving")
        self._serving = True
        raise_fd_limit()  # one descriptor per container
        # Never fatal: an unsafe directory is logged, counted and ignored (see _lock_present).
        try:
            os.makedirs(self._config.mig_lock_path.parent.parent, mode=0o755, exist_ok=True)
        except OSError as exc:
            logger.warning(
                "cannot create MIG lock directory %s: %s", self._config.mig_lock_path.parent, exc
            )
        probe_mig_lock(self._config.mig_lock_path, create=True)
        self._watch.ensure()
        started = False

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started(self)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch.run)
                nursery.start_soon(self._lister.removals.serve)
                next_tick = trio.current_time()
                while not self._stopping():
                    if self._lock_present():
                        self._set_paused(True)
                        mark_started()
                        await self._wait_paused()
                        if self._stopping():
                            break
                        self._set_paused(False)
                        next_tick = trio.current_time()
                        continue
                    with trio.CancelScope() as running:
                        self._running = running
                        while True:
                            await self._wait_until(next_tick, self._stopping)
                            if self._stopping() or self._lock_present():
                                break
                            self._watch.ensure()
                            await self._guarded_tick()
                            mark_started()
                            next_tick += self._config.interval
                            now = trio.current_time()
                            if next_tick <= now:  # overran: skip the missed ticks
                                next_tick = now + self._config.interval
                    self._running = None
                nursery.cancel_scope.cancel()
        finally:
            self._running = None
            self._watch.close()
            self._lister.close()
            self._serving = False


def _explainer(config: MonitorConfig) -> Explainer:
    in_host = config.host_pid_namespace
    if in_host is None:
        in_host = in_host_pid_namespace()
    if not in_host:
        logger.info(
            "not in the host PID namespace: processes with a host PID are reported running, "
            "none exited (hami_trio_monitor_process_liveness_checked 0)%s",
            "; --exclude-exited-processes has no effect" if config.exclude_exited_processes else "",
        )
    return Explainer(
        pid_alive if in_host else None,
        live_pids,
        exclude_exited=config.exclude_exited_processes,
    )


async def serve_monitor(
    config: MonitorConfig,
    *,
    pod_source: PodSource,
    registry: CollectorRegistry | None,
    task_status: trio.TaskStatus[Monitor] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Build a :class:`Monitor` and serve it (see the module docstring for the contract).

    Args:
        config: the monitor's configuration.
        pod_source: the live pods.
        registry: where the self-metrics go (None: not exported).
        task_status: receives the :class:`Monitor` after its first tick (or at once when
            paused by the MIG lock at start-up).
    """
    monitor = Monitor(config, pod_source=pod_source, registry=registry)
    await monitor.serve(task_status=task_status)
